"""The service's one door (handlers/base.py), tried as an attacker would: cross-site requests, narrow
tokens, filtered scopes, huge bodies and wrong content types, against the real hub and service.

Cross-site requests, admin powers that follow the token's scopes, bounded work per request, the
cookie secret, a launch that answers at once and whose request keys cannot be turned against
another's record, and one handler layer.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import sqlite3
import stat
import time

import pytest
import requests

from .harness import QueueUser, containers_with, logged_in, refused_start, running_hub
from .test_image_api import Person
from .test_queue_service import kill_queue_service

pytestmark = [pytest.mark.docker, pytest.mark.hub]
SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "256M"}
EVIL = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}


class Browser:
    """A logged-in browser's cookies for the service, as the hub's OAuth dance leaves them, and
    the XSRF token its pages carry."""

    def __init__(self, hub, name: str):
        self.hub, self.name = hub, name
        self.http = logged_in(hub, name)
        page = self.http.get(f"{hub.url}/services/queue/sessions", timeout=60)
        assert page.status_code == 200, page.text
        config = re.search(r'id="fgpu-page-config">(.*?)</script>', page.text, re.S)
        self.xsrf = json.loads(config.group(1))["xsrf"]

    def call(self, method: str, path: str, headers=None, **kwargs) -> requests.Response:
        url = f"{self.hub.url}/services/queue/api/{path}"
        return self.http.request(method, url, headers=headers or {}, timeout=120, **kwargs)

    def own_page_call(self, method: str, path: str, **kwargs) -> requests.Response:
        """As the service's own pages call: same origin, the token in X-XSRFToken."""
        headers = {
            "X-XSRFToken": self.xsrf,
            "Sec-Fetch-Site": "same-origin",
            "Sec-Fetch-Mode": "cors",
        }
        return self.call(method, path, headers=headers, **kwargs)


@pytest.fixture
def victim(hub, username):
    return Browser(hub, username)


def assert_nothing_started(hub, name: str) -> None:
    admin = QueueUser(hub, "admin")
    assert [s for s in admin.sessions() if s["user"] == name] == []
    assert containers_with({"fgpu.user": name}) == []


# -- 1. Cross-site requests ------------------------------------------------------------------


def test_a_cross_site_form_cannot_launch_sessions_with_the_victims_cookie(hub, victim):
    # What a plain HTML form on another site sends (Firefox and Safari add the cookie).
    form = {**EVIL, "Sec-Fetch-Mode": "navigate", "Content-Type": "text/plain"}
    body = json.dumps({**SESSION, "count": 20})
    response = victim.call("POST", "sessions", headers=form, data=body)
    assert response.status_code == 403, response.text
    assert "xsrf" in response.json()["message"].lower()
    # A script on another site cannot read the token either; a JSON body does not help it.
    response = victim.call(
        "POST", "sessions", headers={**EVIL, "Sec-Fetch-Mode": "cors"}, json=SESSION
    )
    assert response.status_code == 403, response.text
    # Nor does a forged token.
    forged = {**EVIL, "X-XSRFToken": "forged"}
    assert victim.call("POST", "sessions", headers=forged, json=SESSION).status_code == 403
    time.sleep(1)  # a start the service had let through would have its record by now
    assert_nothing_started(hub, victim.name)


def test_the_services_own_pages_still_change_things_with_the_token(hub, victim):
    response = victim.own_page_call("POST", "sessions", json={**SESSION, "count": 1})
    assert response.status_code == 201, response.text
    (server,) = response.json()["servers"]
    session_id = server["session"]["id"]
    response = victim.own_page_call("DELETE", f"sessions/{session_id}")
    assert response.status_code == 200, response.text


def test_a_cross_site_request_cannot_stop_a_session_or_edit_the_catalog(hub, username):
    owner = QueueUser(hub, username)
    response = owner.call("POST", "sessions", json={**SESSION, "count": 1})
    assert response.status_code == 201, response.text
    session_id = response.json()["servers"][0]["session"]["id"]
    browser = Browser(hub, username)
    assert browser.call("DELETE", f"sessions/{session_id}", headers=EVIL).status_code == 403
    assert session_id in {s["id"] for s in owner.sessions()}

    teacher = Person(hub, f"teacher-{secrets.token_hex(3)}", groups=("instructors",))
    teacher_browser = Browser(hub, teacher.name)
    change = {**EVIL, "Content-Type": "text/plain"}
    response = teacher_browser.call(
        "PATCH", "images/python-3.11", headers=change, data='{"hidden": true}'
    )
    assert response.status_code == 403, response.text
    assert owner.call("GET", "images/python-3.11").json()["hidden"] is False


