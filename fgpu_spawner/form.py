"""The spawn form: rendering it from `templates/spawn_form.html`, and reading it back.

Reading it back only flattens the form's lists; `request.parse_request` does all validation, so the
form and the REST API are judged by the same code.
"""

from __future__ import annotations

import jinja2

from image_catalog import Catalog
from templates import TEMPLATES_DIR

from .request import KNOWN_OPTIONS, RequestLimits
from .units import format_size

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
) -> str:
    images = catalog.visible()
    selected = limits.default_image or images[0].name
    return _env.get_template("spawn_form.html").render(
        images=images,
        selected_image=selected,
        cpu=limits.cpu,
        cpu_step=cpu_step,
        mem_gib={
            "min": round(limits.mem.min / _GIB, 2),
            "max": round(limits.mem.max / _GIB, 2),
            "default": round(limits.mem.default / _GIB, 2),
            "step": 0.25,
        },
        mem_default=format_size(int(limits.mem.default)),
        mem_min=format_size(int(limits.mem.min)),
        mem_max=format_size(int(limits.mem.max)),
        fgpu=limits.fgpu,
        fgpu_step=0.1,
        units_per_gpu=units_per_gpu,
        simulated=simulated,
    )


def options_from_form(formdata: dict[str, list[str]]) -> dict[str, str]:
    """Flatten the form's fields; unknown fields are kept so that validation can name them."""
    options = {key: values[0] for key, values in formdata.items() if values and key != "_xsrf"}
    return {key: value for key, value in options.items() if key in KNOWN_OPTIONS or value != ""}
