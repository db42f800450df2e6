"""`api/courses` (contract 8): courses on hub groups (courses.py).

- `GET api/courses`: the courses you are in or teach (every course for admins), each with its
  instructors, your role, its member count, its allowance (the group's `fgpu_quota`), bounds,
  presets and folder (courses.py: `Course.listing`);
- `POST api/courses {name, instructors, bounds?}` (admins): make a group a course, or adopt one,
  with its folder (course_folders.py) and, optionally, its bounds (course_bounds.py);
- `PATCH api/courses/{name}` (admins and the course's instructors): its bounds (admins only),
  allowance, presets, and whether its folder is automounted (course_settings.py);
- `PUT api/courses/{name}/roster` (admins and the course's instructors), a CSV body
  (`text/csv`, `user,role` lines: core/rosters.py): its members become exactly the roster's,
  and its folder's read-write shares its instructors;
- `GET api/courses/{name}/sessions` (admins and the course's instructors): its members' live
  sessions and jobs;
- `GET api/courses/{name}` (admins and its instructors): the course with its roster (members and
  roles) and its budgets with this window's use;
- `POST api/courses/{name}/message {text}` (admins and its instructors): the message its members
  see as the hub's announcement (fgpu_shared/course_messages.py); an empty text takes it down;
- `POST api/courses/{name}/sessions/{id}/open` (its instructors): share a member's running
  session with the instructor, to help (instructor_visits.py); answers the server's URL.

A course a caller is not in answers 404, as a missing one does (no course names are revealed
to strangers); its students get 403 on what only its instructors may do.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

from jupyterhub.utils import url_escape_path, url_path_join
from tornado import web

from fgpu_shared.course_messages import message_problem
from queue_service import course_bounds, course_folders, course_settings, courses, instructor_visits
from queue_service.core import rosters
from queue_service.core.errors import Refusal
from queue_service.core.status import Status
from queue_service.store.accounts import Account

from .base import BaseHandler, session_or_none


async def course_to_run(handler: BaseHandler, name: str) -> tuple[dict, courses.Course]:
    """The caller and the course `name`, if they are an admin or one of its instructors: 404
    for a course the caller is not in (as for none), 403 for its students. The API and the
    Course page decide alike."""
    person = await handler.person()
    course = await handler.from_hub(courses.course_named(handler.hub, name))
    role = course.role_of(person["name"]) if course else None
    if course is None or (role is None and not person["admin"]):
        raise web.HTTPError(404, f"No such course: {name}.")
    if role != "instructor" and not person["admin"]:
        raise web.HTTPError(403, "Only the course's instructors and admins may do this.")
    return person, course


class CourseHandlerBase(BaseHandler):
    async def course_to_run(self, name: str) -> tuple[dict, courses.Course]:
        return await course_to_run(self, name)

    async def with_folder(self, name: str) -> courses.Course:
        """The course `name` once its folder is made and shared as its members and
        instructors now are (course_folders.py)."""
        course = await self.from_hub(courses.course_named(self.hub, name))
        await self.from_hub(course_folders.provide(self.hub, self.folders, course))
        return await self.from_hub(courses.course_named(self.hub, name))


class CoursesHandler(CourseHandlerBase):
    """GET your courses (all for admins); POST makes or adopts a course (admins)."""

    @web.authenticated
    async def get(self):
        person = await self.person()
        found = await self.from_hub(courses.courses_of(self.hub, person))
        self.write_json({"courses": [course.listing(person["name"]) for course in found]})

    @web.authenticated
    async def post(self):
        self.require_admin("Making a course")
        body = self.body()
        name, instructors = courses.check_new_course(body)
        bounds = course_bounds.read_quota(body.get("bounds"), "bounds")  # before any change
        created = await self.from_hub(courses.make_course(self.hub, name, instructors))
        if bounds is not None:
            change = {"bounds": bounds}
            await self.from_hub(course_settings.change_course(self.hub, name, change, True))
        course = await self.with_folder(name)
        self.write_json(course.listing(self.identity()["name"]), 201 if created else 200)


class CourseHandler(CourseHandlerBase):
    """GET one course for its Course page (roster, allowance, budgets with their use); PATCH
    its bounds (admins), allowance, presets and folder automount."""

    @web.authenticated
    async def get(self, name):
        person, course = await self.course_to_run(name)
        # The budgets count every member's use: the quota book must know the members, which it
        # learns from a member's groups (an admin running the course may be none).
        member = person if course.role_of(person["name"]) or not course.members else None
        member = member or await self.from_hub(self.hub.user(course.members[0]))
        await self.refresh_quotas(member)
        budgets = await self.usage.budget_status(Account.of(member), (course.name,))
        self.write_json(
            {**course.listing(person["name"]), "roster": course.roster(), "budgets": budgets}
        )

    @web.authenticated
    async def patch(self, name):
        person, _ = await self.course_to_run(name)
        change = course_settings.check_change(self.body(), person["admin"])
        await self.from_hub(course_settings.change_course(self.hub, name, change, person["admin"]))
        course = await self.from_hub(courses.course_named(self.hub, name))
        self.write_json(course.listing(person["name"]))


class RosterHandler(CourseHandlerBase):
    """PUT a course's roster (CSV): its members become exactly those it names."""

    max_body_bytes = rosters.MAX_BYTES

    def body_types(self) -> tuple[str, ...]:
        return ("text/csv",)

    @web.authenticated
    async def put(self, name):
        person, course = await self.course_to_run(name)
        roster = rosters.parse_roster(self._text())  # all of it checked before any change
        await self.from_hub(courses.set_roster(self.hub, course, roster))
        course = await self.with_folder(name)
        self.write_json(course.listing(person["name"]))

    def _text(self) -> str:
        try:
            return self.raw_body().decode("utf-8-sig")
        except UnicodeDecodeError:
            raise Refusal("The roster is not UTF-8 text. Nothing was changed.") from None


