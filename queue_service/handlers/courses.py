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
  sessions and jobs.

A course a caller is not in answers 404, as a missing one does (no course names are revealed
to strangers); its students get 403 on what only its instructors may do.
"""

from __future__ import annotations

from tornado import web

from queue_service import course_bounds, course_folders, course_settings, courses
from queue_service.core import rosters
from queue_service.core.errors import Refusal

from .base import BaseHandler


class CourseHandlerBase(BaseHandler):
    async def course_to_run(self, name: str) -> tuple[dict, courses.Course]:
        """The caller and the course `name`, if they are an admin or one of its instructors."""
        person = await self.person()
        course = await self.from_hub(courses.course_named(self.hub, name))
        role = course.role_of(person["name"]) if course else None
        if course is None or (role is None and not person["admin"]):
            raise web.HTTPError(404, f"No such course: {name}.")
        if role != "instructor" and not person["admin"]:
            raise web.HTTPError(403, "Only the course's instructors and admins may do this.")
        return person, course

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
    """PATCH a course's bounds (admins), allowance, presets and folder automount."""

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


def routes(prefix: str) -> list:
    return [
        (prefix + r"api/courses", CoursesHandler),
        (prefix + r"api/courses/([^/]+)", CourseHandler),
        (prefix + r"api/courses/([^/]+)/roster", RosterHandler),
        (prefix + r"api/courses/([^/]+)/sessions", CourseSessionsHandler),
    ]
