"""The spawn form: rendering it from `templates/spawn_form.html`, and reading it back.

Reading it back only flattens the form's lists; `request.parse_request` does all validation, so the
form and the REST API are judged by the same code.
"""

from __future__ import annotations

import contextlib

import jinja2

from image_catalog import Catalog
from image_catalog.units import format_size, parse_size
from templates import TEMPLATES_DIR

from .request import KNOWN_OPTIONS, RequestLimits
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
) -> str:
    """The form, showing the student's previous choices where they are still valid.

    `resource_groups` are the groups this user may use: with two or more the form offers a
    choice (the previous one, else the first, preselected); with one it names the group and sends
    nothing, so a site of one host and one group spawns as it always did.
    """
    images = catalog.visible()
    initial = initial_values(previous or {}, limits, [image.name for image in images])
    groups = resource_groups or []
    return _env.get_template("spawn_form.html").render(
        images=images,
        selected_image=initial["image"],
        resource_groups=groups,
        selected_group=selected_group(previous or {}, groups),
        cpu=limits.cpu,
        cpu_value=initial["cpu"],
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
        fgpu_step=0.1,
        units_per_gpu=units_per_gpu,
        simulated=simulated,
    )


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


def options_from_form(formdata: dict[str, list[str]]) -> dict[str, str]:
    """Flatten the form's fields; unknown fields are kept so that validation can name them."""
    options = {key: values[0] for key, values in formdata.items() if values and key != "_xsrf"}
    return {key: value for key, value in options.items() if key in KNOWN_OPTIONS or value != ""}
