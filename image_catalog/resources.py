"""An image's resource bounds: the least it needs, what it gets by default, and the most it may have.

Backend.AI images declare `ai.backend.resource.min.*`; here every catalog entry may carry
`resources: {min: {...}, default: {...}, max: {...}}`, each with optional `cpu` (cores), `mem`
(bytes or "2G") and `fgpu` (units). Parsing checks that min <= default <= max for every slot, so an
entry that no request could ever satisfy is refused when it is added, not when a student spawns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fgpu_shared.units import format_size, parse_positive_size

SLOTS = ("cpu", "mem", "fgpu")
LEVELS = ("min", "default", "max")


class ResourceError(ValueError):
    """The resource bounds are malformed or contradict each other."""


@dataclass(frozen=True)
class Bounds:
    """One level (min, default or max): None means "not set"."""

    cpu: float | None = None
    mem: int | None = None
    fgpu: float | None = None

    def to_dict(self) -> dict:
        return {slot: getattr(self, slot) for slot in SLOTS if getattr(self, slot) is not None}


@dataclass(frozen=True)
class ImageResources:
    min: Bounds = field(default_factory=Bounds)
    default: Bounds = field(default_factory=Bounds)
    max: Bounds = field(default_factory=Bounds)

    def to_dict(self) -> dict:
        return {level: getattr(self, level).to_dict() for level in LEVELS}

    def shortfall(self, cpu: float, mem: int, fgpu: float) -> str | None:
        """Why a request of this size does not fit the image's bounds, or None when it does."""
        asked = {"cpu": cpu, "mem": mem, "fgpu": fgpu}
        for slot in SLOTS:
            low, high = getattr(self.min, slot), getattr(self.max, slot)
            if low is not None and asked[slot] < low:
                return (
                    f"needs at least {describe(slot, low)}; {describe(slot, asked[slot])} was asked"
                )
            if high is not None and asked[slot] > high:
                return f"allows at most {describe(slot, high)}; {describe(slot, asked[slot])} was asked"
        return None


def describe(slot: str, value: float) -> str:
    if slot == "mem":
        return f"{format_size(int(value))} of memory"
    return f"{value:g} CPU cores" if slot == "cpu" else f"{value:g} fGPU"


def parse_resources(data: object) -> ImageResources:
    """`{min: {cpu: 1, mem: "1G"}, default: {...}, max: {...}}` → ImageResources."""
    if data is None:
        return ImageResources()
    if not isinstance(data, dict):
        raise ResourceError("resources must be a mapping of min, default and max")
    unknown = set(data) - set(LEVELS)
    if unknown:
        raise ResourceError(f"resources: unknown level(s) {', '.join(sorted(unknown))}")
    levels = {level: _parse_bounds(level, data.get(level)) for level in LEVELS}
    resources = ImageResources(**levels)
    _check_order(resources)
    return resources


def _parse_bounds(level: str, data: object) -> Bounds:
    if data is None:
        return Bounds()
    if not isinstance(data, dict):
        raise ResourceError(f"resources.{level} must be a mapping of cpu, mem and fgpu")
    unknown = set(data) - set(SLOTS)
    if unknown:
        raise ResourceError(f"resources.{level}: unknown slot(s) {', '.join(sorted(unknown))}")
    return Bounds(
        cpu=_number(f"resources.{level}.cpu", data.get("cpu")),
        mem=_size(f"resources.{level}.mem", data.get("mem")),
        fgpu=_number(f"resources.{level}.fgpu", data.get("fgpu"), zero_ok=True),
    )


def _number(where: str, value: object, zero_ok: bool = False) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ResourceError(f"{where} must be a number, not {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ResourceError(f"{where} must be a number, not {value!r}") from None
    if not math.isfinite(number) or number < 0 or (number == 0 and not zero_ok):
        raise ResourceError(f"{where} must be a positive number, not {value!r}")
    return number


def _size(where: str, value: object) -> int | None:
    if value is None or value == "":
        return None
    try:
        return parse_positive_size(value)
    except ValueError as e:
        raise ResourceError(f"{where}: {e}") from None


def _check_order(resources: ImageResources) -> None:
    for slot in SLOTS:
        chain = [(level, getattr(getattr(resources, level), slot)) for level in LEVELS]
        present = [(level, value) for level, value in chain if value is not None]
        for (low_level, low), (high_level, high) in zip(present, present[1:], strict=False):
            if low > high:
                raise ResourceError(
                    f"resources: the {low_level} {describe(slot, low)} exceeds the "
                    f"{high_level} {describe(slot, high)}"
                )
