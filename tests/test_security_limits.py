"""One student cannot hold the hub.

Against the real hub with the shipped limits (the `hub` fixture loads jupyterhub_config.py): per
user at most 3 sessions running and 2 waiting in the queue, at most 5 named servers running or
waiting, and a refusal with a message past them. One student fires 100 spawn requests at once,
through the hub's REST API and through the queue service's launch; no more than the limits are
taken, nothing is left behind for the refused ones, and another student's spawn then starts.
"""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from queue_service.quotas import DEFAULT_USER_QUOTA

from .harness import Hub, QueueUser, containers_with

OPTIONS = {"image": "python-3.11", "cpu": 0.5, "mem": "512M"}
RUNNING_PER_USER = DEFAULT_USER_QUOTA["sessions"]
WAITING_PER_USER = DEFAULT_USER_QUOTA["pending"]
ACTIVE_PER_USER = RUNNING_PER_USER + WAITING_PER_USER
BURST = 100
HUB_REFUSAL = (
    f"the most one user may have at a time ({ACTIVE_PER_USER}, besides batch jobs waiting)"
)
QUEUE_REFUSAL = f"quota allows {WAITING_PER_USER} pending sessions at a time"


def burst(send, what: str, how_many: int = BURST) -> list[tuple[int, requests.Response]]:
    """Send `how_many` requests at once, one thread each; (index, answer) pairs. Prints how long
    the answers took: all of them, and the refusals alone."""
    started = time.monotonic()

    def timed(i: int) -> tuple[requests.Response, float]:
        response = send(i)
        return response, time.monotonic() - started

    with ThreadPoolExecutor(max_workers=how_many) as pool:
        results = list(pool.map(timed, range(how_many)))
    refusals = sorted(seconds for r, seconds in results if r.status_code >= 400)
    print(
        f"\n{how_many} {what} of one student: all answered in {max(s for _, s in results):.1f} s;"
        f" {len(refusals)} refusals, median {refusals[len(refusals) // 2]:.1f} s,"
        f" last {refusals[-1]:.1f} s"
        if refusals
        else ""
    )
    return [(i, response) for i, (response, _) in enumerate(results)]


def named_servers(hub: Hub, user: str) -> set[str]:
    """Every named server the hub keeps for `user`, stopped ones included."""
    response = hub.request("GET", f"users/{user}?include_stopped_servers=1")
    assert response.status_code == 200, response.text
    return {name for name in response.json()["servers"] if name}


def held_in_full(student: QueueUser) -> list[dict]:
    """The student's sessions once the limits are reached: 3 running and 2 waiting on quota."""
    return student.wait_for(
        lambda s: (
            [r["status"] for r in s].count("RUNNING") == RUNNING_PER_USER
            and [r["status"] for r in s].count("PENDING") == WAITING_PER_USER
        ),
        timeout=180,
    )


def assert_held_within_limits(hub: Hub, student: QueueUser, accepted_servers: set[str]) -> None:
    sessions = held_in_full(student)
    assert {s["server_name"] for s in sessions} == accepted_servers
    for waiting in (s for s in sessions if s["status"] == "PENDING"):
        assert "quota" in waiting["reason"], waiting
    # Nothing of the refused requests: no named server entry, no container, no record.
    assert named_servers(hub, student.name) == accepted_servers
    containers = containers_with({"fgpu.user": student.name})
    assert {c.labels["fgpu.session_id"] for c in containers} == {
        s["id"] for s in sessions if s["status"] == "RUNNING"
    }


def assert_queue_refuses_the_default_server(hub: Hub, student: QueueUser) -> None:
    """Past the named-server limit the hub refuses by itself; the default server is not a named
    one, so the queue's own quota refuses it, through the spawner, before any container."""
    before = {s["id"] for s in student.sessions()}
    response = hub.request("POST", f"users/{student.name}/server", json=OPTIONS)
    assert response.status_code == 403, response.text
    assert QUEUE_REFUSAL in response.json()["message"]
    assert {s["id"] for s in student.sessions()} == before
    assert all(c.labels["fgpu.server_name"] for c in containers_with({"fgpu.user": student.name}))


def assert_another_student_starts(hub: Hub) -> None:
    other = f"student-{secrets.token_hex(4)}"
    response = hub.start_server(other, OPTIONS)
    assert response.status_code in (201, 202), response.text
    assert hub.wait_ready(other, timeout=180)["ready"]


def test_a_burst_of_hub_spawns_holds_no_more_than_the_limits(hub):
    student = QueueUser(hub, f"student-{secrets.token_hex(4)}")
    headers = dict(hub.api.headers)

    def spawn(i: int) -> requests.Response:
        url = f"{hub.url}/hub/api/users/{student.name}/servers/burst-{i:03d}"
        return requests.post(url, json=OPTIONS, headers=headers, timeout=300)

    answers = burst(spawn, "hub spawns")
    accepted = {f"burst-{i:03d}" for i, r in answers if r.status_code in (201, 202)}
    refused = [r for _, r in answers if r.status_code not in (201, 202)]
    assert len(accepted) == ACTIVE_PER_USER, [(r.status_code, r.text) for _, r in answers]
    for response in refused:
        assert response.status_code == 400, response.text
        assert HUB_REFUSAL in response.json()["message"], response.text

    assert_held_within_limits(hub, student, accepted)
    assert_queue_refuses_the_default_server(hub, student)
    assert_another_student_starts(hub)


def test_a_burst_of_launches_holds_no_more_than_the_limits(hub):
    student = QueueUser(hub, f"student-{secrets.token_hex(4)}")

    url, headers = f"{hub.url}/services/queue/api/sessions", dict(student.http.headers)

    def launch(_: int) -> requests.Response:
        # A connection of its own for each thread: a requests.Session is not shared across them.
        return requests.post(url, json={**OPTIONS, "count": 1}, headers=headers, timeout=300)

    answers = burst(launch, "launches")
    accepted = [r for _, r in answers if r.status_code == 201]
    refused = [r for _, r in answers if r.status_code != 201]
    assert len(accepted) == ACTIVE_PER_USER, [(r.status_code, r.text) for _, r in answers]
    for response in refused:
        # A launch records its sessions before the hub starts them, so the queue's quota
        # refuses first (403); the hub's named-server limit (400) stands behind it.
        assert response.status_code in (400, 403), response.text
        message = response.json()["message"]
        assert QUEUE_REFUSAL in message or HUB_REFUSAL in message, response.text

    launched = {server["server_name"] for r in accepted for server in r.json()["servers"]}
    assert_held_within_limits(hub, student, launched)
    assert_another_student_starts(hub)


def test_stopped_named_servers_do_not_count(hub):
    """JupyterHub's own limit counts every named server a user keeps, stopped ones too, and the
    queue's launch names each session afresh: a student would be locked out after five."""
    student = f"student-{secrets.token_hex(4)}"
    hub.create_user(student)
    for i in range(ACTIVE_PER_USER):
        response = hub.request("PUT", f"users/{student}/servers/old-{i}", json={})
        assert response.status_code == 201, response.text
    response = hub.start_server(student, OPTIONS, server="new")
    assert response.status_code in (201, 202), response.text
    assert hub.wait_ready(student, "new", timeout=180)["ready"]
