"""Every `Example::` in the queue service's settings reference does what it shows, on a real hub.

Each QueueService setting's help ends with an example `c.` line (or, for a setting the spawner
shares with the service, the spawner's line: fgpu_shared/site_config.py). The examples are run as
Python, written as a site writes them into a jupyterhub_config.py that loads the shipped one, and
a hub starts with them all; the running service's `GET api/settings` must then show each value as
the setting takes it, and not the value a hub without the examples has (the shared test hub's).

Where an example names what this machine lacks (a PostgreSQL server at db.example.org, files under
/etc/fgpu-hub), its line is kept and the value replaced with one this machine has (`HERE`). Three
settings cannot take their example on a single-host hub beside other tests; each names the test
that runs its `c.` line (`ELSEWHERE`).

`api/settings` itself: an admin reads it; a student, a narrow admin token and a cross-site script
with an admin's cookie are refused, and nothing is changed through it.
"""

from __future__ import annotations

import json
import re
import shutil
import textwrap

import pytest
import requests
from traitlets.config import Config

from fgpu_shared.site_config import service_config, service_config_text
from image_catalog.launch_options import SESSION_LIMITS
from queue_service.app import QueueService
from queue_service.engine.backend import EngineBackend
from queue_service.engine.docker_engine import DockerEngine
from queue_service.engine.swarm_engine import SwarmEngine

from .harness import QueueUser, refused_start, running_hub
from .test_security_handlers import EVIL, Browser, narrow_admin_token

pytestmark = [pytest.mark.docker, pytest.mark.hub]
SCRIPTED = {**EVIL, "Sec-Fetch-Mode": "cors"}

#: Settings whose examples name what this machine lacks, and the section their line sets.
HERE = {
    "db_url": "QueueService",
    "catalog_path": "QueueService",
    "cookie_secret_file": "QueueService",
    "folders_root": "QueueService",
    "node_agent_token_file": "SwarmEngine",
    "node_credentials_file": "QueueService",
    "upgrade_backup_dir": "QueueService",
    "home_root": "FGPUSwarmSpawner",
    "registry_auth_file": "FGPUSwarmSpawner",
}


def values_here(workdir, catalog) -> dict:
    """The same settings with values this machine has: files in `workdir`, a copy of the test
    catalog."""
    auth = workdir / "examples-registry-auth.json"
    auth.write_text(json.dumps({"username": "cs101", "password": "pw", "serveraddress": "r:5000"}))
    auth.chmod(0o600)
    return {
        "db_url": f"sqlite:///{workdir}/examples-queue.sqlite",
        "catalog_path": str(shutil.copy(catalog, workdir / "examples-catalog.yaml")),
        "cookie_secret_file": f"{workdir}/examples-cookie-secret",
        "folders_root": f"{workdir}/examples-folders",
        "node_agent_token_file": f"{workdir}/examples-agent-token",
        "node_credentials_file": f"{workdir}/examples-node-credentials.json",
        "upgrade_backup_dir": f"{workdir}/examples-backups",
        "home_root": f"{workdir}/examples-homes",
        "registry_auth_file": str(auth),
    }


#: Settings whose example cannot run on this hub, and the test that runs their `c.` line.
ELSEWHERE = {
    "engine_class": "each examples hub sets its engine: `examples` below",
    "node_agent_url": "deploys agents on a Swarm's nodes: tests/test_node_agent_lab.py",
    "service_prefix": "a hub whose services entry is named after it; the shared hubs' is queue",
}
#: The engine backends an examples hub runs, each with its section's examples and the common
#: ones (EngineBackend's). The Swarm engine's hub runs on this machine's engine, which is no
#: Swarm: the service starts and answers without its nodes, holding every setting.
ENGINES = {"docker": DockerEngine, "swarm": SwarmEngine}
#: The example's service address: the hub's services entry is told the same port.
SERVICE_PORT = 10102


def example_of(name: str, cls: type = QueueService) -> str:
    help_text = cls.class_own_traits(config=True)[name].help
    assert "Example::" in help_text, f"{cls.__name__}.{name} has no example"
    return textwrap.dedent(help_text.split("Example::", 1)[1]).strip()


def examples_config(engine: str) -> Config:
    """Every example of QueueService and of the `engine` backend's settings (its own and the
    common ones), run as a config file runs it."""
    c = Config()
    for cls in (QueueService, EngineBackend, ENGINES[engine]):
        for name in sorted(cls.class_own_traits(config=True)):
            if name not in ELSEWHERE:
                exec(example_of(name, cls), {"c": c, "SESSION_LIMITS": SESSION_LIMITS})  # noqa: S102
    c.QueueService.engine_class = engine
    return c


def with_values_here(c: Config, workdir, catalog) -> Config:
    values = values_here(workdir, catalog)
    assert set(values) == set(HERE)
    for name, section in HERE.items():
        if section.endswith("Engine") and section not in c:
            continue  # another engine's
        assert name in c[section], f"{name}'s example sets c.{section}.{name} no more"
        c[section][name] = values[name]
    return c


def as_config_file(c: Config) -> str:
    return "".join(
        f"c.{section}.{name} = {value!r}\n"
        for section, values in c.items()
        for name, value in values.items()
    )


def settings_answer(hub) -> dict:
    response = QueueUser(hub, "admin").call("GET", "settings")
    assert response.status_code == 200, response.text
    assert response.headers["Cache-Control"] == "no-store"
    return response.json()


def settings_of(hub) -> dict:
    return settings_answer(hub)["settings"]


def engine_settings_of(hub) -> dict:
    return settings_answer(hub)["engine"]


