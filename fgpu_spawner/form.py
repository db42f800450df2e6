"""The spawn form: rendering it from `templates/spawn_form.html`, and reading it back.

The form follows the Sessions page's launch dialog: one session's limits (SESSION_LIMITS via the
spawner's config) clamped to what the cluster could ever grant, the resource presets, and a
warning when the request is more than is free now. What the queue service said (api/resources,
api/presets) comes in as plain data: rendering is pure, the spawner does the I/O.

Reading it back only flattens the form's lists; `request.parse_request` does all validation, so the
form and the REST API are judged by the same code.
"""

from __future__ import annotations

import contextlib
import json
import math

import jinja2

from fgpu_shared.units import format_size, parse_size
from image_catalog import Catalog
from templates import TEMPLATES_DIR

from .request import KNOWN_OPTIONS, Range, RequestLimits
from .resource_groups import GroupOffer

_GIB = 1024**3
_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), autoescape=True, keep_trailing_newline=True
)


def render_spawn_form(
    limits: RequestLimits,
    catalog: Catalog,
    units_per_gpu: int = 1,
    simulated: bool = False,
    cpu_step: float = 0.5,
    previous: dict | None = None,
    resource_groups: list[GroupOffer] | None = None,
    resources: dict | None = None,
    presets: list[dict] | None = None,
    folders: list[dict] | None = None,
    note: str = "",
) -> str:
    """The form, showing the student's previous choices where they are still valid.

    `resource_groups` are the groups this user may use: with two or more the form offers a
    choice (the previous one, else the first, preselected); with one it names the group and sends
    nothing, so a site of one host and one group spawns as it always did. `resources` and
    `presets` are the service's api/resources and api/presets answers for this user (None and []
    when it did not answer; `note` then says so). `folders` is its api/folders answer for this
    user (None when it did not answer: the picker then says the folders cannot be listed now).
    """
    previous = previous or {}
    images = catalog.visible()
    limits = clamped(limits, ceiling(resources), cpu_step)
    initial = initial_values(previous, limits, [image.name for image in images])
    groups = resource_groups or []
    return _env.get_template("spawn_form.html").render(
        images=images,
        selected_image=initial["image"],
        resource_groups=groups,
        selected_group=selected_group(previous, groups),
        cpu=limits.cpu,
        cpu_value=initial["cpu"],
        cpu_text=slot_text("cpu", initial["cpu"]),
        cpu_step=cpu_step,
        mem_gib={
            "min": round(limits.mem.min / _GIB, 2),
            "max": round(limits.mem.max / _GIB, 2),
            "value": round(initial["mem_bytes"] / _GIB, 2),
            "step": 0.25,
        },
        mem_text=initial["mem"],
        mem_min=format_size(int(limits.mem.min)),
        mem_max=format_size(int(limits.mem.max)),
        fgpu=limits.fgpu,
        fgpu_text=slot_text("fgpu", limits.fgpu.default),
        fgpu_step=0.1,
        units_per_gpu=units_per_gpu,
        simulated=simulated,
        presets=[preset_choice(p) for p in presets or []],
        selected_preset=selected_preset(previous, presets or []),
        env_text=env_text(previous.get("env")),
        folder_picker=folder_picker(folders, previous.get("folders")),
        free_json=json.dumps(free_figures(resources)) if resources else "",
        note=note,
    )


_SLOTS = ("cpu", "mem", "fgpu")


def ceiling(resources: dict | None) -> dict | None:
    """The most one session could ever be granted, per slot: the largest capacity among the
    resource groups the user may use (a session lives in one), else the cluster's; None when the
    service did not answer."""
    if not resources:
        return None
    groups = [g for g in (resources.get("resource_groups") or {}).values() if g.get("allowed")]
    capacities = [g.get("capacity") or {} for g in groups] or [resources.get("capacity") or {}]
    return {k: max(float(c.get(k) or 0) for c in capacities) for k in _SLOTS}


def clamped(limits: RequestLimits, most: dict | None, cpu_step: float) -> RequestLimits:
    """One session's limits within what the cluster could ever grant: a slider never offers a
    value that would wait forever. Never below a limit's minimum (the cluster too small for the
    site's minimum is the admin's to fix, and the queue says so); defaults follow the maxima."""
    if most is None:
        return limits
    cpu_max = max(
        limits.cpu.min, math.floor(min(most["cpu"], limits.cpu.max) / cpu_step) * cpu_step
    )
    mem_max = max(limits.mem.min, min(most["mem"], limits.mem.max))
    fgpu_max = round(max(0.0, min(most["fgpu"], limits.fgpu.max)), 2)
    return RequestLimits(
        cpu=Range(limits.cpu.min, cpu_max, min(limits.cpu.default, cpu_max)),
        mem=Range(limits.mem.min, mem_max, min(limits.mem.default, mem_max)),
        fgpu=Range(0.0, fgpu_max, min(limits.fgpu.default, fgpu_max)),
        default_image=limits.default_image,
    )


def free_figures(resources: dict) -> dict:
    """What is free for the user now, for the "will wait" warning: per resource group offered
    (by name) and in all (""), each slot as its number and as it is shown."""
    scopes = {"": resources.get("allocatable") or {}}
    for name, group in (resources.get("resource_groups") or {}).items():
        if group.get("allowed"):
            scopes[name] = group.get("allocatable") or {}
    return {name: _figures(free) for name, free in scopes.items()}


def _figures(free: dict) -> dict:
    amounts = {k: max(float(free.get(k) or 0), 0.0) for k in _SLOTS}
    return {"amount": amounts, "text": {k: slot_text(k, v) for k, v in amounts.items()}}