class CourseSessionsHandler(CourseHandlerBase):
    """GET the live sessions and jobs of a course's members (admins and its instructors)."""

    @web.authenticated
    async def get(self, name):
        _, course = await self.course_to_run(name)
        members = set(course.members)
        sessions = [s for s in self.manager.sessions(user=None) if s["user"] in members]
        self.write_json({"course": course.name, "sessions": sessions})


class CourseMessageHandler(CourseHandlerBase):
    """POST the course's message to its members (an empty text takes it down)."""

    @web.authenticated
    async def post(self, name):
        person, course = await self.course_to_run(name)
        text = self.body().get("text")
        problem = message_problem(text)
        if problem:
            raise Refusal(problem)
        text = " ".join(text.split())  # one banner line: the hub's announcement is one paragraph
        at = datetime.now(UTC).isoformat(timespec="seconds")
        message = {"text": text, "by": person["name"], "at": at} if text else None
        await self.from_hub(courses.set_message(self.hub, course.name, message))
        self.write_json({"course": course.name, "message": message})


class CourseVisitHandler(CourseHandlerBase):
    """POST: share a member's running session with the calling instructor, to help."""

    @web.authenticated
    async def post(self, name, session_id):
        person, course = await self.course_to_run(name)
        record = await session_or_none(self.manager, session_id)
        if record is None or record["user"] not in course.members:
            raise web.HTTPError(404, "No such session in this course.")
        if record["user"] == person["name"]:
            raise Refusal("This session is your own: open it from your Sessions page.")
        if course.role_of(person["name"]) != "instructor":
            raise web.HTTPError(403, "Only the course's instructors open their students' sessions.")
        if record["status"] != Status.RUNNING or record.get("type") == "batch":
            raise Refusal("Only a running session (not a batch job) can be opened.", "conflict")
        owner, server = record["user"], record["server_name"]
        # The course is read and the caller teaches its member: of courses.may_act_on only the
        # last test is left (a hub admin is nobody's student).
        if not person["admin"] and (await self.from_hub(self.hub.user(owner))).get("admin"):
            raise web.HTTPError(403, "An admin's session is not opened from a course.")
        await self.from_hub(instructor_visits.open_for(self.hub, person["name"], owner, server))
        self.write_json({"url": server_url(owner, server), "user": owner, "server_name": server})


def server_url(owner: str, server: str) -> str:
    """The hub-relative path of a user's server, escaped as the hub's own `User.url` is."""
    base = os.environ.get("JUPYTERHUB_BASE_URL", "/")
    return url_path_join(base, "user", url_escape_path(owner), url_escape_path(server)) + "/"


def routes(prefix: str) -> list:
    return [
        (prefix + r"api/courses", CoursesHandler),
        (prefix + r"api/courses/([^/]+)", CourseHandler),
        (prefix + r"api/courses/([^/]+)/message", CourseMessageHandler),
        (prefix + r"api/courses/([^/]+)/sessions/([^/]+)/open", CourseVisitHandler),
        (prefix + r"api/courses/([^/]+)/roster", RosterHandler),
        (prefix + r"api/courses/([^/]+)/sessions", CourseSessionsHandler),
    ]
