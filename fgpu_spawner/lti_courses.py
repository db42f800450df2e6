"""What an LMS launch makes of the hub's courses: the launch's course (its LTI context) names a
hub group, the student joins it, and an LMS instructor becomes the course's instructor
(the group's `fgpu_course` mark, fgpu_shared/course_mark.py; docs/source/howto/logins.md).

Reading a launch is pure (`course_launch`); joining writes the hub's own database, in the hub
process, once the launch is verified (`join_course`). A launch only adds: a member the LMS no
longer lists, or an instructor it now calls a learner, stays what the hub has until a roster or
an admin changes it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from urllib.parse import urlparse

from jupyterhub import orm
from tornado import web

from fgpu_shared.course_mark import COURSE_PROPERTY, marked_instructors
from fgpu_shared.group_properties import decoded

#: The LTI 1.3 claims a launch's course and roles are read from.
CONTEXT_CLAIM = "https://purl.imsglobal.org/spec/lti/claim/context"
ROLES_CLAIM = "https://purl.imsglobal.org/spec/lti/claim/roles"
#: What a hub group name may hold (queue_service/core/rosters.py checks the same).
GROUP_NAME = re.compile(r"[A-Za-z0-9._@-]{1,64}")
NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9._@-]+")


@dataclass(frozen=True)
class CourseLaunch:
    """The course a verified launch came from: the hub group it names, and whether the
    launching person teaches it in the LMS."""

    group: str
    instructor: bool


def lti13_course(id_token: dict) -> tuple[str, str, list[str]] | None:
    """(platform, context id, roles) of a verified LTI 1.3 id_token, None without a context."""
    context = id_token.get(CONTEXT_CLAIM)
    if not isinstance(context, dict) or not context.get("id"):
        return None
    roles = id_token.get(ROLES_CLAIM)
    platform = urlparse(str(id_token.get("iss", ""))).hostname or ""
    return platform, str(context["id"]), [r for r in roles or () if isinstance(r, str)]


def lti11_course(args: dict) -> tuple[str, str, list[str]] | None:
    """(platform, context id, roles) of a verified LTI 1.1 launch's parameters (the platform is
    its consumer key), None without a context."""
    if not args.get("context_id"):
        return None
    roles = [role.strip() for role in str(args.get("roles", "")).split(",")]
    return str(args.get("oauth_consumer_key", "")), str(args["context_id"]), roles


def course_launch(
    found: tuple[str, str, list[str]] | None,
    course_groups: dict,
    template: str,
    instructor_roles: set[str],
) -> CourseLaunch | None:
    """The course a launch joins: a mapped context's group, else the template's name, else
    none (an empty template: only mapped contexts are courses)."""
    if found is None:
        return None
    platform, context_id, roles = found
    group = course_groups.get(context_id)
    if group is None:
        if not template:
            return None
        group = group_name(template.format(context_id=context_id, platform=platform))
    return CourseLaunch(group=group, instructor=bool(instructor_roles & set(roles)))


def group_name(wanted: str) -> str:
    """`wanted` as a hub group name: other characters become `-`, and a name too long keeps
    its start and a digest of the whole, so that two long ids stay two groups."""
    name = NOT_IN_A_NAME.sub("-", wanted).strip("-") or "lti"
    if len(name) > 64:
        name = f"{name[:47]}-{hashlib.sha256(wanted.encode()).hexdigest()[:16]}"
    return name


def refuse_a_group_with_roles(db, launch: CourseLaunch) -> None:
    """A launch never joins a group that holds hub roles: its members get the roles' scopes,
    and anyone the LMS lists would then hold them (queue_service/courses.py refuses such a
    group as a course for the same reason). Checked before the person's account is made."""
    group = db.query(orm.Group).filter_by(name=launch.group).one_or_none()
    if group is not None and group.roles:
        raise web.HTTPError(
            403,
            f"Your course's hub group {launch.group!r} cannot take LMS launches: it holds hub "
            "roles, which everyone the LMS sends would get. Tell the hub's admin: they map this "
            "course to another group (c.LTICourseAuthenticator.course_groups).",
            reason="Launch refused",
        )


def join_course(db, orm_user: orm.User, launch: CourseLaunch) -> None:
    """Put the person in the course's group (made, and marked a course, if it is not one yet),
    and name them among its instructors when the LMS says they teach it."""
    refuse_a_group_with_roles(db, launch)
    group = db.query(orm.Group).filter_by(name=launch.group).one_or_none()
    if group is None:
        group = orm.Group(name=launch.group)
        db.add(group)
    if group not in orm_user.groups:
        orm_user.groups.append(group)
    properties = dict(group.properties or {})
    mark = decoded(properties).get(COURSE_PROPERTY)
    instructors = marked_instructors(mark)
    wanted = list(instructors or [])
    if launch.instructor and orm_user.name not in wanted:
        wanted.append(orm_user.name)
    if instructors != wanted:
        # A new dict: the JSON column is written only when its value is replaced.
        properties[COURSE_PROPERTY] = {
            **(mark if isinstance(mark, dict) else {}),
            "instructors": wanted,
        }
        group.properties = properties
    db.commit()
