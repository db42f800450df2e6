"""`api/sessions` (docs/source/explanation/contracts.md, contract 4): people's sessions.

- `GET api/sessions`: your own; everyone's for admins (`?all=0`: an admin's own only);
- `GET api/sessions?finished=1`: the ended ones, newest first, from the DB (`history.py`), with
  `user=` (admins), `reason=`, `from=`, `to=`, `limit=`, `offset=`;
- `POST api/sessions` with `{image, cpu, mem, fgpu, count}` (or a `preset` for cpu, mem and
  fgpu; a `name`, `env`): launch `count` named servers; the answer comes with their queue
  records, before the hub has started them (`launches.py`);
- `DELETE api/sessions/{id}`: stop a running session or cancel a pending one;
- `POST api/sessions/{id}/image` with `{tag}`: admins turn a running session into a private image
  of its owner (`private_images.py`).
"""

from __future__ import annotations

import asyncio

from tornado import web

from queue_service import course_folders, launches
from queue_service.core import end_reasons, query_args
from queue_service.core.status import Status
from queue_service.store.accounts import Account
from queue_service.store.folders import Reader
from queue_service.store.history import parse_filters
from queue_service.store.images import CheckResult
from queue_service.store.models import utcnow

from ..hub_client import HubError
from ..private_images import (
    CommitError,
    check_tag,
    private_entry,
    private_reference,
    session_commit,
)
from .base import BaseHandler, session_or_none
from .presets import offered_presets

MAX_LAUNCH = 20