def slot_text(key: str, value: float) -> str:
    """One slot as the pages show it: "1 core", "2.5 cores", "1.5G", "0.5 fGPU"."""
    if key == "mem":
        return format_size(int(value))
    number = f"{round(value, 2):g}"
    if key == "fgpu":
        return f"{number} fGPU"
    return f"{number} core" if number == "1" else f"{number} cores"


def preset_choice(preset: dict) -> dict:
    """A preset as the form lists it: its slots in words, and why it is off limits, if it is."""
    slots = [slot_text("cpu", preset["cpu"]), slot_text("mem", preset["mem"])]
    if preset.get("fgpu"):
        slots.append(slot_text("fgpu", preset["fgpu"]))
    return {**preset, "slots": ", ".join(slots)}


def selected_preset(previous: dict, presets: list[dict]) -> str:
    """The previous preset while the user may still have it, else "" (the sliders)."""
    name = previous.get("preset")
    return name if any(p["name"] == name and p["available"] for p in presets) else ""


def folder_picker(folders: list[dict] | None, previous: object = None) -> dict | None:
    """The folder picker's content: the folders offered (own first, then shared, each by name,
    with its owner when shared and "read-only" where so; the previous choice checked again) and
    the user's own automount folders, which every session mounts and are not offered. None when
    the service did not answer."""
    if folders is None:
        return None
    chosen = set(previous) if isinstance(previous, list | tuple) else set()
    always = sorted(f["name"] for f in folders if f.get("own") and f.get("automount"))
    offered = sorted(
        (f for f in folders if not (f.get("own") and f.get("automount"))),
        key=lambda f: (not f.get("own"), "" if f.get("own") else f.get("owner", ""), f["name"]),
    )
    return {
        "offered": [
            {
                "id": f["id"],
                "name": f["name"],
                "detail": folder_detail(f),
                "checked": f["id"] in chosen or f["name"] in chosen,
            }
            for f in offered
        ],
        "always": always,
    }


def folder_detail(folder: dict) -> str:
    """What the picker says beside a folder's name: whose it is when shared, and "read-only"
    where the session cannot write it."""
    parts = [] if folder.get("own") else [f"shared by {folder.get('owner', '?')}"]
    if folder.get("permission") != "rw":
        parts.append("read-only")
    return ", ".join(parts)


def env_text(env: object) -> str:
    """A previous `env` back as the textarea's NAME=value lines."""
    if not isinstance(env, dict):
        return ""
    return "\n".join(f"{name}={value}" for name, value in env.items())


def unavailable_note(missing: list[str]) -> str:
    """The plain note of a form rendered without some of the queue service's answers."""
    if not missing:
        return ""
    return (
        f"The queue service did not answer, so {_joined(missing)} could not be shown here; "
        "starting a server may fail until it is back. Reload this page to try again."
    )


def _joined(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def initial_values(previous: dict, limits: RequestLimits, image_names: list[str]) -> dict:
    """Defaults, overridden by each previous value that is still allowed.

    After a refused spawn the student sees what they typed, not the defaults again.
    """
    image = previous.get("image")
    values = {
        "image": image if image in image_names else _default_image(limits, image_names),
        "cpu": limits.cpu.default,
        "mem": format_size(int(limits.mem.default)),
        "mem_bytes": int(limits.mem.default),
    }
    with contextlib.suppress(KeyError, TypeError, ValueError, OverflowError):
        cpu = float(previous["cpu"])
        if limits.cpu.min <= cpu <= limits.cpu.max:
            values["cpu"] = cpu
    with contextlib.suppress(KeyError, TypeError, ValueError, OverflowError):
        values["mem_bytes"] = min(max(parse_size(previous["mem"]), limits.mem.min), limits.mem.max)
    if isinstance(previous.get("mem"), str | int):
        values["mem"] = str(previous["mem"])
    return values


def selected_group(previous: dict, groups: list[GroupOffer]) -> str | None:
    """The previous choice while the user may still use it, else the first group offered."""
    names = [group.name for group in groups]
    choice = previous.get("resource_group")
    if choice in names:
        return choice
    return names[0] if names else None


def _default_image(limits: RequestLimits, image_names: list[str]) -> str | None:
    if limits.default_image in image_names:
        return limits.default_image
    return image_names[0] if image_names else None


def options_from_form(formdata: dict[str, list[str]]) -> dict:
    """Flatten the form's fields; unknown fields are kept so that validation can name them.

    Each checked box of the folder picker is a `folders` field: they become one list of ids.
    A preset and the sliders are one choice: with a preset picked, the sliders' values (sent by a
    browser without JavaScript) are dropped, since a launch with both is refused."""
    folders = [value for value in formdata.get("folders", []) if value]
    options = {
        key: values[0]
        for key, values in formdata.items()
        if values and key not in ("_xsrf", "folders")
    }
    options = {key: value for key, value in options.items() if key in KNOWN_OPTIONS or value != ""}
    if options.get("preset"):
        options = {key: value for key, value in options.items() if key not in _SLOTS}
    else:
        options.pop("preset", None)
    env = env_from_text(options.pop("env", ""))
    if env:
        options["env"] = env
    # The picker's checked boxes, one `folders` field each: always a list (none checked: none).
    return {**options, "folders": folders} if folders else options


def env_from_text(text: str) -> dict[str, str]:
    """ "SEED=42" lines → {"SEED": "42"}; a line without "=" is a name with an empty value. The
    names and sizes are judged by launch_options.check_env, which says what is wrong."""
    env = {}
    for line in text.splitlines():
        if line.strip():
            name, _, value = line.partition("=")
            env[name.strip()] = value
    return env
