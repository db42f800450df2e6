"""`PATCH api/courses/{name}`: what an admin or an instructor changes of a course, checked whole
before one write of the group's properties, so that a refusal changes nothing.

The body holds any of:
- `bounds` (admins only): the course's bounds (course_bounds.py), or null to remove them;
- `allowance`: a change of the group's `fgpu_quota`, as a JSON merge patch (a key set to null
  is removed): within the bounds, and for instructors only on keys the bounds name;
- `presets`: the group's `fgpu_presets` whole (a list, presets.py), or null for none;
- `automount`: whether the course's folder is mounted in its members' sessions
  (course_folders.py).

An instructor needs bounds set before changing the allowance or presets (403 until an admin
sets them). Instructors never change the bounds, the instructors (that is the roster's) or any
other property.
"""

from __future__ import annotations

from fgpu_shared import group_properties
from queue_service.core.errors import Refusal
from queue_service.core.presets import PRESETS_PROPERTY

from . import course_bounds
from .course_bounds import BOUNDS_PROPERTY
from .course_folders import FOLDER_PROPERTY
from .hub_client import HubClient
from .quotas import QUOTA_PROPERTY

CHANGES = ("bounds", "allowance", "presets", "automount")


def check_change(change: object, admin: bool) -> dict:
    """The body's shape and who may send it, before anything is read."""
    if not isinstance(change, dict) or not change:
        raise Refusal(f"Send a mapping with any of {', '.join(CHANGES)}.")
    unknown = sorted(set(change) - set(CHANGES))
    if unknown:
        raise Refusal(
            f"A course's {', '.join(unknown)} cannot be changed here (only "
            f"{', '.join(CHANGES)}; its instructors are its roster's)."
        )
    if "bounds" in change and not admin:
        raise Refusal("Only an admin sets a course's bounds.", "forbidden")
    if "automount" in change and not isinstance(change["automount"], bool):
        raise Refusal("automount is true or false.")
    return change


def new_properties(properties: dict, change: dict, admin: bool) -> dict:
    """The group's properties after the change (those it does not touch kept as stored), or a
    Refusal; `properties` as the hub stores them."""
    decoded = group_properties.decoded(properties)
    bounds = course_bounds.read_quota(
        change["bounds"] if "bounds" in change else decoded.get(BOUNDS_PROPERTY), "bounds"
    )
    if not admin and bounds is None and ({"allowance", "presets"} & set(change)):
        raise Refusal(
            "An admin must set this course's bounds before its instructors may change its "
            "allowance or presets.",
            "forbidden",
        )
    result = dict(properties)
    current = decoded.get(QUOTA_PROPERTY)
    allowance = current if isinstance(current, dict) else None
    if "allowance" in change:
        allowance = course_bounds.changed_allowance(
            allowance, change["allowance"], bounds, instructor=not admin
        )
    if "bounds" in change and bounds is not None:
        allowance = course_bounds.within_bounds(allowance, bounds)
    if allowance is not None and allowance is not current:
        result[QUOTA_PROPERTY] = allowance
    if "bounds" in change:
        _put(result, BOUNDS_PROPERTY, bounds)
    if "presets" in change:
        _put(result, PRESETS_PROPERTY, course_bounds.read_presets(change["presets"], bounds))
    if "automount" in change:
        setting = decoded.get(FOLDER_PROPERTY)
        if not isinstance(setting, dict) or "id" not in setting:
            raise Refusal("This course has no folder yet; its roster or an admin makes it.")
        result[FOLDER_PROPERTY] = {**setting, "automount": change["automount"]}
    return result


def _put(properties: dict, key: str, value) -> None:
    if value is None:
        properties.pop(key, None)
    else:
        properties[key] = value


async def change_course(hub: HubClient, name: str, change: dict, admin: bool) -> None:
    """Apply a checked change (check_change) to the course `name` in one write."""
    properties = (await hub.group_now(name)).get("properties") or {}
    await hub.set_group_properties(name, new_properties(properties, change, admin))