@pytest.fixture(scope="module", params=list(ENGINES))
def examples(request, tmp_path_factory, test_catalog):
    engine = request.param
    workdir = tmp_path_factory.mktemp(f"examples-hub-{engine}")
    c = with_values_here(examples_config(engine), workdir, test_catalog)
    env = {"FGPU_QUEUE_PORT": str(SERVICE_PORT), "FGPU_CATALOG_PATH": str(test_catalog)}
    with running_hub(workdir, as_config_file(c), env=env) as hub:
        yield c, hub, ENGINES[engine]


def test_every_setting_has_an_example_and_each_runs_or_names_where_it_does():
    names = set(QueueService.class_own_traits(config=True))
    assert set(ELSEWHERE) - {"node_agent_url"} < names
    every = names.union(*(cls.class_traits(config=True) for cls in ENGINES.values()))
    assert set(ELSEWHERE) < every and set(HERE) < every
    for cls in (QueueService, EngineBackend, *ENGINES.values()):
        for name in cls.class_own_traits(config=True):
            assert re.search(r"^c\.\w+\.\w+", example_of(name, cls), re.M), name


def expected_settings(c: Config, engine: type) -> tuple[dict, dict]:
    """What the service makes of the lines handed to it (its own checks and conversions: "4G"
    is bytes): its settings, and its engine backend's."""
    service = QueueService(config=service_config(service_config_text(c)))
    service.init_engine()
    assert type(service.engine_backend) is engine
    return service.settings_in_effect(), service.engine_settings_in_effect()["settings"]


def as_set(running: dict, expected: dict, shipped: dict, skip=()) -> tuple[dict, list]:
    """The settings not as the example set them (running, expected), and those a hub without
    the examples holds already."""
    tested = sorted(set(running) - set(skip))
    differ = {n: (running[n], expected[n]) for n in tested if running[n] != expected[n]}
    return differ, [n for n in tested if running[n] == shipped.get(n)]


def test_each_example_reaches_the_running_service_and_changes_what_it_holds(examples, hub):
    c, examples_hub, engine = examples
    expected, expected_engine = expected_settings(c, engine)
    running, shipped = settings_of(examples_hub), settings_of(hub)
    assert len(set(running) - set(ELSEWHERE)) >= 45, running
    assert as_set(running, expected, shipped, ELSEWHERE) == ({}, [])
    assert running["engine_class"].endswith(engine.__name__ + "'>")
    # The engine's own section, and the common one, reach its backend.
    on_engine = engine_settings_of(examples_hub)
    assert on_engine["class"] == engine.__name__
    assert len(on_engine["settings"]) >= 4, on_engine
    _, defaults = expected_settings(Config({"QueueService": {"engine_class": engine}}), engine)
    held = as_set(on_engine["settings"], expected_engine, defaults, ELSEWHERE)
    assert held == ({}, [])
    # The shared ones come from the spawner's lines, and the spawner runs with the same.
    assert running["units_per_gpu"] == 4 and running["session_limits"]["fgpu_max"] == 2
    assert running["deployment_id"] == "cs101-hub"


def test_an_admin_reads_the_settings_and_no_password(hub):
    settings = settings_of(hub)
    assert settings["pending_timeout"] == 3600
    assert settings["db_url"].startswith("sqlite")
    assert set(settings) == set(QueueService.class_own_traits(config=True))
    engine = engine_settings_of(hub)
    assert engine["class"] == "DockerEngine"
    assert set(engine["settings"]) == set(DockerEngine.class_traits(config=True))


def test_a_student_a_narrow_token_and_a_cross_site_script_are_refused(hub, username):
    refused = QueueUser(hub, username).call("GET", "settings")
    assert refused.status_code == 403 and "admin:servers" in refused.text
    assert "pending_timeout" not in refused.text
    narrow = narrow_admin_token(hub, ["access:services!service=queue"])
    response = narrow.get(f"{hub.url}/services/queue/api/settings", timeout=60)
    assert response.status_code == 403 and "pending_timeout" not in response.text
    anonymous = requests.get(f"{hub.url}/services/queue/api/settings", timeout=60)
    assert anonymous.status_code in (401, 403) and "pending_timeout" not in anonymous.text
    admin = Browser(hub, "admin")
    scripted = admin.call("GET", "settings", headers=SCRIPTED)
    assert scripted.status_code == 403 and "pending_timeout" not in scripted.text
    assert "pending_timeout" in admin.own_page_call("GET", "settings").json()["settings"]


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_nothing_changes_through_it(hub, method):
    admin = QueueUser(hub, "admin")
    response = admin.call(method, "settings", json={"pending_timeout": 1})
    assert response.status_code == 405, response.text
    assert settings_of(hub)["pending_timeout"] == 3600
    assert json.dumps(settings_of(hub))


def test_one_setting_set_differently_for_the_spawner_and_the_service_stops_the_hub(tmp_path):
    both = "c.QueueService.units_per_gpu = 2\nc.FGPUSpawner.units_per_gpu = 4\n"
    message = refused_start(tmp_path / "both", both)
    assert "Refusing to start: c.QueueService.units_per_gpu = 2 and" in message
    assert "set it once, as c.FGPUSpawner.units_per_gpu" in message
    assert "Traceback" not in message
    assert not (tmp_path / "both" / "fgpu_queue.sqlite").exists()  # the service never ran


def test_a_bad_value_stops_the_service_and_the_hub_with_the_setting_named(tmp_path):
    bad = 'c.QueueService.pending_timeout = "an hour"\n'
    message = refused_start(tmp_path / "bad", bad)
    assert "The site's settings for the queue service" in message
    assert "pending_timeout" in message and "'an hour'" in message
