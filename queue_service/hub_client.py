"""The service's calls to the JupyterHub REST API, with its own hub-managed token.

It reads who a user is (admin flag, groups) and the groups' properties (quotas), it starts
and stops named servers for `POST sessions`, and it makes courses (courses.py): groups, their
members and properties, and the users a roster names. Reads are cached briefly: the scheduler consults
quotas on every pass, and an admin's edit in the panel may take a few seconds to count.
"""

from __future__ import annotations

import json
import os
import time
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from fgpu_shared import group_properties

CACHE_SECONDS = 10
#: How long a token's account is remembered: past HubAuth's own cache of tokens (300 s), after
#: which a deleted user's token is asked about again and refused by the hub itself.
TOKEN_SECONDS = 3600
MAX_TOKENS_KEPT = 10_000
#: Calls to the hub in flight at once. A launch of 20 sends 20 starts together, and each may take
#: the hub's slow-spawn timeout (10 s) to answer; tornado's shared client allows 10 at a time,
#: which held the rest of a launch back for as long.
MAX_CONCURRENT_CALLS = 64


class HubError(Exception):
    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.message = message
        self.status = status


#: JupyterHub's paginated form of a list: {"items": [...], "_pagination": {"next": ...}}.
PAGINATED = "application/jupyterhub-pagination+json"


