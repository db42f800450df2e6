"""A course's material by one link (contract 8; core/material_links.py says why it is a page of
this service and what keeps it safe):

- `GET api/courses/{name}/link?repo=URL&branch=B&path=P&app=lab|notebook` (admins and the
  course's instructors): the link to hand out, `{"link": ..., ...}`;
- `GET courses/{name}/open?...` (the course's members, and admins): the page the link opens. It
  takes the student to their running session's nbgitpuller, which pulls the repository into
  their home and opens the file; with no session, it starts one through the queue (the course's
  preset, if its group has one the student may use) and waits on the PENDING request, looking
  again every few seconds, until it is granted.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from urllib.parse import urlsplit

from jupyterhub.utils import get_browser_protocol
from tornado import web

from queue_service import courses
from queue_service.core.errors import Refusal
from queue_service.core.material_links import (
    MaterialLink,
    open_path,
    parse_link,
    pull_query,
    sign,
    signed_by_service,
)
from queue_service.core.status import ALLOCATED, FINAL

from .courses import CourseHandlerBase, server_url
from .pages import PageHandler
from .presets import offered_presets
from .sessions import launch_sessions

LINK_ARGUMENTS = {"repo": "text", "branch": "text", "path": "text", "app": "choice"}
#: How often the waiting page looks again (seconds).
LOOK_AGAIN = 3


def link_of(handler: web.RequestHandler) -> MaterialLink:
    return parse_link({key: handler.get_argument(key, "") for key in LINK_ARGUMENTS})


def signing_key(handler: web.RequestHandler) -> bytes:
    """The links' key, derived from the service's own secret (QueueService.cookie_secret_file)
    so that no link signature is ever a valid cookie signature or the other way round."""
    secret = handler.settings["cookie_secret"]
    secret = secret if isinstance(secret, bytes) else secret.encode()
    return hmac.new(secret, b"fgpu material links", hashlib.sha256).digest()


class MaterialLinkHandler(CourseHandlerBase):
    """GET the link that hands out a repository's material to a course's students."""

    query_arguments = LINK_ARGUMENTS

    @web.authenticated
    async def get(self, name):
        _, course = await self.course_to_run(name)
        link = link_of(self)
        page = f"{self.settings['page_prefix']}courses/{course.name}/open"
        path = open_path(page, link, sign(signing_key(self), course.name, link))
        self.write_json(
            {
                "link": self._public_origin() + path,
                "link_path": path,
                "course": course.name,
                "folder": link.folder,
                **link.arguments(),
            }
        )

    def _public_origin(self) -> str:
        """The hub's public origin: from JupyterHub's `public_url` when the site set one (the
        hub hands this service its public URL), else the host and protocol the instructor's
        browser reached the hub at."""
        public = urlsplit(os.environ.get("JUPYTERHUB_PUBLIC_URL", ""))
        if public.scheme and public.netloc:
            return f"{public.scheme}://{public.netloc}"
        return f"{get_browser_protocol(self.request)}://{self.request.host}"


class MaterialOpenPage(PageHandler):
    """The page a material link opens: to the session's nbgitpuller, through the queue if need be."""

    query_arguments = {**LINK_ARGUMENTS, "sig": "text", "session": "text"}

    @web.authenticated
    async def get(self, name):
        person = await self.person()
        course = await self.from_hub(courses.course_named(self.hub, name))
        if course is None or (course.role_of(person["name"]) is None and not person["admin"]):
            raise web.HTTPError(404, f"No such course: {name}.")
        link = link_of(self)
        if not signed_by_service(
            signing_key(self), course.name, link, self.get_argument("sig", "")
        ):
            raise Refusal(
                "This link was not made by the course's instructors, or was changed since: "
                "ask them for the link again.",
                "forbidden",
            )
        session = self._live_session(person["name"]) or await self._waited_on(person["name"])
        if session is None:
            session = await self._start(person, course)
        if session["status"] in ALLOCATED:
            self.redirect(self._pull_url(person["name"], session["server_name"], link))
            return
        await self._render_waiting(person, course, link, session)

    def _live_session(self, user: str) -> dict | None:
        """The user's interactive session that is granted, else the one waiting, if any: their
        default server first, as the hub's own links open it."""
        live = [
            s
            for s in self.manager.sessions(user=user)
            if s["type"] == "interactive" and s["status"] not in FINAL
        ]
        live.sort(key=lambda s: (s["status"] not in ALLOCATED, s["server_name"] != ""))
        return live[0] if live else None

    async def _waited_on(self, user: str) -> dict | None:
        """The session this page started and waited on (`session=`) when it has ended: the page
        says how it ended rather than start another, so a failing start is never repeated."""
        waited = self.get_argument("session", "")
        if not waited:
            return None
        try:
            session = await self.manager.get(waited)
        except KeyError:
            return None
        if session["user"] != user:
            return None
        why = session.get("reason") or session.get("end_reason") or session["status"]
        raise web.HTTPError(409, f"Your session ended before it opened the material: {why}.")

    async def _start(self, person: dict, course: courses.Course) -> dict:
        """A session through the queue, with the course's preset when it has one for them."""
        await self.refresh_quotas(person)
        own = {p.name for p in self.quotas.presets_of((course.name,))[course.name]}
        usable = [p["name"] for p in offered_presets(self, person) if p["available"]]
        preset = next((name for name in usable if name in own), None)
        data = {"preset": preset} if preset else {}
        servers = await launch_sessions(self, person, data, 1)
        return servers[0]["session"]

    def _pull_url(self, user: str, server: str, link: MaterialLink) -> str:
        return f"{server_url(user, server)}git-pull?{pull_query(link)}"

    async def _render_waiting(
        self, person: dict, course, link: MaterialLink, session: dict
    ) -> None:
        signature = self.get_argument("sig")
        again = open_path(self.request.path, link, signature) + f"&session={session['id']}"
        await self.render_page(
            "material_open.html",
            person,
            page_config=self.page_config(person),
            course=course.name,
            link=link,
            session=session,
            again=again,
            look_again=LOOK_AGAIN,
        )


def routes(prefix: str) -> list:
    return [
        (prefix + r"api/courses/([^/]+)/link", MaterialLinkHandler),
        (prefix + r"courses/([^/]+)/open", MaterialOpenPage),
    ]