def test_a_json_body_must_say_it_is_json(hub, username):
    student = QueueUser(hub, username)
    response = student.call(
        "POST", "sessions", data=json.dumps(SESSION), headers={"Content-Type": "text/plain"}
    )
    assert response.status_code == 415, response.text
    assert "application/json" in response.json()["message"]
    assert_nothing_started(hub, username)


# -- 4. Admin powers follow the token's scopes ----------------------------------------------


def narrow_admin_token(hub, scopes: list[str]) -> requests.Session:
    hub.create_user("admin")
    response = hub.request("POST", "users/admin/tokens", json={"scopes": scopes, "note": "narrow"})
    assert response.status_code == 201, response.text
    http = requests.Session()
    http.headers["Authorization"] = f"token {response.json()['token']}"
    return http


def test_an_admins_narrow_token_has_no_admin_powers(hub, username):
    student = QueueUser(hub, username)
    response = student.call("POST", "sessions", json={**SESSION, "count": 1})
    assert response.status_code == 201, response.text
    session_id = response.json()["servers"][0]["session"]["id"]
    api = f"{hub.url}/services/queue/api"

    # The admin's full token sees the student's session: the narrow one below could.
    full = QueueUser(hub, "admin")
    assert session_id in {s["id"] for s in full.sessions()}

    for scopes in (
        ["access:services!service=queue"],
        ["access:services!service=queue", "admin:servers!user=nobody"],
    ):
        narrow = narrow_admin_token(hub, scopes)
        sessions = narrow.get(f"{api}/sessions", timeout=60).json()["sessions"]
        assert session_id not in {s["id"] for s in sessions}
        assert narrow.delete(f"{api}/sessions/{session_id}", timeout=60).status_code == 404
        image = narrow.post(f"{api}/sessions/{session_id}/image", json={"tag": "t1"}, timeout=60)
        assert image.status_code == 403, image.text
        assert "nodes" not in narrow.get(f"{api}/resources", timeout=60).json()
        for path in ("cluster", "cluster/quotas", "metrics"):
            response = narrow.get(f"{hub.url}/services/queue/{path}", timeout=60)
            assert response.status_code == 403, (path, response.text)
    assert session_id in {s["id"] for s in student.sessions()}


def test_a_filtered_catalog_grant_is_refused_not_taken_as_global(hub):
    teacher = Person(hub, f"teacher-{secrets.token_hex(3)}", groups=("instructors",))
    response = hub.request(
        "POST",
        f"users/{teacher.name}/tokens",
        json={"scopes": ["access:services!service=queue", "custom:images:manage!group=course-a"]},
    )
    assert response.status_code == 201, response.text
    http = requests.Session()
    http.headers["Authorization"] = f"token {response.json()['token']}"
    url = f"{hub.url}/services/queue/api/images/python-3.11"
    response = http.patch(url, json={"description": "changed"}, timeout=60)
    assert response.status_code == 403, response.text
    assert "group" in response.json()["message"]
    assert teacher.call("GET", "images/python-3.11").json()["description"] != "changed"


# A site's file loads the shipped config and adds its roles: the check sees the roles the hub takes.
FILTERED_CATALOG_ROLE = """
c.JupyterHub.load_roles.append(
    {"name": "course-a-instructors", "scopes": ["custom:images:manage!group=course-a"],
     "groups": ["instructors"]}
)
"""


def test_a_role_with_a_filtered_catalog_scope_stops_the_hub_at_start(tmp_path):
    message = refused_start(tmp_path / "refused", FILTERED_CATALOG_ROLE)
    assert "Refusing to start: role 'course-a-instructors' grants" in message
    assert "'custom:images:manage!group=course-a'" in message
    assert "does not limit catalog rights to a group" in message
    assert "Traceback" not in message


def test_a_role_with_a_filtered_admin_scope_starts_and_is_warned_about(tmp_path):
    """admin:servers!group=x has uses in the hub itself: the hub starts, and the log says that
    the role's members act as plain users in the queue service."""
    extra = 'c.JupyterHub.load_roles.append({"name": "tas", "scopes": ["admin:servers!group=a"]})'
    with running_hub(tmp_path / "warned", extra_config=extra) as hub:
        assert hub.request("GET", "").status_code == 200
        warning = "Scope filter: role 'tas' grants 'admin:servers!group=a'"
        assert warning in hub.log_text()


# -- 8. Bounded work per request ------------------------------------------------------------


