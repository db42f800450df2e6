"""Courses on hub groups (contract 8): what a course is, who runs it, and what its instructors
may do to their students' sessions.

A course is a JupyterHub group whose properties hold `fgpu_course`:

    {"instructors": ["alice", "bob"]}

Its members (the group's users) are its students and its instructors alike, so the group's
quota, budgets and presets (quotas.py) are the course's allowance for everyone in it. Only the
service writes `fgpu_course` (`POST api/courses`, `PUT api/courses/{name}/roster`); an admin who
edits it in the admin panel by hand writes the same thing. Beside it, `fgpu_course_bounds` holds
the admin's bounds on what its instructors may set (course_bounds.py, course_settings.py) and
`fgpu_course_folder` its folder (course_folders.py).

An instructor's powers come from that property, checked by the service on every request
(`may_act_on`), not from a hub role: JupyterHub keeps its roles in its configuration, so a
role per course would need a hub restart for every new course.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fgpu_shared import group_properties
from fgpu_shared.course_mark import COURSE_PROPERTY, marked_instructors
from fgpu_shared.course_messages import message_of
from queue_service.core.errors import Refusal
from queue_service.core.presets import PRESETS_PROPERTY
from queue_service.core.rosters import Roster, user_name_problem

from .course_bounds import BOUNDS_PROPERTY
from .course_folders import folder_setting
from .hub_client import HubClient, HubError
from .quotas import QUOTA_PROPERTY

#: The instructors a course may name in `POST api/courses`.
MAX_INSTRUCTORS = 50


@dataclass(frozen=True)
class Course:
    """A course as the hub's group has it: its name, instructors and members (students and
    instructors alike), and the group's quota mapping (`fgpu_quota`), None when it has none."""

    name: str
    instructors: tuple[str, ...]
    members: tuple[str, ...]
    allowance: dict | None
    #: The message its instructors posted to its members (fgpu_shared/course_messages.py).
    message: dict | None = None
    #: Display names the latest roster gave (user → name).
    names: dict = field(default_factory=dict)
    #: The admin's bounds on the allowance (course_bounds.py), None when unset.
    bounds: dict | None = None
    #: The group's own presets (`fgpu_presets`), None when it has none.
    presets: list | None = None
    #: The course folder's `{"id", "automount"}` (course_folders.py), None before it has one.
    folder: dict | None = None

    def role_of(self, user: str) -> str | None:
        """A member's role. An instructor named in `fgpu_course` who is no member has none: the
        hub drops a deleted user from its groups but not from a property, and a new account
        of the same name must not inherit the course."""
        if user not in self.members:
            return None
        return "instructor" if user in self.instructors else "student"

    def listing(self, user: str) -> dict:
        """The course as `GET api/courses` shows it to `user`."""
        return {
            "name": self.name,
            "instructors": list(self.instructors),
            "role": self.role_of(user),
            "members": len(self.members),
            "allowance": self.allowance,
            "message": self.message,
            "bounds": self.bounds,
            "presets": self.presets,
            "folder": self.folder,
        }

    def roster(self) -> list[dict]:
        """Its members with their roles, instructors first, as its Course page lists them."""
        ordered = sorted(self.members, key=lambda name: (self.role_of(name) != "instructor", name))
        return [
            {"name": name, "role": self.role_of(name), "display_name": self.names.get(name)}
            for name in ordered
        ]


def course_of(group: dict) -> Course | None:
    """The course a hub group model (HubClient.group: properties decoded) is, or None."""
    instructors = marked_instructors((group.get("properties") or {}).get(COURSE_PROPERTY))
    if instructors is None:
        return None
    properties = group["properties"]
    return Course(
        name=group["name"],
        instructors=tuple(instructors),
        members=tuple(group.get("users") or ()),
        allowance=_mapping(properties.get(QUOTA_PROPERTY)),
        message=message_of(properties),
        names=_names_in(properties[COURSE_PROPERTY]),
        bounds=_mapping(properties.get(BOUNDS_PROPERTY)),
        presets=_list(properties.get(PRESETS_PROPERTY)),
        folder=folder_setting(group),
    )


def _names_in(mark: dict) -> dict[str, str]:
    names = mark.get("names")
    if not isinstance(names, dict):
        return {}
    return {user: name for user, name in names.items() if isinstance(name, str)}


def _mapping(value) -> dict | None:
    return value if isinstance(value, dict) else None


def _list(value) -> list | None:
    return value if isinstance(value, list) else None


