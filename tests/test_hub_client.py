"""The service's client of the hub's REST API (queue_service/hub_client.py), at its boundary: a
small HTTP server that pages `GET /users?state=` as JupyterHub 6 does (over the active users,
leaving out the ones not ready afterwards), on a real socket."""

from __future__ import annotations

import json

import pytest
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from queue_service.hub_client import PAGINATED, HubClient

# (name, server, ready): active users in the hub's order; a spawn waiting in the queue is active.
USERS = [
    ("ann", "s-1", False),
    ("bob", "s-1", False),
    ("cat", "s-1", False),
    ("dan", "s-2", True),
    ("eve", "s-1", False),
]

ACTIVITY = "2026-11-24T06:00:00.000000Z"
STARTED = "2026-11-24T05:00:00.000000Z"


class Users(web.RequestHandler):
    """`GET /users` as JupyterHub pages it: offset and limit apply before the `ready` filter."""

    def get(self):
        assert self.request.headers["Authorization"] == "token secret"
        state = self.get_argument("state")
        offset, limit = int(self.get_argument("offset")), int(self.get_argument("limit"))
        page = USERS[offset : offset + limit]
        items = [
            {
                "name": name,
                "servers": {
                    server: {"ready": ready, "last_activity": ACTIVITY, "started": STARTED}
                },
            }
            for name, server, ready in page
            if state == "active" or ready
        ]
        if self.request.headers.get("Accept") != PAGINATED:
            self.write(json.dumps(items))
            return
        following = offset + limit
        next_page = {"offset": following, "limit": limit} if following < len(USERS) else None
        pagination = {"offset": offset, "limit": limit, "total": len(USERS), "next": next_page}
        self.write(json.dumps({"items": items, "_pagination": pagination}))


@pytest.fixture
async def hub_api():
    sock, port = bind_unused_port()
    server = HTTPServer(web.Application([(r"/hub/api/users", Users)]))
    server.add_sockets([sock])
    yield f"http://127.0.0.1:{port}/hub/api"
    server.stop()


async def test_the_ready_servers_past_a_page_of_waiting_spawns_are_all_listed(hub_api):
    """The first pages hold only waiting spawns, so they come back short or empty: the listing
    goes on by the hub's own `next`, and finds the ready server on a later page."""
    client = HubClient(hub_api, "secret")
    assert set(await client.ready_server_starts(page=2)) == {("dan", "s-2")}


async def test_the_active_servers_are_all_listed_page_by_page(hub_api):
    client = HubClient(hub_api, "secret")
    assert await client.active_servers(page=2) == {(name, server) for name, server, _ in USERS}


async def test_the_activity_of_ready_servers_alone_is_read(hub_api):
    """The idle rules read the activity of running sessions: the waiting spawns before them are
    paged past, never counted."""
    client = HubClient(hub_api, "secret")
    assert await client.server_activity(page=2) == {("dan", "s-2"): ACTIVITY}


async def test_the_start_times_of_ready_servers_alone_are_read(hub_api):
    """The reconciler's look for ghosts (servers with nothing behind them) reads when each ready
    server started; the waiting spawns are paged past."""
    client = HubClient(hub_api, "secret")
    assert await client.ready_server_starts(page=2) == {("dan", "s-2"): STARTED}