def raw_post(
    host: str, port: int, path: str, head: str, body_chunks, method: str = "POST"
) -> tuple[int, bytes]:
    """Send a POST (or `method`) by hand (no auth), one body chunk at a time, and read the
    status line."""
    with socket.create_connection((host, port), timeout=60) as sock:
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{head}\r\n".encode())
        try:
            for chunk in body_chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the service hung up on the body: what a cap does
        answer = sock.recv(65536)
    return int(answer.split()[1]), answer


def service_address(hub) -> tuple[str, int]:
    return "127.0.0.1", int(hub.env["FGPU_QUEUE_PORT"])


def test_a_huge_body_is_refused_before_authentication(hub, username):
    host, port = service_address(hub)
    megabyte = b"x" * (1 << 20)
    path = "/services/queue/api/sessions"
    status, answer = raw_post(
        host,
        port,
        path,
        f"Content-Length: {95 << 20}\r\nContent-Type: application/json\r\n",
        [megabyte],
    )
    assert status == 413, answer
    assert b"larger than" in answer
    # Chunked, with no length to look at: counted as it comes (a caller the hub does not know
    # is refused before any of it, test_security_upload_auth.py).
    piece = b"x" * (100 << 10)
    chunks = (b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(40))
    token = QueueUser(hub, username).http.headers["Authorization"]
    head = f"Authorization: {token}\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n"
    status, answer = raw_post(host, port, path, head, chunks)
    assert status == 413, answer


def test_the_cookie_secret_is_kept_private_and_pages_survive_a_service_restart(hub, username):
    secret = hub.workdir / "fgpu_queue_cookie_secret"
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    browser = Browser(hub, username)
    kill_queue_service(hub, QueueUser(hub, username))
    response = browser.own_page_call("GET", "sessions", allow_redirects=False)
    assert response.status_code == 200, response.text


# -- 10. A launch answers at once -----------------------------------------------------------


def test_a_launch_answers_with_the_queue_records(hub, username):
    student = QueueUser(hub, username)
    response = student.call("POST", "sessions", json={**SESSION, "count": 2})
    assert response.status_code == 201, response.text
    servers = response.json()["servers"]
    assert len(servers) == 2
    for server in servers:
        assert server["session"]["server_name"] == server["server_name"]
        assert server["session"]["status"] in ("PENDING", "SCHEDULED", "RUNNING")
    ids = {server["session"]["id"] for server in servers}
    student.wait_for(lambda s: {x["id"] for x in s if x["status"] == "RUNNING"} == ids, timeout=120)


# A hub as busy as at a class's deadline, where the launches' starts queue in the hub: each
# user's first spawn goes ahead, and the ones after it wait 20 s before they reach the queue.
# Users named "one-..." may run one named server at a time, so the hub refuses their second.
BUSY_HUB_CONFIG = """
import asyncio
from fgpu_spawner.named_servers import ActiveNamedServerLimit

_spawned_once = set()


async def _hold_later_spawns(spawner):
    if spawner.user.name.startswith("slow-"):
        if spawner.user.name in _spawned_once:
            await asyncio.sleep(20)
        _spawned_once.add(spawner.user.name)


c.FGPUSpawner.pre_spawn_hook = _hold_later_spawns
_five, _one = ActiveNamedServerLimit(5), ActiveNamedServerLimit(1)
c.JupyterHub.named_server_limit_per_user = lambda handler: (
    _one if "/users/one-" in handler.request.path else _five
)(handler)
"""
HELD_SPAWN_SECONDS = 20


@pytest.fixture(scope="module")
def busy_hub(tmp_path_factory, docker_engine, test_catalog):
    env = {"FGPU_CATALOG_PATH": str(test_catalog)}
    workdir = tmp_path_factory.mktemp("busy-hub")
    with running_hub(workdir, env=env, extra_config=BUSY_HUB_CONFIG) as running:
        yield running


