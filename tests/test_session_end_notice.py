"""queue_service/session_end_notice.py: each running session is told its planned end, through a
real HTTP server standing in for the proxy (the whole path through a hub: test_session_status)."""

from __future__ import annotations

import json
import secrets
import time

import pytest
import requests
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from queue_service.session_end_notice import KEY_HEADER, EndNotice, end_notice_key, session_end_url

from .harness import in_kernel

OPTIONS = {"image": "python-3.11", "cpu": 0.5, "mem": "512M", "fgpu": 0}

END = {"at": "2026-11-26T18:00:00Z", "why": "lifetime", "text": "t", "warning": False}


def test_the_url_names_the_default_or_the_named_server_behind_the_base_url():
    assert session_end_url("http://p:8000/", "/", "ann", "") == (
        "http://p:8000/user/ann/fgpu/session-end"
    )
    assert session_end_url("http://p:8000", "/hub-base/", "a b", "gpu/1") == (
        "http://p:8000/hub-base/user/a%20b/gpu%2F1/fgpu/session-end"
    )


def key_of(session_id: str) -> str:
    return end_notice_key(b"s" * 32, session_id)


def test_a_session_s_key_is_its_own_and_stays_the_same_under_the_same_secret():
    assert end_notice_key(b"a" * 32, "s1") == end_notice_key(b"a" * 32, "s1")
    assert end_notice_key(b"a" * 32, "s1") != end_notice_key(b"a" * 32, "s2")
    assert end_notice_key(b"a" * 32, "s1") != end_notice_key(b"b" * 32, "s1")
    assert len(end_notice_key(b"a" * 32, "s1")) == 64


async def test_the_notice_carries_the_session_s_key_and_no_authorization(proxy):
    settings, url = proxy
    seen_headers = []
    settings["headers"] = seen_headers
    await EndNotice(url, "/", key_of).tell({"s1": ("ann", "", END)})
    (headers,) = seen_headers
    assert "Authorization" not in headers and "Cookie" not in headers
    assert headers[KEY_HEADER] == key_of("s1")


class Recorder(web.RequestHandler):
    def put(self, user):
        self.application.settings["seen"].append(
            (user, self.request.headers.get(KEY_HEADER), json.loads(self.request.body))
        )
        if "headers" in self.application.settings:
            self.application.settings["headers"].append(dict(self.request.headers))
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
    notice = EndNotice(url, "/", key_of, resend_after=300, clock=lambda: now[0])
    await notice.tell({"s1": ("ann", "", END)})
    await notice.tell({"s1": ("ann", "", END)})
    assert settings["seen"] == [("ann", key_of("s1"), {"ends": END})]

    await notice.tell({"s1": ("ann", "", None)})  # the end went away
    now[0] = 301.0
    await notice.tell({"s1": ("ann", "", None)})  # a restarted server forgets: told again
    bodies = [body for _, _, body in settings["seen"]]
    assert bodies == [{"ends": END}, {"ends": None}, {"ends": None}]


async def test_a_session_that_does_not_answer_is_tried_again_next_round(proxy):
    settings, url = proxy
    settings["status"] = 503
    notice = EndNotice(url, "/", key_of)
    await notice.tell({"s1": ("ann", "", END)})
    settings["status"] = 204
    await notice.tell({"s1": ("ann", "", END)})
    assert len(settings["seen"]) == 2


async def test_nothing_is_raised_when_the_proxy_is_away():
    notice = EndNotice("http://127.0.0.1:9", "/", key_of)
    await notice.tell({"s1": ("ann", "", END)})
    assert notice._told == {}


# -- on a real hub: nothing the notice carries opens anything else ---------------------------------

#: A student's own server configuration that writes down every request's headers: what a student
#: who wants the service's credentials would plant in their home (it persists across sessions).
HEADER_LOGGER = r"""
import json, os
def _write_down(handler):
    request = handler.request
    with open(os.path.expanduser("~/captured-requests.jsonl"), "a") as out:
        out.write(json.dumps({"method": request.method, "path": request.path,
                              "headers": dict(request.headers)}) + "\n")
c.ServerApp.tornado_settings = {"log_function": _write_down}
"""
PLANT = f"""
import os, pathlib
folder = pathlib.Path.home() / ".jupyter"
folder.mkdir(exist_ok=True)
(folder / "jupyter_server_config.py").write_text({HEADER_LOGGER!r})
print("planted")
"""
READ_CAPTURED = """
import pathlib
path = pathlib.Path.home() / "captured-requests.jsonl"
print(path.read_text() if path.exists() else "")
"""


def notices_captured(gpu_hub, username: str) -> list[dict]:
    text = in_kernel(gpu_hub, username, READ_CAPTURED)
    requests_seen = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return [
        r for r in requests_seen if r["path"].endswith("/fgpu/session-end") and r["method"] == "PUT"
    ]


def credentials_in(headers: dict) -> set[str]:
    """Every header value, and its last word (`token X` → X): whatever could be a credential."""
    values = set()
    for value in headers.values():
        values.update({value, value.split()[-1]} if value.split() else {value})
    return values


def opens_something(gpu_hub, credential: str, victim: str) -> list[str]:
    """What `credential`, presented as a hub token or raw, opens of the hub's user list and of
    another user's server."""
    opened = []
    for header in (f"token {credential}", f"Bearer {credential}", credential):
        headers = {"Authorization": header}
        for path in ("/hub/api/users", f"/hub/api/users/{victim}", f"/user/{victim}/api/status"):
            answer = requests.get(
                gpu_hub.url + path, headers=headers, allow_redirects=False, timeout=10
            )
            if answer.status_code == 200:
                opened.append(f"{path} with {header[:12]}…")
    return opened


@pytest.mark.docker
@pytest.mark.hub
def test_nothing_the_end_notice_carries_opens_the_user_list_or_another_server(gpu_hub, username):
    """A student plants a header logger in their home's server config, starts a session, and
    waits past a round of the notices: the notice reaches them (their status bar shows the end),
    and not one value of its headers opens the hub's user list or another student's server."""
    victim = f"victim-{secrets.token_hex(3)}"
    for user in (username, victim):
        response = gpu_hub.start_server(user, OPTIONS)
        assert response.status_code in (201, 202), response.text
        gpu_hub.wait_ready(user)
    assert "planted" in in_kernel(gpu_hub, username, PLANT)
    gpu_hub.stop_server(username)  # the planted config is read when the server starts
    response = gpu_hub.start_server(username, OPTIONS)
    assert response.status_code in (201, 202), response.text
    gpu_hub.wait_ready(username)

    deadline = time.monotonic() + 90
    while not (captured := notices_captured(gpu_hub, username)):
        assert time.monotonic() < deadline, "no end notice reached the session in 90 s"
        time.sleep(3)
    leaked = {
        credential: opened
        for notice in captured
        for credential in credentials_in(notice["headers"])
        if (opened := opens_something(gpu_hub, credential, victim))
    }
    assert leaked == {}, leaked

    owner = {"Authorization": f"token {gpu_hub.user_token(username)}"}
    told = requests.get(
        f"{gpu_hub.url}/user/{username}/fgpu/session-end", headers=owner, timeout=10
    ).json()["ends"]
    assert told and told["why"] == "idle", told  # the notice still does its work
    gpu_hub.stop_servers({(username, ""), (victim, "")})