class SessionsHandler(BaseHandler):
    """GET your sessions (everyone's for admins); POST launches `count` named servers."""

    HISTORY_ARGUMENTS = {
        "user": "text",
        "reason": "choice",
        "from": "moment",
        "to": "moment",
        "limit": "whole",
        "offset": "whole",
    }
    query_arguments = {"finished": "flag", "all": "flag", **HISTORY_ARGUMENTS}

    @web.authenticated
    async def get(self):
        person = await self.person()
        if self._finished_asked():
            await self.get_finished(person)
            return
        everyone = person["admin"] and query_args.flag(self.get_argument("all", ""), "all", True)
        sessions = self.manager.sessions(user=None if everyone else person["name"])
        folders, ids = self.folders, [s["id"] for s in sessions]
        # From memory on the pages' polls; off the event loop only when the DB must be read.
        mounts = folders.remembered_mounts(ids)
        if mounts is None:
            mounts = await asyncio.to_thread(folders.session_mounts, ids)
        self.write_json({"sessions": [{**s, "mounts": mounts[s["id"]]} for s in sessions]})

    def _finished_asked(self) -> bool:
        return query_args.flag(self.get_argument("finished", ""), "finished", False)

    async def get_finished(self, person: dict) -> None:
        """The ended sessions (yours, or everyone's for admins), newest first, a page at a time."""
        args = {name: self.get_argument(name, "") for name in self.HISTORY_ARGUMENTS}
        account = await self.account_of(person["name"])
        wanted = parse_filters(args, person["name"], person["admin"], account.key)
        self.write_json(await self.history.finished(wanted))

    @web.authenticated
    async def post(self):
        person = await self.person()
        data = self.body()
        count = data.pop("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_LAUNCH:
            raise web.HTTPError(400, f"count must be a whole number from 1 to {MAX_LAUNCH}.")
        servers = await launch_sessions(self, person, data, count)
        self.write_json({"servers": servers}, 201)


async def launch_sessions(handler: BaseHandler, person: dict, data: dict, count: int) -> list[dict]:
    """Launch `count` servers of `person` with the options `data` (a preset resolved, defaults
    filled in, every check made before any record exists); the servers with their records."""
    await handler.refresh_quotas(person)
    presets = offered_presets(handler, person)
    data = launches.with_launch_defaults(
        data,
        lambda: handler.images.visible_to(
            person["name"],
            tuple(person.get("groups", [])),
            bool(person.get("admin")),
            created=person.get("created"),
        ),
        presets,
        handler.session_limits,
    )
    data = launches.with_preset(data, presets)
    name, extras = launches.launch_extras(data, count)
    request = launches.launch_request(data)
    handler.images.admit_options(person, request)
    check_name_free(handler.manager, person["name"], name)
    # The account as the hub has it now, not as cached: its sessions are that account's.
    person = {**person, "account": (await handler.account_of(person["name"])).key}
    # Folders it may not mount are refused now, before any record exists.
    reader = Reader.of({**person, "admin": False})
    courses = await handler.from_hub(course_folders.automounted(handler.hub, reader.groups))
    mounts = await asyncio.to_thread(handler.folders.mounts, reader, extras["folders"], courses)
    # So is a job whose notebook is not there (in those folders, or in the home).
    await handler.check_notebook(Account(person["name"], person["account"]), request["job"], mounts)
    # A refusal of the first start carries the hub's own message (FGPUSpawner's checks).
    launch = handler.launcher.launch(person, request, count, name=name, extras=extras)
    return await handler.from_hub(launch)


def check_name_free(manager, user: str, name: str | None) -> None:
    """A name is unique among the user's live sessions (a launch of several: its prefix)."""
    if name is None:
        return
    for session in manager.sessions(user=user):
        taken = session["server_name"]
        if taken == name or taken.startswith(f"{name}-"):
            raise web.HTTPError(
                409, f"You already have a live session named {taken!r}; pick another name."
            )


class SessionHandler(BaseHandler):
    """DELETE stops a running session or cancels a pending one: the owner's, an admin's, or an
    instructor's of a course the owner is in (courses.may_act_on)."""

    @web.authenticated
    async def delete(self, session_id):
        person, record = await self.session_in_reach(session_id)
        if record["user"] != person["name"]:
            # The spawner's release does not know who asked the hub to stop: say it first.
            self.manager.expect_end(session_id, *_stopped_by(person))
        elif record["type"] == "batch":
            # Said first too: a job that exits as it is stopped ends as its owner's cancel,
            # whether the spawner's release or the job's own exit (job_ends.py) ends it.
            self.manager.expect_end(session_id, end_reasons.CANCELLED, "cancelled by its owner")
        try:
            await self._end(session_id, record)
        except BaseException:
            self.manager.forget_expected_end(session_id)  # nothing was stopped
            raise

    async def _end(self, session_id: str, record: dict) -> None:
        # A granted session is stopped through the hub: its spawner removes the container and
        # only then gives the slice back, so the next grant never meets a container still holding
        # it. Releasing here afterwards ends what the spawner left (a server the hub had already
        # stopped), and is a no-op otherwise. A pending one is cancelled here; its waiting spawn
        # then fails by itself.
        granted = ("SCHEDULED", "RUNNING")
        if record["status"] in granted and await self._hub_stops(record) == 202:
            self.write_json(
                await self.manager.get(session_id)
            )  # still stopping; the spawner releases
            return
        released = await self.manager.release(session_id)
        if released["released_from"] in granted and record["status"] not in granted:
            await self._hub_stops(record)  # granted since it was read: interrupt that spawn
        self.write_json(released)

    async def _hub_stops(self, record: dict) -> int | None:
        """Stop the session's server through the hub; its status, or None if the hub has none.
        A 404 here means "no such server", not a failure, so it does not go through from_hub."""
        try:
            return await self.hub.stop_server(record["user"], record["server_name"])
        except HubError as e:
            if e.status != 404:
                raise web.HTTPError(502, e.message) from None
            return None


class SessionImageHandler(BaseHandler):
    """POST api/sessions/{id}/image with {"tag": ...}: commit a running session (admins) and
    register the image as private to the session's owner."""

    @web.authenticated
    async def post(self, session_id):
        self.require_admin("Turning a session into an image")
        record = await session_or_none(self.manager, session_id)
        if record is None:
            raise web.HTTPError(404, "No such session.")
        if record["status"] != Status.RUNNING:
            raise web.HTTPError(
                409,
                f"Session {session_id} is {record['status']}; only a running one can be committed.",
            )
        user, images = record["user"], self.images
        owner_created = await self.from_hub(self.hub.account_created(user))
        tag = check_tag(self.body().get("tag"))
        entry = private_entry(user, tag, private_reference(user, tag), images.find(record["image"]))
        if images.find(entry.name) is not None:
            raise CommitError(f"The catalog already has an image named {entry.name!r}.", "conflict")
        committed, undo = await self.engine_backend.commit_session(
            session_id, record["grant"]["node"], session_commit(session_id, user, tag)
        )
        check = CheckResult(True, f"committed from running session {session_id}", utcnow())
        try:
            registered = await asyncio.to_thread(
                images.add, entry, source="private", check=check, owner_created=owner_created
            )
        except Exception:
            if undo is not None:
                await asyncio.to_thread(undo)
            raise
        self.write_json(
            {"session": session_id, "user": user, **committed, "catalog": registered}, 201
        )


def _stopped_by(person: dict) -> tuple[str, str]:
    """The end reason and its detail of someone else's session that `person` stops: an admin,
    or else (session_in_reach let them) an instructor of a course its owner is in."""
    if person["admin"]:
        return end_reasons.ADMIN, f"stopped by {person['name']} (an admin)"
    return end_reasons.INSTRUCTOR, f"stopped by {person['name']} (their instructor)"


def routes(prefix: str) -> list:
    return [
        (prefix + r"api/sessions", SessionsHandler),
        (prefix + r"api/sessions/([0-9a-f]+)", SessionHandler),
        (prefix + r"api/sessions/([0-9a-f]+)/image", SessionImageHandler),
    ]
