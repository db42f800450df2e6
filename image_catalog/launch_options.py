"""The launch options that the spawner and the queue service both judge: a session's name, its
environment variables, and the per-session limits both the spawn form and the Sessions dialog
offer. Pure, no I/O; here because `image_catalog` is the one leaf both sides import, so the hub's
REST path, the form and `POST api/sessions` refuse the same things with the same words.
"""

from __future__ import annotations

import re

from .job_options import JOB_OPTIONS

#: One session's limits and defaults, unless the site sets its own (FGPUSpawner.cpu_max... and
#: QueueService.session_limits, both from jupyterhub_config.py). The spawn form and the Sessions
#: page's dialog draw their sliders from these, so both offer the same range and start at the same
#: values. Sizes in bytes.
SESSION_LIMITS = {
    "cpu_min": 0.5,
    "cpu_max": 4.0,
    "cpu_default": 1.0,
    "mem_min": 256 * 1024**2,
    "mem_max": 8 * 1024**3,
    "mem_default": 2 * 1024**3,
    "fgpu_max": 0.0,
    "fgpu_default": 0.0,
    # The image of a launch that names none, where the user may start it (`with_defaults`);
    # empty: the first image the catalog offers them.
    "default_image_name": "",
}

#: JupyterHub 6's rule for a server name (jupyterhub.slugs.is_valid_safe_slug): a session's name is
#: its server's name, so it must be one the hub accepts and puts in a URL as it is.
NAME_MAX = 30
_NAME_RE = re.compile(r"[a-z](?:[a-z0-9]|-(?=[a-z0-9]))*")
NAME_RULE = (
    f"1 to {NAME_MAX} characters: lowercase letters, digits and single hyphens, starting with a "
    "letter and ending with a letter or digit"
)

ENV_MAX_COUNT = 32
#: All names and values together, in bytes (UTF-8): room for settings, not for data.
ENV_MAX_BYTES = 8192
#: Storage folders one session may mount (its automount folders come on top).
FOLDERS_MAX = 20
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
#: Prefixes the hub, the spawner and the GPU sharing set or read (fgpu_spawner/container_spec.py,
#: gpu_sharing.py; HAMi-core's CUDA_DEVICE_*, CUDA_REDIRECT and GPU_CORE_UTILIZATION_POLICY, HAMi's
#: CUDA_DISABLE_CONTROL, MPS's CUDA_MPS_*, the dynamic loader's LD_*): a session setting one could
#: widen its GPU slice or impersonate its server.
RESERVED_PREFIXES = ("JUPYTER", "JPY_", "FGPU_", "CUDA_", "NVIDIA_", "LD_", "HAMI_", "GPU_")
#: Exact names the hub or the image sets for the session's user, limits and shell.
RESERVED_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "PWD",
        "HOSTNAME",
        "NB_USER",
        "NB_UID",
        "NB_GID",
        "CPU_LIMIT",
        "MEM_LIMIT",
        "CPU_GUARANTEE",
        "MEM_GUARANTEE",
        "VIRTUAL_ENV",
        # HAMi-core's per-process switches outside its CUDA_*/GPU_* names: the OOM killer that
        # enforces the memory limit, the log level and the kernel-time sampling
        # (multiprocess_memory_limit.c, log_utils.c).
        "ACTIVE_OOM_KILLER",
        "LIBCUDA_LOG_LEVEL",
        "RECORD_KERNEL_INTERVAL",
    }
)


#: What a launch may say, on the form and in `POST api/sessions` alike (the spawner adds its
#: `request_key`).
LAUNCH_OPTIONS = (
    "image",
    "cpu",
    "mem",
    "fgpu",
    "resource_group",
    "name",
    "env",
    "folders",
    "preset",
    *JOB_OPTIONS,
)


class OptionError(ValueError):
    """A launch option that is refused; the message says why and what is allowed."""


def check_name(value: object) -> str | None:
    """A session name (None or blank: the hub picks one), or OptionError."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        raise OptionError(f"name must be a string of {NAME_RULE}.")
    name = value.strip()
    if len(name) > NAME_MAX or not _NAME_RE.fullmatch(name):
        shown = name if len(name) <= 40 else name[:40] + "..."
        raise OptionError(f"name {shown!r} is not allowed: use {NAME_RULE}.")
    return name


def reserved(name: str) -> bool:
    upper = name.upper()
    return upper in RESERVED_NAMES or upper.startswith(RESERVED_PREFIXES)


def check_env(value: object) -> dict[str, str]:
    """Environment variables for a session ({} for none), or OptionError naming the first bad one."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise OptionError('env must be an object of names and string values, e.g. {"SEED": "1"}.')
    if len(value) > ENV_MAX_COUNT:
        raise OptionError(f"env has {len(value)} variables; at most {ENV_MAX_COUNT} are allowed.")
    size = 0
    for name, text in value.items():
        if not isinstance(name, str) or not _ENV_NAME_RE.fullmatch(name):
            raise OptionError(
                f"env: {str(name)[:40]!r} is not a variable name (letters, digits and _, not "
                "starting with a digit, at most 128)."
            )
        if reserved(name):
            raise OptionError(
                f"env: {name} is set by the hub (names starting with "
                f"{', '.join(RESERVED_PREFIXES)}, and {', '.join(sorted(RESERVED_NAMES))} are "
                "reserved)."
            )
        if not isinstance(text, str) or "\0" in text:
            raise OptionError(f"env: the value of {name} must be a string without NUL characters.")
        size += len(name.encode()) + len(text.encode())
    if size > ENV_MAX_BYTES:
        raise OptionError(f"env is {size} bytes; at most {ENV_MAX_BYTES} are allowed.")
    return dict(value)


