"""The site's settings for the queue service, as the hub that starts it hands them over.

A site writes its whole configuration as `c.` lines in `jupyterhub_config.py` (the contracts
page, contract 2), the queue service's (`c.QueueService.…`) included. The service is a process
of its own that reads no config file: running the hub's files again would repeat what they do
(the session network, tokens, database checks). So the hub, as it starts the service, hands it
the part of its merged config the service reads (its own section and its engine backend's:
`c.DockerEngine.…`, `c.SwarmEngine.…`, any section whose name ends in `Engine`, and
`c.EngineBackend.…`), as JSON in the environment variable `ENV`
(`service_config_text`; its `services` entry asks for it with `FROM_HUB`:
fgpu_spawner/managed_services.py), and the service loads it before its command line, which still wins
(`service_config`).

Settings both the spawner and the service need have one source, the spawner's section
(`SHARED`; the session limits, `LIMITS`, which the service reads as one dict): the hub hands the
spawner's value on, and a site that sets one of them on both sides to different values is told
so when the service starts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import PurePath

from traitlets.config import Config, LazyConfigValue

from fgpu_shared.json_text import json_object
from image_catalog.launch_options import SESSION_LIMITS

ENV = "FGPU_SITE_CONFIG"
#: The value of `ENV` in a `services` entry that asks the hub for the settings.
FROM_HUB = "from-the-hub"
SERVICE = "QueueService"
#: The sections of the engine backends (queue_service/engine/backend.py): a backend's class name
#: ends in this, and their common base is `EngineBackend`.
ENGINE_SUFFIX = "Engine"
ENGINE_BASE = "EngineBackend"
#: Settings of the service whose one source is a spawner section, with the sections that set
#: them, the more specific last (a Swarm hub's FGPUSwarmSpawner inherits c.FGPUSpawner's).
SHARED = {
    "units_per_gpu": ("FGPUSpawner", "FGPUSwarmSpawner"),
    "deployment_id": ("FGPUSpawner", "FGPUSwarmSpawner"),
    "home_volume": ("FGPUSpawner", "FGPUSwarmSpawner"),
    "idle_timeout": ("FGPUSpawner", "FGPUSwarmSpawner"),
    "home_root": ("FGPUSwarmSpawner",),
    "registry_auth_file": ("FGPUSwarmSpawner",),
}
#: The spawner's settings that make up the service's `session_limits`.
LIMITS = tuple(SESSION_LIMITS)
SPAWNER_SECTIONS = ("FGPUSpawner", "FGPUSwarmSpawner")


class SiteConfigError(ValueError):
    """A setting the hub cannot hand to its queue service, in words for the site's admin."""


def service_config_text(config: Config) -> str:
    """The service's part of the hub's merged `config`, as JSON: its own section, with the
    shared settings and the session limits taken from the spawner's sections."""
    own = _section(config, SERVICE)
    limits = dict(own.get("session_limits") or {})
    for name, sections in SHARED.items():
        _take_spawners(config, name, sections, own, f"c.{SERVICE}.{name}")
    for name in LIMITS:
        where = f"c.{SERVICE}.session_limits[{name!r}]"
        _take_spawners(config, name, SPAWNER_SECTIONS, limits, where)
    if limits:
        own["session_limits"] = limits
    return json.dumps({SERVICE: own, **_engine_sections(config)})


def _engine_sections(config: Config) -> dict:
    """The engine backends' sections of `config`, as JSON holds them."""
    return {
        section: _section(config, section)
        for section in config
        if section.endswith(ENGINE_SUFFIX) or section == ENGINE_BASE
    }


def _section(config: Config, section: str) -> dict:
    """`config`'s `section`, as JSON holds it."""
    return {name: _plain(f"c.{section}.{name}", value) for name, value in config[section].items()}


def service_config(text: str) -> Config:
    """The config `service_config_text` wrote."""
    return Config(json_object(text, ENV, SiteConfigError))


def _take_spawners(config: Config, name: str, sections, target: dict, where: str) -> None:
    """Put the spawner's `name` (the last of `sections` that sets it) in `target`, where the
    service's own value, `where`, may only be the same."""
    found = [s for s in sections if s in config and name in config[s]]
    if not found:
        return
    section = found[-1]
    value = _plain(f"c.{section}.{name}", config[section][name])
    if name in target and target[name] != value:
        raise SiteConfigError(
            f"{where} = {target[name]!r} and c.{section}.{name} = {value!r} differ: set it"
            f" once, as c.{section}.{name} (the spawner and the queue service read it)"
        )
    target[name] = value


def _plain(where: str, value):
    """`value` as JSON holds it; a path becomes its text, a class its import name."""
    if isinstance(value, LazyConfigValue):
        raise SiteConfigError(
            f"{where} is changed in place (.append, .update...): assign it whole "
            f"({where} = ...) so that the hub can hand it to the queue service"
        )
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    if isinstance(value, Mapping):
        return {str(k): _plain(f"{where}[{k!r}]", v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(f"{where}[{i}]", v) for i, v in enumerate(value)]
    raise SiteConfigError(
        f"{where} = {value!r}: the queue service takes text, numbers, true/false, None, lists and"
        " dicts of them, paths and classes"
    )
