"""The queue service's REST API (DESIGN.md, contract 4), under `/services/queue/api/`.

People authenticate with HubOAuth (cookie or token). The spawner's own endpoints, `api/grants`,
answer only to the hub service whose token the spawner holds. Every error is JSON with a message
and the right 4xx code.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets

from jupyterhub.services.auth import HubOAuthenticated, UserNotAllowed
from tornado import web

from .hub_client import HubError
from .images import ImageError
from .queue import Refused


class APIHandler(HubOAuthenticated, web.RequestHandler):
    @property
    def manager(self):
        return self.settings["manager"]

    @property
    def hub(self):
        return self.settings["hub_client"]

    async def prepare(self):
        # Identify the caller on the event loop. HubAuth's synchronous path (tornado's
        # get_current_user) hands every lookup to a helper thread and blocks on it, even when its
        # cache answers: under polling that hand-off cost a tenth of the service's time (P4).
        try:
            model = await self.hub_auth.get_user(self, sync=False)
            self._hub_auth_user_cache = self.check_hub_user(model) if model else None
        except UserNotAllowed as e:
            self._hub_auth_user_cache = None
            kind, name = e.model.get("kind", "user"), e.model.get("name")
            raise web.HTTPError(403, f"The {kind} {name} may not use this service.") from None

    def check_xsrf_cookie(self):
        # Token-authenticated API calls carry no cookie to forge; browser calls come with the
        # hub's login cookie and same-origin fetches.
        return

    def get_login_url(self):
        raise web.HTTPError(401, "Log in to the hub first.")

    def body(self) -> dict:
        try:
            data = json.loads(self.request.body or b"{}")
        except ValueError:
            raise web.HTTPError(400, "The request body is not valid JSON.") from None
        if not isinstance(data, dict):
            raise web.HTTPError(400, "The request body must be a JSON object.")
        return data

    def write_json(self, data, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, default=str))

    def write_error(self, status_code, **kwargs):
        message = self._reason
        exc = kwargs.get("exc_info", (None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "message": message}))

    async def person(self) -> dict:
        """The calling user, with `admin` and `groups` read from the hub."""
        identity = self.get_current_user()
        if not identity:
            raise web.HTTPError(401, "Log in to the hub first.")
        if identity.get("kind") != "user":
            raise web.HTTPError(403, "Only users have sessions.")
        return await self.from_hub(self.hub.user(identity["name"]))

    async def from_hub(self, awaitable):
        """Await a call to the hub; its refusal keeps its 4xx, and a hub that fails or is away
        answers 502, with the hub's message either way."""
        try:
            return await awaitable
        except HubError as e:
            raise web.HTTPError(e.status if e.status < 500 else 502, e.message) from None

    async def refresh_quotas(self, user: dict) -> None:
        await self.from_hub(self.settings["quotas"].refresh(user, self.hub))

    def require_spawner(self) -> None:
        identity = self.get_current_user()
        if not identity:
            raise web.HTTPError(401, "A token is required.")
        if (
            identity.get("kind") != "service"
            or identity.get("name") != self.settings["spawner_service"]
        ):
            raise web.HTTPError(403, "Only the hub's spawner may ask for grants.")


class GrantsHandler(APIHandler):
    """POST api/grants: the spawner asks for a slice for one server."""

    @web.authenticated
    async def post(self):
        self.require_spawner()
        data = self.body()
        if not isinstance(data.get("user"), str) or not data["user"]:
            raise web.HTTPError(400, "Malformed grant request: no user.")
        # Read now, not from the cache: the account decides which private images are its own.
        user = await self.from_hub(self.hub.user_now(data["user"]))
        await self.refresh_quotas(user)
        try:
            image = self.settings["images"].admit_options(user, data)
            record = await self.manager.submit(data, groups=tuple(user.get("groups", [])))
        except (ImageError, Refused) as e:
            raise web.HTTPError(e.status, e.message) from None
        # The reference comes from the catalog, so a private or re-pointed image starts as listed.
        self.write_json({**record, "image_ref": image["image"] if image else None}, 201)


