"""`api/grants`: the spawner's own endpoints, for its identity alone.

- `POST api/grants`: a slice for one server (the record, PENDING or SCHEDULED);
- `GET api/grants/{id}?wait=&version=`: the record once it changes (long-poll);
- `DELETE api/grants/{id}[?user=&server_name=][&end_reason=]`: release (only if the record is
  that server's, when named; `end_reason` `error` for a failed start, `idle` when the spawner
  stops it for the idle culler: end_reasons.py);
  `POST api/grants/{id}/running`: the server is up.

Only the hub service whose token the spawner holds (`spawner_service`) may call them: a student's
token, even one with access to the service, gets 403.
"""

from __future__ import annotations

import asyncio

from tornado import web

from queue_service import course_folders
from queue_service.core import end_reasons, query_args
from queue_service.engine.registry_images import pinned_reference
from queue_service.store.accounts import Account
from queue_service.store.folders import Reader

from .base import BaseHandler

#: The longest a long-poll waits for a change, in seconds.
MAX_WAIT = 60


class SpawnerHandler(BaseHandler):
    """Admits the spawner's identity alone, once for every method of its handlers."""

    async def admit(self) -> None:
        await super().admit()
        identity = self.identity()
        if identity.get("kind") != "service" or identity.get("name") != self.spawner_service:
            raise web.HTTPError(403, "Only the hub's spawner may ask for grants.")

    async def session_answer(self, awaitable):
        """The queue's answer; an unknown session is a 404 (refusals map themselves)."""
        try:
            return await awaitable
        except KeyError:
            raise web.HTTPError(404, "No such session.") from None


class GrantsHandler(SpawnerHandler):
    """POST api/grants: the spawner asks for a slice for one server."""

    @web.authenticated
    async def post(self):
        data = self.body()
        if not isinstance(data.get("user"), str) or not data["user"]:
            raise web.HTTPError(400, "Malformed grant request: no user.")
        # Read now, not from the cache: the account decides which private images are its own.
        user = await self.from_hub(self.hub.user_now(data["user"]))
        await self.refresh_quotas(user)
        image = self.images.admit_options(user, data)
        # Folders the user may not mount are refused before the request joins the queue (an
        # admin mounts what they own or were given, as anyone does).
        reader = Reader.of({**user, "admin": False})
        courses = await self.from_hub(course_folders.automounted(self.hub, reader.groups))
        keys = data.get("folders") or []
        mounts = await asyncio.to_thread(self.folders.mounts, reader, keys, courses)
        if self._new_request(data):
            # A job started through the hub's own API: its notebook is looked for, as a launch's
            # is (POST api/sessions). A launched or waiting record was checked when it was made.
            await self.check_notebook(Account.of(user), data.get("job"), mounts)
        record = await self.manager.submit(
            {k: v for k, v in data.items() if k != "folders"},
            groups=tuple(user.get("groups", [])),
        )
        self.launcher.claimed(record["id"])
        await asyncio.to_thread(self.folders.note_session_mounts, record["id"], mounts)
        # The reference comes from the catalog, so a private or re-pointed image starts as listed,
        # and from its pinned digest once it has one (Swarm mode: registry_images.py).
        reference = pinned_reference(image["image"], image["digest"]) if image else None
        # The session's own end-notice key goes to the spawner alone, for the session's
        # environment: the service then tells the session its end with nothing of its own.
        notice_key = self.end_notice_key(record["id"])
        self.write_json(
            {**record, "image_ref": reference, "mounts": mounts, "end_notice_key": notice_key},
            201,
        )

    def _new_request(self, data: dict) -> bool:
        """Whether this request makes a record: its key is unknown, and its server has no live
        record (a spawn issued again adopts the one it has)."""
        key, server = data.get("id"), str(data.get("server_name") or "")
        for session in self.manager.sessions(user=data["user"]):
            if session["id"] == key or session["server_name"] == server:
                return False
        return True


class GrantHandler(SpawnerHandler):
    """GET waits for a change (long-poll); DELETE releases."""

    query_arguments = {
        "wait": "number",
        "version": "text",
        "end_reason": "choice",
        "user": "text",
        "server_name": "text",
    }

    @web.authenticated
    async def get(self, session_id):
        wait = query_args.number(self.get_argument("wait", ""), "wait", 0, 0, MAX_WAIT)
        seen = self.get_argument("version", "")
        self.write_json(await self.session_answer(self.manager.wait(session_id, seen, wait)))

    @web.authenticated
    async def delete(self, session_id):
        code = self.get_argument("end_reason", None)
        if code is not None and not end_reasons.is_code(code):
            raise web.HTTPError(400, f"Unknown end_reason {code!r}.")
        await self.check_server_of(session_id)
        # The spawner may claim an idle end (the culler's); the service's own planned ends were
        # told to the manager before it stopped the server, and win there.
        claimed = code if code == end_reasons.IDLE else None
        idle, reason = self.automatic_ends.spawner_claim(claimed)
        released = self.manager.release(session_id, end_reason=idle or code, reason=reason)
        self.write_json(await self.session_answer(released))

    async def check_server_of(self, session_id: str) -> None:
        """A release that names its server (`?user=&server_name=`, as the spawner's do) ends
        only that server's record: a spawn handed another's key (a forged `request_key`) must not
        end the record it failed to claim."""
        user = self.get_argument("user", None)
        if user is None:
            return
        try:
            record = await self.manager.get(session_id)
        except KeyError:
            return  # remembered as given up by the release itself
        if (record["user"], record["server_name"]) != (user, self.get_argument("server_name", "")):
            raise web.HTTPError(409, "That grant belongs to another server; it stays as it is.")


class GrantActionHandler(SpawnerHandler):
    """POST api/grants/{id}/running confirms the start (a handler of its own: its route has one
    path argument more, which GET and DELETE do not take)."""

    @web.authenticated
    async def post(self, session_id, action):
        if action != "running":
            raise web.HTTPError(404, f"No action {action!r}.")
        self.write_json(await self.session_answer(self.manager.mark_running(session_id)))


def routes(prefix: str) -> list:
    return [
        (prefix + r"api/grants", GrantsHandler),
        (prefix + r"api/grants/([0-9a-f]+)", GrantHandler),
        (prefix + r"api/grants/([0-9a-f]+)/(\w+)", GrantActionHandler),
    ]
