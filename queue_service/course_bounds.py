"""A course's bounds: the most an admin lets its instructors give the course, and the checks
on what they write (the course's allowance and presets) against them.

The bounds are the group property `fgpu_course_bounds`, which only admins set (`POST
api/courses`, `PATCH api/courses/{name}`, or the admin panel). They are a quota mapping
(quotas.py) whose every key is the highest value of that key of the course's allowance, the
group's `fgpu_quota`:

    {"fgpu": 8, "cpu": 16, "mem": "64G", "sessions": 30, "fgpu_hours_per_week": 40,
     "resource_groups": ["default"], "per_member": {"fgpu": 2, "sessions": 2}}

A group's quota counts all its members together, so `"fgpu": 8` means the course's members
hold at most 8 fGPU at once between them; its `per_member` mapping holds each member on their own
(quotas.py), so `"per_member": {"fgpu": 2}` bounds it to "at most 2 fGPU per student". The rules:
- An instructor changes only the keys the bounds name (any other is an admin's; inside
  `per_member` too), and each to a value within its bound; "unlimited" is beyond any bound.
  A course with no bounds lets its instructors change nothing of its allowance or presets.
- A preset's cpu, mem and fgpu stay within the bounds of those keys too (the course's and
  each member's), and a course has at most MAX_PRESETS of them.
- Setting bounds lowers the allowance to them where it is above (or unlimited), so that the
  allowance is always within the bounds an admin set through the service.

Everything written is read with the readers the service reads the properties with
(`parse_quota`, `parse_storage`, `parse_budgets`, `parse_presets`): what is accepted here is
what the scheduler then uses. Pure (no I/O).
"""

from __future__ import annotations

from fgpu_shared.units import format_size, parse_size
from queue_service.core.budgets import BUDGET_KEYS, FIGURE_SLOTS, BudgetError, parse_budgets
from queue_service.core.errors import Refusal
from queue_service.core.presets import PresetError, parse_presets

from .quotas import QuotaError, parse_quota, parse_storage

BOUNDS_PROPERTY = "fgpu_course_bounds"
#: The presets a course may define.
MAX_PRESETS = 20
_SIZES = {"mem", "storage"}


def read_quota(data: object, where: str) -> dict | None:
    """A quota mapping (an allowance, or bounds) if the service's readers take it, or a Refusal
    with their message. None stays None (no quota, or no bounds)."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise Refusal(f"{where} must be a mapping of quota keys, like {{'fgpu': 8}}.")
    try:
        parse_quota(data, where)
        parse_storage(data, where)
        parse_budgets(data, where)
    except (QuotaError, BudgetError) as e:
        raise Refusal(f"{e}.") from None
    return data


def read_presets(data: object, bounds: dict | None) -> list | None:
    """A course's presets (the group's `fgpu_presets`) if the readers take them and each is
    within the bounds; None stays None (no presets of the course's own)."""
    if data is None:
        return None
    try:
        presets = parse_presets(data, "presets")
    except PresetError as e:
        raise Refusal(f"{e}.") from None
    if len(presets) > MAX_PRESETS:
        raise Refusal(f"A course has at most {MAX_PRESETS} presets.")
    member = (bounds or {}).get("per_member") or {}
    for preset in presets:
        for key in ("cpu", "mem", "fgpu"):
            for limits, each in ((bounds or {}, False), (member, True)):
                if key in limits and _beyond(key, getattr(preset, key), limits[key]):
                    phrase = limit_phrase(key, limits[key], each)
                    raise Refusal(f"Preset {preset.name}: {key}: {phrase}.")
    return data


def changed_allowance(
    current: dict | None, change: object, bounds: dict | None, instructor: bool
) -> dict:
    """The allowance after `change` (a mapping; a key set to null is removed, as in a JSON merge
    patch), or a Refusal: an instructor's change of a key without a bound (403), any value
    beyond its bound (400), or a quota the readers refuse (400)."""
    if not isinstance(change, dict):
        raise Refusal("allowance must be a mapping of quota keys, like {'fgpu': 4}.")
    if instructor:
        unbounded = sorted(set(change) - set(bounds or {}))
        if isinstance(change.get("per_member"), dict) and "per_member" in (bounds or {}):
            inner = set(change["per_member"]) - set(bounds["per_member"])
            unbounded += [f"per_member.{key}" for key in sorted(inner)]
        if unbounded:
            raise Refusal(
                f"No bound is set on {', '.join(unbounded)}: only an admin may change it.",
                "forbidden",
            )
    merged = {key: value for key, value in (current or {}).items() if key not in change}
    merged.update({key: value for key, value in change.items() if value is not None})
    read_quota(merged, "allowance")
    for key in sorted(set(change) & set(bounds or {})):
        problem = _problem(key, merged.get(key), bounds[key])
        if problem:
            raise Refusal(f"allowance: {problem}.")
    return merged


def within_bounds(allowance: dict | None, bounds: dict) -> dict:
    """The allowance lowered to the bounds wherever it is above one or has no limit there."""
    lowered = dict(allowance or {})
    for key, bound in bounds.items():
        if key == "resource_groups":
            allowed = _names(bound)
            mine = _names(lowered[key]) if lowered.get(key) is not None else allowed
            lowered[key] = [name for name in mine if name in allowed]
        elif key == "per_member":
            mine = lowered.get(key)
            lowered[key] = within_bounds(mine if isinstance(mine, dict) else None, bound)
        elif _beyond(key, lowered.get(key), bound):
            lowered[key] = bound
    return lowered


def limit_phrase(key: str, bound, each: bool = False) -> str:
    """ "at most 8 fGPU for the course (all its members together), set by an admin", or with
    `each` (a `per_member` bound) "at most 2 fGPU for each member, set by an admin"."""
    if key == "resource_groups":
        return f"only the resource groups {', '.join(_names(bound)) or '(none)'}, set by an admin"
    whom = "each member" if each else "the course (all its members together)"
    return f"at most {_amount(key, bound)} for {whom}, set by an admin"


def _problem(key: str, value, bound, each: bool = False) -> str | None:
    """ "fgpu: at most ..." for the first bound that `value` passes, or None."""
    if key == "per_member":
        mine = value if isinstance(value, dict) else {}
        for inner in sorted(bound):
            problem = _problem(inner, mine.get(inner), bound[inner], each=True)
            if problem:
                return f"per_member: {problem}"
        return None
    return f"{key}: {limit_phrase(key, bound, each)}" if _beyond(key, value, bound) else None


def _beyond(key: str, value, bound) -> bool:
    """Whether `value` (None: no limit) passes `bound` (both already read as valid)."""
    if value is None:
        return True
    if key == "resource_groups":
        return not set(_names(value)) <= set(_names(bound))
    if key in _SIZES:
        return parse_size(value) > parse_size(bound)
    return float(value) > float(bound) + 1e-9


def _names(groups) -> list[str]:
    return [groups] if isinstance(groups, str) else list(groups)


def _amount(key: str, bound) -> str:
    if key in _SIZES:
        return format_size(parse_size(bound)) + (" of storage" if key == "storage" else "")
    number = float(bound)
    if key in BUDGET_KEYS:
        figure, period = key.rsplit("_per_", 1)
        return f"{number:g} {FIGURE_SLOTS[figure][1]} per {period}"
    unit = {"cpu": "cores", "fgpu": "fGPU", "sessions": "sessions", "pending": "waiting requests"}
    return f"{number:g} {unit[key]}"