#: The options that size a launch: giving none of them takes the default slots.
SLOT_OPTIONS = ("preset", "cpu", "mem", "fgpu")


def with_defaults(options: dict, offered: list, presets: list[dict], limits: dict) -> dict:
    """`options` with what a launch leaves out filled in: one rule for the spawn form, the hub's
    REST API, the admin panel's Start button (which sends no options at all) and `POST
    api/sessions`. `limits` are one session's limits and defaults (SESSION_LIMITS' keys).

    - No `image`: the one the site marks (`limits["default_image_name"]`) if the user may start
      it, else the first of `offered` (the catalog images offered to the user, in the catalog's
      order, as CatalogImage). With none offered, nothing is filled in, and the image's own
      check refuses the launch.
    - No slots (none of SLOT_OPTIONS): the smallest of `presets` (as `GET api/presets` lists
      them) that the user may use now, holds no GPU and meets the image's bounds, by cores then
      memory; without one, the image's own defaults, then the hub's. Never a GPU unasked."""
    filled = dict(options)
    if _blank(filled.get("image")) and offered:
        marked = limits.get("default_image_name") or ""
        filled["image"] = next((i for i in offered if i.name == marked), offered[0]).name
    if gives_no_slots(filled):
        image = next((i for i in offered if i.name == filled.get("image")), None)
        filled.update(default_slots(presets, image, limits))
    return filled


def gives_no_slots(options: dict) -> bool:
    """Whether a launch leaves every one of SLOT_OPTIONS out (the presets then decide)."""
    return all(_blank(options.get(key)) for key in SLOT_OPTIONS)


def leaves_out_defaults(options: dict) -> bool:
    """Whether `with_defaults` has anything to fill in: no image, or no slots."""
    return _blank(options.get("image")) or gives_no_slots(options)


def default_slots(presets: list[dict], image, limits: dict) -> dict:
    """`with_defaults`' slots: the smallest usable preset without a GPU that fits `image` (a
    CatalogImage, or None), or else the image's default cores and memory, then the hub's."""
    fitting = [
        preset
        for preset in presets
        if preset.get("available")
        and not preset.get("fgpu")
        and (image is None or not image.resources.shortfall(preset["cpu"], preset["mem"], 0))
    ]
    if fitting:
        smallest = min(fitting, key=lambda preset: (preset["cpu"], preset["mem"]))
        return {"cpu": smallest["cpu"], "mem": smallest["mem"], "fgpu": 0}
    own = image.resources.default if image is not None else None
    cpu = own.cpu if own is not None and own.cpu is not None else limits["cpu_default"]
    mem = own.mem if own is not None and own.mem is not None else limits["mem_default"]
    return {"cpu": cpu, "mem": int(mem), "fgpu": 0}


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def resolve_preset(options: dict, presets: list[dict]) -> dict:
    """`options` with its `preset` replaced by that preset's slots; `presets` as `GET
    api/presets` lists them for the user (queue_service/core/presets.py).

    The rule: a preset sets cpu, mem and fgpu together, so a launch naming a preset may not also
    give any of them: no launch is half preset, half custom. Raises OptionError."""
    name = options.get("preset")
    rest = {k: v for k, v in options.items() if k != "preset"}
    if name is None or name == "":
        return rest
    given = sorted(k for k in ("cpu", "mem", "fgpu") if options.get(k) not in (None, ""))
    if given:
        raise OptionError(
            f"preset {name!r} sets cpu, mem and fgpu; leave out {', '.join(given)}, or leave out "
            "the preset."
        )
    row = next((r for r in presets if r["name"] == name), None)
    if row is None:
        names = ", ".join(r["name"] for r in presets) or "none"
        raise OptionError(f"Unknown preset {str(name)[:60]!r}. Presets offered to you: {names}.")
    if not row["available"]:
        raise OptionError(f"Preset {name!r} is not available to you: {row['reason']}")
    return {**rest, "cpu": row["cpu"], "mem": row["mem"], "fgpu": row["fgpu"]}


def check_folders(value: object) -> tuple[str, ...]:
    """The storage folders to mount, by id or name (() for none; a form's comma-separated text is
    taken too), or OptionError. Whether each is the user's to mount is the queue service's
    to say (folders.py)."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise OptionError('folders must be a list of folder names or ids, e.g. ["data"].')
    if len(value) > FOLDERS_MAX:
        raise OptionError(f"folders names {len(value)} folders; at most {FOLDERS_MAX} are mounted.")
    if any(len(v) > 64 or "\0" in v or "/" in v for v in value):
        raise OptionError("folders: a folder's name or id has at most 64 characters and no '/'.")
    return tuple(dict.fromkeys(value))
