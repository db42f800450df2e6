"""A course's images: what a course's instructors may do to the catalog.

The catalog's curators (the `custom:images:manage` scope: the hub's `instructors` group) and the
admins change any image. A course's instructors, who hold no scope, change the images offered
only to courses they teach: an image whose `groups` are all courses of theirs. They add one
(restricted to their course), edit, hide, check and delete it, and never touch an image others
see: restricting an image offered to everyone would take it from every other class, and widening
their own to everyone would offer it to every student of the hub.
"""

from __future__ import annotations

from . import courses
from .hub_client import HubClient


async def courses_taught(hub: HubClient, person: dict) -> frozenset[str]:
    """The courses `person` is an instructor of (their own role, an admin's aside)."""
    found = await courses.courses_of(hub, {**person, "admin": False})
    return frozenset(c.name for c in found if c.role_of(person["name"]) == "instructor")


def may_manage(taught: frozenset[str] | None, entry: dict) -> bool:
    """Whether a course curator teaching `taught` manages `entry`; None: a catalog curator."""
    if taught is None:
        return True
    groups = entry.get("groups")
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        return False  # no groups (everyone), or no list of names: the parser says why to others
    return bool(groups) and set(groups) <= taught


def refusal(taught: frozenset[str], entries: list[dict]) -> str | None:
    """Why someone teaching `taught` may not change these entries (as they are and would be),
    or None. Teaching no course is a refusal of its own (the scope's message says what is
    needed)."""
    if not taught:
        return "You teach no course."
    for entry in entries:
        if not may_manage(taught, entry):
            return (
                f"A course's instructors change only the images offered to their courses alone: "
                f"set groups to courses you teach ({', '.join(sorted(taught))}); "
                f"{entry.get('name')!r} would be offered to {_offered_to(entry)}."
            )
    return None


def _offered_to(entry: dict) -> str:
    groups = entry.get("groups")
    if not groups:
        return "everyone"
    return ", ".join(map(str, groups)) if isinstance(groups, list) else repr(groups)
