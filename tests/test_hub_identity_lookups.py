"""queue_service/hub_identity_lookups.py: requests that need the same token's owner at once send
the hub one question, against a real HTTP server standing in for the hub's `GET /hub/api/user`."""

from __future__ import annotations

import asyncio

import pytest
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from queue_service.hub_identity_lookups import SharedLookupHubOAuth


class HubUser(web.RequestHandler):
    """Answers who a token is, slowly (as a busy hub), counting the questions per token."""

    def initialize(self, asked: dict, release: asyncio.Event):
        self.asked, self.release = asked, release

    async def get(self):
        token = self.request.headers["Authorization"].split()[1]
        self.asked[token] = self.asked.get(token, 0) + 1
        await self.release.wait()
        if token == "refused":
            raise web.HTTPError(500)
        self.write({"kind": "user", "name": f"owner-of-{token}", "scopes": []})


@pytest.fixture
async def stand_in_hub():
    asked, release = {}, asyncio.Event()
    sock, port = bind_unused_port()
    server = HTTPServer(
        web.Application([(r"/hub/api/user", HubUser, {"asked": asked, "release": release})])
    )
    server.add_sockets([sock])
    auth = SharedLookupHubOAuth(
        api_url=f"http://127.0.0.1:{port}/hub/api", api_token="service-token", cache_max_age=300
    )
    yield auth, asked, release
    server.stop()


async def test_fifty_requests_with_one_token_ask_the_hub_once(stand_in_hub):
    auth, asked, release = stand_in_hub
    lookups = [asyncio.ensure_future(auth.user_for_token("t1", sync=False)) for _ in range(50)]
    other = asyncio.ensure_future(auth.user_for_token("t2", sync=False))
    await asyncio.sleep(0.2)
    release.set()
    answers = await asyncio.gather(*lookups, other)
    assert asked == {"t1": 1, "t2": 1}
    assert {a["name"] for a in answers[:50]} == {"owner-of-t1"} and answers[50][
        "name"
    ] == "owner-of-t2"
    # Answered from the cache afterwards; nothing left waiting.
    assert (await auth.user_for_token("t1", sync=False))["name"] == "owner-of-t1"
    assert asked == {"t1": 1, "t2": 1} and not auth._asking


async def test_a_failed_lookup_fails_each_waiter_and_the_next_asks_again(stand_in_hub):
    auth, asked, release = stand_in_hub
    lookups = [asyncio.ensure_future(auth.user_for_token("refused", sync=False)) for _ in range(5)]
    await asyncio.sleep(0.2)
    release.set()
    results = await asyncio.gather(*lookups, return_exceptions=True)
    assert all(isinstance(r, web.HTTPError) for r in results) and asked == {"refused": 1}
    with pytest.raises(web.HTTPError):
        await auth.user_for_token("refused", sync=False)
    assert asked == {"refused": 2}


async def test_one_waiter_that_goes_away_leaves_the_lookup_to_the_others(stand_in_hub):
    auth, asked, release = stand_in_hub
    first = asyncio.ensure_future(auth.user_for_token("t3", sync=False))
    second = asyncio.ensure_future(auth.user_for_token("t3", sync=False))
    await asyncio.sleep(0.2)
    first.cancel()
    release.set()
    assert (await second)["name"] == "owner-of-t3"
    assert asked == {"t3": 1}
