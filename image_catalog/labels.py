"""Catalog data an image declares about itself, in Docker labels.

An image may carry what a catalog entry holds, so that adding it needs only its reference:

    fgpu.display-name, fgpu.framework, fgpu.version, fgpu.description, fgpu.gpu (true/false)
    fgpu.resource.<min|default|max>.<cpu|mem|fgpu>

`fgpu.framework` and `fgpu.version` are the labels `python -m image_catalog build` already writes.
Backend.AI's `ai.backend.resource.min.cpu`, `.mem` and `.cuda.shares` (its fGPU) are read too,
where the fgpu label of the same meaning is absent. Pure: labels in, entry fields out.
"""

from __future__ import annotations

from .resources import LEVELS, SLOTS, ResourceError, parse_resources

PREFIX = "fgpu."
_TEXT_FIELDS = {
    "display-name": "display_name",
    "framework": "framework",
    "version": "version",
    "description": "description",
}
_BACKEND_AI_MIN = {
    "cpu": "ai.backend.resource.min.cpu",
    "mem": "ai.backend.resource.min.mem",
    "fgpu": "ai.backend.resource.min.cuda.shares",
}
_TRUE, _FALSE = {"true", "yes", "1", "on"}, {"false", "no", "0", "off", ""}


class LabelError(ValueError):
    """A label is present but its value cannot be used."""


def entry_fields_from_labels(labels: dict[str, str] | None) -> dict:
    """Catalog entry fields (display_name, framework, ..., resources) found in an image's labels.

    Only fields that are present come back, so they can fill in what a request leaves out.
    """
    labels = labels or {}
    fields: dict = {}
    for label, key in _TEXT_FIELDS.items():
        value = labels.get(PREFIX + label, "").strip()
        if value:
            fields[key] = value
    if PREFIX + "gpu" in labels:
        fields["gpu"] = _boolean(PREFIX + "gpu", labels[PREFIX + "gpu"])
    resources = _resources(labels)
    if resources:
        try:
            parse_resources(resources)
        except ResourceError as e:
            raise LabelError(f"the image's labels: {e}") from None
        fields["resources"] = resources
    return fields


def _resources(labels: dict[str, str]) -> dict:
    resources: dict = {}
    for level in LEVELS:
        for slot in SLOTS:
            value = labels.get(f"{PREFIX}resource.{level}.{slot}")
            if value is None and level == "min":
                value = labels.get(_BACKEND_AI_MIN[slot])
            if value is not None and value.strip():
                resources.setdefault(level, {})[slot] = value.strip()
    return resources


def _boolean(label: str, value: str) -> bool:
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise LabelError(f"label {label}={value!r} must be true or false")