def check_new_course(data: dict) -> tuple[str, tuple[str, ...]]:
    """`POST api/courses`'s body → (group name, instructors), or a Refusal."""
    name, instructors = data.get("name"), data.get("instructors")
    if not isinstance(name, str) or user_name_problem(name.lower()) or name != name.strip():
        raise Refusal("name must be a group name: letters, digits and ._@-, at most 64.")
    if not isinstance(instructors, list) or not 1 <= len(instructors) <= MAX_INSTRUCTORS:
        raise Refusal(f"instructors must be a list of 1 to {MAX_INSTRUCTORS} user names.")
    for instructor in instructors:
        problem = user_name_problem(instructor)
        if problem:
            raise Refusal(f"instructors: {problem}.")
    if len(set(instructors)) != len(instructors):
        raise Refusal("instructors names someone twice.")
    return name, tuple(instructors)


async def course_named(hub: HubClient, name: str) -> Course | None:
    """The course `name` as the hub has it this moment (never cached: who may act on it is
    decided on it), or None when there is no such group or it is no course."""
    try:
        group = await hub.group_now(name)
        return course_of({**group, "properties": group_properties.decoded(group.get("properties"))})
    except HubError as e:
        if e.status == 404:
            return None
        raise


async def courses_of(hub: HubClient, person: dict) -> list[Course]:
    """The courses `person` is in or teaches (their hub groups); every course for admins."""
    if person["admin"]:
        found = [course_of(group) for group in await hub.groups()]
    else:
        # One read per group, at once: a user in many groups waits for the slowest, not the sum.
        names = person.get("groups") or ()
        found = await asyncio.gather(*(course_named(hub, name) for name in names))
    return sorted((c for c in found if c is not None), key=lambda course: course.name)


async def may_act_on(hub: HubClient, person: dict, owner: str) -> bool:
    """Whether `person` (handlers' `person()`: admin powers from the token) may act on a
    session of `owner`: their own, an admin's power, or an instructor's over a member of a
    course they teach. A hub admin is nobody's student: a roster that names one gives its
    instructors no power over the admin's sessions."""
    if person["admin"] or person["name"] == owner:
        return True
    for course in await courses_of(hub, {**person, "admin": False}):
        if course.role_of(person["name"]) == "instructor" and owner in course.members:
            return not (await hub.user(owner)).get("admin")
    return False


async def make_course(hub: HubClient, name: str, instructors: tuple[str, ...]) -> bool:
    """Make the group `name` a course taught by `instructors` (created if missing, adopted
    otherwise; instructors created and made members); whether the group was created."""
    group = await _group_to_adopt(hub, name)
    # Users first: the hub checks every name before it creates any, so a name it refuses
    # leaves no group behind either.
    await hub.create_users(instructors)
    if group is None:
        await hub.create_group(name)
    await hub.add_group_users(name, instructors)
    await _mark(hub, name, instructors)
    return group is None


async def set_roster(hub: HubClient, course: Course, roster: Roster) -> None:
    """Make the course's members exactly the roster's (checked whole before: rosters.py)."""
    wanted = set(roster.members)
    await hub.create_users(roster.members)
    await hub.add_group_users(course.name, [u for u in roster.members if u not in course.members])
    await hub.remove_group_users(course.name, [u for u in course.members if u not in wanted])
    # The display names are the latest roster's: one without any drops them.
    await _update_mark(
        hub, course.name, instructors=list(roster.instructors), names=roster.names or None
    )


async def _group_to_adopt(hub: HubClient, name: str) -> dict | None:
    """The existing group `name` if it may become a course, None if there is none."""
    try:
        group = await hub.group_now(name)
    except HubError as e:
        if e.status != 404:
            raise
        return None
    if group.get("roles"):
        # A roster adds people to the group: they would get its roles' scopes from the hub.
        raise Refusal(
            f"The group {name!r} holds the hub roles {', '.join(group['roles'])}: its instructors "
            f"could hand them to anyone on a roster. Make the course another group.",
            "conflict",
        )
    return group


async def set_message(hub: HubClient, name: str, message: dict | None) -> None:
    """Post `message` ({text, by, at}) to the course's members, or take it down (None)."""
    await _update_mark(hub, name, message=message)


async def _mark(hub: HubClient, name: str, instructors) -> None:
    """Record the instructors in the group's properties."""
    await _update_mark(hub, name, instructors=list(instructors))


async def _update_mark(hub: HubClient, name: str, **changes) -> None:
    """Change keys of the course mark, keeping its other keys and every other property as the
    hub has it (the admin panel's text values stay text); a None value removes its key."""
    properties = dict((await hub.group_now(name)).get("properties") or {})
    mark = group_properties.decoded({COURSE_PROPERTY: properties.get(COURSE_PROPERTY)})
    mark = dict(mark[COURSE_PROPERTY]) if isinstance(mark[COURSE_PROPERTY], dict) else {}
    mark.update(changes)
    properties[COURSE_PROPERTY] = {k: v for k, v in mark.items() if v is not None}
    await hub.set_group_properties(name, properties)