def ended_record(hub, session_id: str) -> tuple[str, str]:
    """(status, reason) of a record as the service's DB holds it, ended ones too."""
    with contextlib.closing(sqlite3.connect(hub.workdir / "fgpu_queue.sqlite")) as db:
        return db.execute(
            "SELECT status, reason FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()


def named_servers(hub, user: str) -> set[str]:
    response = hub.request("GET", f"users/{user}?include_stopped_servers=1")
    assert response.status_code == 200, response.text
    return {name for name in response.json()["servers"] if name}


def test_a_launch_answers_before_the_hub_has_started_its_servers(busy_hub):
    student = QueueUser(busy_hub, f"slow-{secrets.token_hex(4)}")
    started = time.monotonic()
    response = student.call("POST", "sessions", json={**SESSION, "count": 3})
    answered_in = time.monotonic() - started
    assert response.status_code == 201, response.text
    # The later starts are still held in the hub: only the records can be in the answer.
    assert answered_in < HELD_SPAWN_SECONDS / 2, answered_in
    servers = response.json()["servers"]
    assert len(servers) == 3
    for server in servers:
        assert server["session"]["server_name"] == server["server_name"]
        assert server["session"]["status"] in ("PENDING", "SCHEDULED")
    ids = {server["session"]["id"] for server in servers}
    assert {s["id"] for s in student.sessions()} == ids
    student.wait_for(lambda s: {x["id"] for x in s if x["status"] == "RUNNING"} == ids, timeout=180)
    busy_hub.stop_servers({(student.name, server["server_name"]) for server in servers})


def test_a_start_the_hub_refuses_after_the_answer_ends_its_record(busy_hub):
    student = QueueUser(busy_hub, f"one-{secrets.token_hex(4)}")
    response = student.call("POST", "sessions", json={**SESSION, "count": 2})
    assert response.status_code == 201, response.text
    first, second = response.json()["servers"]
    # The first runs; the hub refuses the second (one named server at a time), and its record
    # ends with the hub's words rather than wait for a spawn that never comes.
    student.wait_for(
        lambda s: [(x["id"], x["status"]) for x in s] == [(first["session"]["id"], "RUNNING")],
        timeout=180,
    )
    status, reason = ended_record(busy_hub, second["session"]["id"])
    assert status == "ERROR"
    assert "the most one user may have at a time (1, besides batch jobs waiting)" in reason, reason
    # Nothing of it stays: no server entry, no container.
    assert named_servers(busy_hub, student.name) == {first["server_name"]}
    containers = containers_with({"fgpu.user": student.name})
    assert {c.labels["fgpu.session_id"] for c in containers} == {first["session"]["id"]}
    busy_hub.stop_servers({(student.name, first["server_name"])})


def test_a_launch_past_the_quota_creates_nothing(hub, username):
    student = QueueUser(hub, username)
    # The shipped quota: 3 running and 2 waiting; six at once is one too many.
    response = student.call("POST", "sessions", json={**SESSION, "count": 6})
    assert response.status_code == 403, response.text
    assert "pending" in response.json()["message"]
    with contextlib.closing(sqlite3.connect(hub.workdir / "fgpu_queue.sqlite")) as db:
        rows = db.execute("SELECT id FROM sessions WHERE user = ?", (username,)).fetchall()
    assert rows == []
    assert named_servers(hub, username) == set()
    assert containers_with({"fgpu.user": username}) == []


def test_a_forged_request_key_neither_claims_nor_ends_anothers_record(hub, username):
    owner = QueueUser(hub, username)
    response = owner.call("POST", "sessions", json={**SESSION, "count": 1})
    assert response.status_code == 201, response.text
    (launched,) = response.json()["servers"]
    key = launched["session"]["id"]
    owner.wait_for(lambda s: [x["status"] for x in s] == ["RUNNING"], timeout=180)

    mallory = QueueUser(hub, f"mallory-{secrets.token_hex(4)}")
    body = {**SESSION, "mem": 256 * 1024**2, "request_key": key}
    for server in ("x", launched["server_name"]):
        response = hub.start_server(mallory.name, body, server=server)
        assert response.status_code == 409, response.text
        assert "another server or request" in response.json()["message"]
    # The owner's session runs on, its record untouched (not released by the failed spawn).
    assert [(s["id"], s["status"]) for s in owner.sessions()] == [(key, "RUNNING")]
    assert mallory.sessions() == []
    assert containers_with({"fgpu.user": mallory.name}) == []


def test_a_launched_server_starts_again_from_the_hub(hub, username):
    """The hub keeps a start's options for the next start (the home page's Start sends none);
    the launch's request key is not among them, or the restart would ask for the ended record."""
    student = QueueUser(hub, username)
    response = student.call("POST", "sessions", json={**SESSION, "count": 1})
    assert response.status_code == 201, response.text
    (launched,) = response.json()["servers"]
    name = launched["server_name"]
    assert hub.wait_ready(username, name, timeout=180)["ready"]
    hub.stop_server(username, name)
    response = hub.request("POST", f"users/{username}/servers/{name}")
    assert response.status_code in (201, 202), response.text
    assert hub.wait_ready(username, name, timeout=180)["ready"]
    (again,) = student.sessions()
    assert again["status"] == "RUNNING" and again["id"] != launched["session"]["id"]
