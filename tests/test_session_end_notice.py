"""queue_service/session_end_notice.py: each running session is told its planned end, through a
real HTTP server standing in for the proxy (the whole path through a hub: test_session_status)."""

from __future__ import annotations

import json

import pytest
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from queue_service.session_end_notice import EndNotice, session_end_url

END = {"at": "2026-11-26T18:00:00Z", "why": "lifetime", "text": "t", "warning": False}


def test_the_url_names_the_default_or_the_named_server_behind_the_base_url():
    assert session_end_url("http://p:8000/", "/", "ann", "") == (
        "http://p:8000/user/ann/fgpu/session-end"
    )
    assert session_end_url("http://p:8000", "/hub-base/", "a b", "gpu/1") == (
        "http://p:8000/hub-base/user/a%20b/gpu%2F1/fgpu/session-end"
    )


class Recorder(web.RequestHandler):
    def put(self, user):
        self.application.settings["seen"].append(
            (user, self.request.headers["Authorization"], json.loads(self.request.body))
        )
        self.set_status(self.application.settings["status"])


@pytest.fixture
async def proxy():
    sock, port = bind_unused_port()
    app = web.Application([(r"/user/([^/]+)/fgpu/session-end", Recorder)], seen=[], status=204)
    server = HTTPServer(app)
    server.add_sockets([sock])
    yield app.settings, f"http://127.0.0.1:{port}"
    server.stop()


async def test_a_session_is_told_once_per_change_and_again_after_a_while(proxy):
    settings, url = proxy
    now = [0.0]
    notice = EndNotice(url, "/", "secret", resend_after=300, clock=lambda: now[0])
    await notice.tell({"s1": ("ann", "", END)})
    await notice.tell({"s1": ("ann", "", END)})
    assert settings["seen"] == [("ann", "token secret", {"ends": END})]

    await notice.tell({"s1": ("ann", "", None)})  # the end went away
    now[0] = 301.0
    await notice.tell({"s1": ("ann", "", None)})  # a restarted server forgets: told again
    bodies = [body for _, _, body in settings["seen"]]
    assert bodies == [{"ends": END}, {"ends": None}, {"ends": None}]


async def test_a_session_that_does_not_answer_is_tried_again_next_round(proxy):
    settings, url = proxy
    settings["status"] = 503
    notice = EndNotice(url, "/", "secret")
    await notice.tell({"s1": ("ann", "", END)})
    settings["status"] = 204
    await notice.tell({"s1": ("ann", "", END)})
    assert len(settings["seen"]) == 2


async def test_nothing_is_raised_when_the_proxy_is_away():
    notice = EndNotice("http://127.0.0.1:9", "/", "secret")
    await notice.tell({"s1": ("ann", "", END)})
    assert notice._told == {}