class GrantHandler(APIHandler):
    """GET waits for a change (long-poll); DELETE releases; POST .../running confirms the start."""

    @web.authenticated
    async def get(self, session_id):
        self.require_spawner()
        try:
            wait = float(self.get_argument("wait", "0") or 0)
        except ValueError:
            wait = math.nan
        if not 0 <= wait <= 60:  # also false for nan
            raise web.HTTPError(400, "wait must be a number of seconds from 0 to 60.")
        seen = self.get_argument("version", "")
        self.write_json(await self._queue_answer(self.manager.wait(session_id, seen, wait)))

    @web.authenticated
    async def delete(self, session_id):
        self.require_spawner()
        self.write_json(await self._queue_answer(self.manager.release(session_id)))

    @web.authenticated
    async def post(self, session_id, action):
        self.require_spawner()
        if action != "running":
            raise web.HTTPError(404, f"No action {action!r}.")
        self.write_json(await self._queue_answer(self.manager.mark_running(session_id)))

    async def _queue_answer(self, awaitable):
        """The queue's answer; an unknown session is a 404, and a refusal keeps its own code."""
        try:
            return await awaitable
        except KeyError:
            raise web.HTTPError(404, "No such session.") from None
        except Refused as e:
            raise web.HTTPError(e.status, e.message) from None


class SessionsHandler(APIHandler):
    """GET your sessions (everyone's for admins); POST launches `count` named servers."""

    @web.authenticated
    async def get(self):
        person = await self.person()
        user = (
            None if person.get("admin") and self.get_argument("all", "1") != "0" else person["name"]
        )
        self.write_json({"sessions": self.manager.sessions(user=user)})

    @web.authenticated
    async def post(self):
        person = await self.person()
        data = self.body()
        try:
            self.settings["images"].admit_options(person, data)
        except ImageError as e:
            raise web.HTTPError(e.status, e.message) from None
        count = data.pop("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 20:
            raise web.HTTPError(400, "count must be a whole number from 1 to 20.")
        servers, names = [], []
        try:
            for _ in range(count):
                names.append(f"s-{secrets.token_hex(3)}")
                # A refusal carries the hub's own validation message (FGPUSpawner's).
                status = await self.from_hub(self.hub.start_server(person["name"], names[-1], data))
                servers.append({"server_name": names[-1], "status": status})
        except web.HTTPError:
            # All or nothing: a launch refused part-way (a pending quota, say) stops and removes
            # what it started, and the refused server's entry too, so nothing is left behind.
            for name in names:
                with contextlib.suppress(HubError):
                    await self.hub.stop_server(person["name"], name, remove=True)
            raise
        self.write_json({"servers": servers}, 201)


class SessionHandler(APIHandler):
    """DELETE stops a running session or cancels a pending one."""

    @web.authenticated
    async def delete(self, session_id):
        person = await self.person()
        try:
            record = self.manager.get(session_id)
        except KeyError:
            raise web.HTTPError(404, "No such session.") from None
        if record["user"] != person["name"] and not person.get("admin"):
            # The same answer as for a missing session: others' session ids are not revealed.
            raise web.HTTPError(404, "No such session.")
        # A granted session is stopped through the hub: its spawner removes the container and
        # only then gives the slice back, so the next grant never meets a container still holding
        # it. Releasing here afterwards ends what the spawner left (a server the hub had already
        # stopped), and is a no-op otherwise. A pending one is cancelled here; its waiting spawn
        # then fails by itself.
        granted = ("SCHEDULED", "RUNNING")
        if record["status"] in granted and await self._hub_stops(record) == 202:
            self.write_json(self.manager.get(session_id))  # still stopping; the spawner releases
            return
        released = await self.manager.release(session_id)
        if released["released_from"] in granted and record["status"] not in granted:
            await self._hub_stops(record)  # granted since it was read: interrupt that spawn
        self.write_json(released)

    async def _hub_stops(self, record: dict) -> int | None:
        """Stop the session's server through the hub; its status, or None if the hub has none."""
        try:
            return await self.hub.stop_server(record["user"], record["server_name"])
        except HubError as e:
            if e.status != 404:
                raise web.HTTPError(502, e.message) from None
            return None


class ResourcesHandler(APIHandler):
    """GET your allocated and allocatable slots; admins also see nodes and GPUs.

    The JSON (keys kept stable: the pages' indicators read them; slots are {cpu, mem, fgpu}, cpu in
    cores, mem in bytes, fgpu in units):
    - `allocated`, `allocatable`, `capacity`: slots over the whole cluster;
    - `resource_groups`: {name: {allocated, allocatable, capacity, allowed}}, the same per group;
    - `user`, `units_per_gpu`, `sessions` (how many of yours hold a slice);
    - admins only, `nodes`: [{name, resource_group, cpu_total, cpu_free, mem_total, mem_free,
      gpus: [{uuid, index, fraction_free, fgpu_free,
              slices: [{session_id, user, server_name, fraction, fgpu}]}]}].
    """

    @web.authenticated
    async def get(self):
        person = await self.person()
        groups = tuple(person.get("groups", []))
        await self.refresh_quotas(person)
        self.write_json(
            await self.manager.resources(person["name"], groups, admin=bool(person.get("admin")))
        )