class HubClient:
    def __init__(self, api_url: str | None = None, token: str | None = None):
        self.api_url = (api_url or os.environ["JUPYTERHUB_API_URL"]).rstrip("/")
        self.token = token or os.environ["JUPYTERHUB_API_TOKEN"]
        self._cache: dict[str, tuple[float, dict]] = {}
        #: token id -> (when first seen, the `created` of the account it was first seen with)
        self._token_accounts: dict[str, tuple[float, str | None]] = {}
        self._client: AsyncHTTPClient | None = None

    async def user(self, name: str) -> dict:
        return await self._cached(f"/users/{quote(name)}")

    async def user_of_token(self, name: str, token_id: str) -> dict:
        """The user a token (`token_id`: a digest of it) belongs to, cached per token: a user deleted and
        created again within the cache's time has new tokens, so never the old account's model.
        A token keeps the account it was first seen with (HubAuth may still accept a deleted
        user's token for minutes): once its name is another account's, it is refused (403)."""
        path = f"/users/{quote(name)}"
        model = await self._cached(path, key=f"{path}#{token_id}")
        now = time.monotonic()
        if len(self._token_accounts) > MAX_TOKENS_KEPT:
            self._token_accounts = {
                t: seen for t, seen in self._token_accounts.items() if now - seen[0] < TOKEN_SECONDS
            }
        first = self._token_accounts.setdefault(token_id, (now, model.get("created")))[1]
        if first != model.get("created"):
            raise HubError(f"The hub has no user {name!r} any more.", 403)
        return model

    async def token_owner(self, token: str) -> dict:
        """The hub's model of whoever holds `token` (`GET /user` with that token, never cached:
        a revoked token is refused at once), with the token's `scopes`; HubError (403) for a
        token the hub does not take."""
        return (await self._call("GET", "/user", token=token))[1]

    async def user_now(self, name: str) -> dict:
        """The user as the hub has it this moment (servers and their pending state included)."""
        return (await self._call("GET", f"/users/{quote(name)}"))[1]

    async def user_with_stopped_servers(self, name: str) -> dict:
        """The user as the hub has it this moment, its stopped named servers listed too."""
        return (await self._call("GET", f"/users/{quote(name)}?include_stopped_servers=1"))[1]

    async def account_created(self, name: str) -> str | None:
        """When the hub account now named `name` was created (ISO text, never cached: a user
        deleted and created again is another account), or None if there is no such user."""
        try:
            return (await self.user_now(name)).get("created")
        except HubError as e:
            if e.status == 404:
                return None
            raise

    async def active_servers(self, page: int = 200) -> set[tuple[str, str]]:
        """(user, server name) of every server the hub runs, starts or stops this moment."""
        return await self._servers_in("active", page)

    async def ready_server_starts(self, page: int = 200) -> dict[tuple[str, str], str | None]:
        """When (ISO text) each server that is up and running this moment was started, by (user,
        server name): with thousands of spawns waiting in the queue, a listing of these stays
        short."""
        return {
            key: server.get("started")
            async for key, server in self._servers_of_users_in("ready", page)
        }

    async def _servers_in(self, state: str, page: int) -> set[tuple[str, str]]:
        return {key async for key, _ in self._servers_of_users_in(state, page)}

    async def _servers_of_users_in(self, state: str, page: int):
        """((user, server name), server model) of the servers in `state` (a user's model lists
        all of its active servers, the ones still starting beside a ready one too)."""
        async for user in self._users_in(state, page):
            for name, server in (user.get("servers") or {}).items():
                if state != "ready" or (server or {}).get("ready"):
                    yield (user["name"], name), server or {}

    async def _users_in(self, state: str, page: int):
        """The users with a server in `state`, by the hub's own pagination: it pages over the
        active users and leaves out the ones not `ready` afterwards, so a short page is not the
        last one."""
        offset = 0
        while offset is not None:
            path = f"/users?state={state}&offset={offset}&limit={page}"
            answer = (await self._call("GET", path, accept=PAGINATED))[1]
            for user in answer["items"]:
                yield user
            offset = (answer["_pagination"].get("next") or {}).get("offset")

    async def server_activity(self, page: int = 200) -> dict[tuple[str, str], str | None]:
        """The hub's `last_activity` (ISO text) of every ready server, by (user, server name):
        the field jupyterhub-idle-culler decides on (a spawn still waiting is never idle)."""
        return {
            key: server.get("last_activity")
            async for key, server in self._servers_of_users_in("ready", page)
        }

    async def group(self, name: str) -> dict:
        """The hub's group model, its properties as the admin panel means them
        (fgpu_shared/group_properties.py)."""
        model = await self._cached(f"/groups/{quote(name)}")
        return {**model, "properties": group_properties.decoded(model.get("properties"))}

    async def group_now(self, name: str) -> dict:
        """The group as the hub has it this moment, its properties as stored (never cached)."""
        return (await self._call("GET", f"/groups/{quote(name)}"))[1]

    async def groups(self, page: int = 200) -> list[dict]:
        """Every group of the hub, read now, properties decoded as `group` decodes them."""
        models, offset = [], 0
        while offset is not None:
            path = f"/groups?offset={offset}&limit={page}"
            answer = (await self._call("GET", path, accept=PAGINATED))[1]
            models += [
                {**m, "properties": group_properties.decoded(m.get("properties"))}
                for m in answer["items"]
            ]
            offset = (answer["_pagination"].get("next") or {}).get("offset")
        return models

    async def create_group(self, name: str) -> None:
        await self._group_call("POST", name, "")

    async def set_group_properties(self, name: str, properties: dict) -> None:
        await self._group_call("PUT", name, "/properties", properties)

    async def add_group_users(self, name: str, users) -> None:
        if users:
            try:
                await self._group_call("POST", name, "/users", {"users": list(users)})
            finally:
                self._forget_users(users)

    async def remove_group_users(self, name: str, users) -> None:
        if users:
            try:
                await self._group_call("DELETE", name, "/users", {"users": list(users)})
            finally:
                self._forget_users(users)

    def _forget_users(self, users) -> None:
        """Forget these users' cached models (per token too): their groups changed, and one
        dropped from a course loses its folder and allowance now, not when the cache ages."""
        paths = {f"/users/{quote(user)}" for user in users}
        self._cache = {k: hit for k, hit in self._cache.items() if k.split("#")[0] not in paths}

    async def create_users(self, names) -> None:
        """Create those of `names` the hub does not have yet (it skips the others)."""
        try:
            await self._call("POST", "/users", {"usernames": list(names)})
        except HubError as e:
            if e.status != 409:  # 409: every one of them exists already
                raise

    async def _group_call(self, method: str, name: str, tail: str, body=None) -> None:
        """A change to a group; its cached model is forgotten, so that the next read (a
        course's instructors and members) sees the change."""
        path = f"/groups/{quote(name)}"
        try:
            await self._call(method, path + tail, body)
        finally:
            self._cache.pop(path, None)

    async def start_server(self, user: str, server_name: str, options: dict) -> int:
        path = f"/users/{quote(user)}/servers/{quote(server_name)}"
        return (await self._call("POST", path, options))[0]

    async def stop_server(self, user: str, server_name: str, remove: bool = False) -> int:
        """Stop a server; `remove` also deletes the named server from the hub's list."""
        path = f"/users/{quote(user)}/servers/{quote(server_name)}"
        return (await self._call("DELETE", path, {"remove": True} if remove else None))[0]

    async def report_activity(self, user: str, server_name: str, when: str) -> None:
        """Tell the hub that `user`'s server was in use at `when` (ISO 8601, UTC), as the
        server's own reports do: the idle culler reads it. The hub keeps the later time."""
        at = {"last_activity": when}
        await self._call(
            "POST", f"/users/{quote(user)}/activity", {**at, "servers": {server_name: at}}
        )

    async def share_server(self, owner: str, server_name: str, user: str) -> None:
        """Let `user` open `owner`'s server (JupyterHub's shares: `access:servers` on that one
        server, nothing else of the owner's)."""
        await self._call("POST", f"/shares/{quote(owner)}/{quote(server_name)}", {"user": user})

    async def revoke_share(self, owner: str, server_name: str, user: str) -> None:
        await self._call("PATCH", f"/shares/{quote(owner)}/{quote(server_name)}", {"user": user})

    async def shared_with(self, user: str) -> list[tuple[str, str]]:
        """The servers shared with `user` itself (not through a group), as (owner, server name)."""
        answer = (await self._call("GET", f"/users/{quote(user)}/shared", accept=PAGINATED))[1]
        return [
            (share["server"]["user"]["name"], share["server"]["name"])
            for share in answer["items"]
            if share["kind"] == "user"
        ]

    def _http(self) -> AsyncHTTPClient:
        """A client of our own (made in the event loop on first use), apart from tornado's
        shared one."""
        if self._client is None:
            self._client = AsyncHTTPClient(force_instance=True, max_clients=MAX_CONCURRENT_CALLS)
        return self._client

    async def _cached(self, path: str, key: str = "") -> dict:
        key = key or path
        hit = self._cache.get(key)
        if hit and time.monotonic() - hit[0] < CACHE_SECONDS:
            return hit[1]
        _, model = await self._call("GET", path)
        now = time.monotonic()
        if len(self._cache) > MAX_TOKENS_KEPT:  # one entry per token: drop the stale ones
            self._cache = {k: hit for k, hit in self._cache.items() if now - hit[0] < CACHE_SECONDS}
        self._cache[key] = (now, model)
        return model

    async def _call(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        accept: str = "application/json",
        token: str = "",
    ) -> tuple[int, dict]:
        request = HTTPRequest(
            self.api_url + path,
            method=method,
            headers={"Authorization": f"token {token or self.token}", "Accept": accept},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
            request_timeout=30,
        )
        try:
            response = await self._http().fetch(request)
        except HTTPClientError as e:
            raise HubError(_message_of(e), e.code) from None
        return response.code, json.loads(response.body) if response.body else {}


async def server_pending(hub, user: str, server_name: str) -> str | None:
    """What the hub is doing with a server right now: "spawn", "stop", or None (nothing, or a
    hub that does not answer: its spawners run in its process, so it is doing nothing)."""
    try:
        servers = (await hub.user_now(user)).get("servers") or {}
    except (HubError, OSError):
        return None
    return (servers.get(server_name) or {}).get("pending")


def _message_of(error: HTTPClientError) -> str:
    try:
        return json.loads(error.response.body)["message"]
    except (AttributeError, TypeError, ValueError, KeyError):
        return f"the hub answered {error.code}"
