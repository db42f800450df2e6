"""The service's calls to the JupyterHub REST API, with its own hub-managed token.

It reads who a user is (admin flag, groups) and the groups' properties (quotas), and it starts
and stops named servers for `POST sessions`. Reads are cached briefly: the scheduler consults
quotas on every pass, and an admin's edit in the panel may take a few seconds to count.
"""

from __future__ import annotations

import json
import os
import time
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

CACHE_SECONDS = 10
#: Calls to the hub in flight at once. A launch of 20 sends 20 starts together, and each may take
#: the hub's slow-spawn timeout (10 s) to answer; tornado's shared client allows 10 at a time,
#: which held the rest of a launch back for as long.
MAX_CONCURRENT_CALLS = 64


class HubError(Exception):
    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.message = message
        self.status = status


class HubClient:
    def __init__(self, api_url: str | None = None, token: str | None = None):
        self.api_url = (api_url or os.environ["JUPYTERHUB_API_URL"]).rstrip("/")
        self.token = token or os.environ["JUPYTERHUB_API_TOKEN"]
        self._cache: dict[str, tuple[float, dict]] = {}
        self._client: AsyncHTTPClient | None = None

    async def user(self, name: str) -> dict:
        return await self._cached(f"/users/{quote(name)}")

    async def user_now(self, name: str) -> dict:
        """The user as the hub has it this moment (servers and their pending state included)."""
        return (await self._call("GET", f"/users/{quote(name)}"))[1]

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
        servers, offset = set(), 0
        while True:
            path = f"/users?state=active&offset={offset}&limit={page}"
            users = (await self._call("GET", path))[1]
            servers |= {(u["name"], name) for u in users for name in u.get("servers") or {}}
            if len(users) < page:
                return servers
            offset += len(users)

    async def server_activity(self, page: int = 200) -> dict[tuple[str, str], str | None]:
        """The hub's `last_activity` (ISO text) of every active server, by (user, server name):
        the field jupyterhub-idle-culler decides on."""
        servers, offset = {}, 0
        while True:
            path = f"/users?state=active&offset={offset}&limit={page}"
            users = (await self._call("GET", path))[1]
            for user in users:
                for name, server in (user.get("servers") or {}).items():
                    servers[(user["name"], name)] = (server or {}).get("last_activity")
            if len(users) < page:
                return servers
            offset += len(users)

    async def group(self, name: str) -> dict:
        return await self._cached(f"/groups/{quote(name)}")

    async def start_server(self, user: str, server_name: str, options: dict) -> int:
        path = f"/users/{quote(user)}/servers/{quote(server_name)}"
        return (await self._call("POST", path, options))[0]

    async def stop_server(self, user: str, server_name: str, remove: bool = False) -> int:
        """Stop a server; `remove` also deletes the named server from the hub's list."""
        path = f"/users/{quote(user)}/servers/{quote(server_name)}"
        return (await self._call("DELETE", path, {"remove": True} if remove else None))[0]

    def _http(self) -> AsyncHTTPClient:
        """A client of our own (made in the event loop on first use), apart from tornado's
        shared one."""
        if self._client is None:
            self._client = AsyncHTTPClient(force_instance=True, max_clients=MAX_CONCURRENT_CALLS)
        return self._client

    async def _cached(self, path: str) -> dict:
        hit = self._cache.get(path)
        if hit and time.monotonic() - hit[0] < CACHE_SECONDS:
            return hit[1]
        _, model = await self._call("GET", path)
        self._cache[path] = (time.monotonic(), model)
        return model

    async def _call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        request = HTTPRequest(
            self.api_url + path,
            method=method,
            headers={"Authorization": f"token {self.token}"},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
            request_timeout=30,
        )
        try:
            response = await self._http().fetch(request)
        except HTTPClientError as e:
            raise HubError(_message_of(e), e.code) from None
        return response.code, json.loads(response.body) if response.body else {}


def _message_of(error: HTTPClientError) -> str:
    try:
        return json.loads(error.response.body)["message"]
    except (AttributeError, TypeError, ValueError, KeyError):
        return f"the hub answered {error.code}"
