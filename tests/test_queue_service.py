"""The queue service end to end: a real hub, the real service, real containers, simulated GPUs."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
import requests

from .harness import QueueUser, containers_with, in_terminal, restart, running_hub, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.hub]
SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "512M"}


def by_status(sessions: list[dict], status: str) -> list[dict]:
    return [s for s in sessions if s["status"] == status]


def two_running_one_waiting(student: QueueUser) -> list[dict]:
    """The seed's launch: 3 sessions of 1 fGPU on 2 fGPU of capacity; two run and one waits."""
    response = student.call("POST", "sessions", json={**SESSION, "fgpu": 1, "count": 3})
    assert response.status_code == 201, response.text
    return student.wait_for(
        lambda s: len(by_status(s, "RUNNING")) == 2 and len(by_status(s, "PENDING")) == 1
    )


def assert_nothing_leaked(student: QueueUser) -> list[dict]:
    """The records against the engine and the accounts: exactly the RUNNING sessions have
    containers, and the user's allocation is exactly what the sessions holding a slice ask for."""
    sessions = student.sessions()
    containers = containers_with({"fgpu.user": student.name})
    assert {c.labels["fgpu.session_id"] for c in containers} == {
        s["id"] for s in by_status(sessions, "RUNNING")
    }
    holding = [s for s in sessions if s["status"] in ("SCHEDULED", "RUNNING")]
    allocated = student.call("GET", "resources").json()["allocated"]
    assert allocated["fgpu"] == pytest.approx(sum(s["fgpu"] for s in holding))
    assert allocated["cpu"] == pytest.approx(sum(s["cpu"] for s in holding))
    return sessions


@pytest.fixture
def student(gpu_hub):
    """A fresh student; whatever a test leaves behind is ended, so it cannot starve the next."""
    student = QueueUser(gpu_hub, f"student-{secrets.token_hex(4)}")
    yield student
    end_all(student, student.sessions())


def end_all(caller: QueueUser, sessions: list[dict]) -> None:
    # Pending ones first: ending a running one would otherwise hand its slice to a pending one.
    # The last in line first: every waiting spawn long-polls its record, and a cancel ahead of
    # it moves its position, which wakes it. Front to back, the crowd's 198 cancels woke
    # 198 + 197 + ... spawns, each calling the service again: most of a minute of teardown.
    last_first = sorted(sessions, key=lambda s: -(s.get("position") or 0))
    waiting = [s for s in last_first if s["status"] != "RUNNING"]
    running = [s for s in sessions if s["status"] == "RUNNING"]
    headers = dict(caller.http.headers)

    def end(session: dict) -> None:
        url = f"{caller.hub.url}/services/queue/api/sessions/{session['id']}"
        requests.delete(url, headers=headers, timeout=120)

    # A few at a time, each on a connection of its own (as Hub.stop_servers does): the calls
    # overlap, and they still reach the service nearly in the order above.
    for group in (waiting, running):
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(end, group))
    ids = {s["id"] for s in sessions}
    caller.wait_for(lambda s: not ids & {r["id"] for r in s}, timeout=120)


def test_seed_walkthrough_two_run_one_waits_then_starts_by_itself(gpu_hub, student):
    sessions = two_running_one_waiting(student)
    (pending,) = by_status(sessions, "PENDING")
    assert pending["position"] == 1 and pending["grant"] is None
    assert "fGPU" in pending["reason"]
    containers = containers_with({"fgpu.user": student.name})
    assert len(containers) == 2
    # Every grant of the one GPU adds up to exactly the whole GPU.
    fractions = [f for s in by_status(sessions, "RUNNING") for f in s["grant"]["gpus"].values()]
    assert fractions == [0.5, 0.5]

    first_running = by_status(sessions, "RUNNING")[0]
    released_at = time.monotonic()
    assert student.call("DELETE", f"sessions/{first_running['id']}").status_code == 200
    sessions = student.wait_for(
        lambda s: (
            len(by_status(s, "RUNNING")) == 2
            and pending["id"] in {r["id"] for r in by_status(s, "RUNNING")}
        )
    )
    print(f"pending → running after a release: {time.monotonic() - released_at:.1f} s")
    assert first_running["id"] not in {s["id"] for s in sessions}
    assert len(containers_with({"fgpu.user": student.name})) == 2
    for session in sessions:
        assert student.call("DELETE", f"sessions/{session['id']}").status_code == 200
    student.wait_for(lambda s: s == [])


def test_grant_reaches_the_container_as_labels_and_env(gpu_hub, student):
    response = student.call("POST", "sessions", json={**SESSION, "fgpu": 0.5, "count": 1})
    assert response.status_code == 201, response.text
    (session,) = student.wait_for(lambda s: len(by_status(s, "RUNNING")) == 1)
    (container,) = containers_with({"fgpu.user": student.name})
    assert container.labels["fgpu.session_id"] == session["id"]
    assert json.loads(container.labels["fgpu.grant"])["gpus"] == session["grant"]["gpus"]
    assert list(session["grant"]["gpus"].values()) == [0.25]
    env = dict(line.split("=", 1) for line in container.attrs["Config"]["Env"])
    assert env["FGPU_FGPU"] == "0.5"
    # The seeds' first check, in the web terminal: 0.5 fGPU at 2 units per GPU is a quarter of
    # the 8 GiB GPU, which the stand-in shows as simulated.
    query = "nvidia-smi --query-gpu=name,memory.total,index --format=csv,noheader; nvidia-smi"
    output = in_terminal(gpu_hub, student.name, query, session["server_name"])
    assert "Simulated GPU (8 GiB), 2048 MiB, 0" in output.splitlines()
    assert "NVIDIA-SMI SIMULATED" in output and "2048 MiB of 8192 MiB, 25% of its SMs" in output
    student.call("DELETE", f"sessions/{session['id']}")
    student.wait_for(lambda s: s == [])


def test_students_see_and_stop_only_their_own_sessions(gpu_hub, student):
    other = QueueUser(gpu_hub, f"student-{secrets.token_hex(4)}")
    response = student.call("POST", "sessions", json={**SESSION, "count": 1})
    assert response.status_code == 201, response.text
    (session,) = student.wait_for(lambda s: len(by_status(s, "RUNNING")) == 1)
    assert other.sessions() == []
    assert other.call("DELETE", f"sessions/{session['id']}").status_code == 404
    assert by_status(student.sessions(), "RUNNING")
    student.call("DELETE", f"sessions/{session['id']}")
    student.wait_for(lambda s: s == [])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({**SESSION, "fgpu": 3}, "fGPU"),
        ({**SESSION, "count": 0}, "count"),
        ({**SESSION, "count": "3"}, "count"),
        ({**SESSION, "cpu": -1}, "greater than zero"),
        ({**SESSION, "resource_group": "mars"}, "There is no resource group 'mars'"),
    ],
)
def test_requests_that_can_never_fit_are_refused_at_once(gpu_hub, student, body, message):
    response = student.call("POST", "sessions", json=body)
    assert 400 <= response.status_code < 500, response.text
    assert message in response.json()["message"]
    assert student.sessions() == []
    assert containers_with({"fgpu.user": student.name}) == []


def test_service_api_needs_a_login(gpu_hub):
    response = requests.get(f"{gpu_hub.url}/services/queue/api/sessions", timeout=30)
    assert response.status_code in (401, 403)
    assert response.headers["Content-Type"].startswith("application/json")


def as_spawner(hub, method: str, path: str, **kwargs) -> requests.Response:
    """A call to the grants API with the spawner's own token, as FGPUSpawner makes it."""
    headers = {"Authorization": f"token {hub.spawner_token}", **kwargs.pop("headers", {})}
    url = f"{hub.url}/services/queue/api/{path}"
    return requests.request(method, url, headers=headers, timeout=30, **kwargs)


BAD_GRANT_CALLS = [
    ("GET", "grants/{id}?wait=abc", None, "`wait` must be"),
    ("GET", "grants/{id}?wait=nan", None, "`wait` must be"),
    ("GET", "grants/{id}?wait=-1", None, "`wait` must be"),
    ("POST", "grants", {"image": "python-3.11", "cpu": 1, "mem": 2**30}, "no user"),
    ("POST", "grants", {"user": "", "image": "python-3.11"}, "no user"),
    ("POST", "grants/{id}/running", None, "no grant"),
]


def test_bad_grant_calls_get_a_4xx_and_change_nothing(gpu_hub, student):
    # One running and one pending session to leave untouched: set up once for every call.
    response = student.call("POST", "sessions", json={**SESSION, "fgpu": 2, "count": 2})
    assert response.status_code == 201, response.text
    sessions = student.wait_for(
        lambda s: len(by_status(s, "RUNNING")) == 1 and len(by_status(s, "PENDING")) == 1
    )
    (pending,) = by_status(sessions, "PENDING")
    for method, path, body, message in BAD_GRANT_CALLS:
        answer = as_spawner(gpu_hub, method, path.format(id=pending["id"]), json=body)
        assert 400 <= answer.status_code < 500, (path, answer.text)
        assert message in answer.json()["message"], path
    assert {(s["id"], s["status"]) for s in student.sessions()} == {
        (s["id"], s["status"]) for s in sessions
    }
    assert_nothing_leaked(student)


def test_a_grant_request_with_an_infinite_amount_is_refused(gpu_hub, student):
    body = {"user": student.name, "image": "python-3.11", "cpu": 1, "mem": float("inf")}
    headers = {"Content-Type": "application/json"}  # json= refuses infinity, as JSON does
    answer = as_spawner(gpu_hub, "POST", "grants", data=json.dumps(body), headers=headers)
    assert answer.status_code == 400, answer.text
    assert student.sessions() == []


def queue_service_pid(hub) -> int:
    found = subprocess.run(
        ["pgrep", "-P", str(hub.process.pid), "-f", "queue_service"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(found.stdout.split()[0])


def kill_queue_service(hub, caller: QueueUser) -> None:
    """SIGKILL the service, and return once the hub has started it again and it answers."""
    old_pid = queue_service_pid(hub)
    os.kill(old_pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException, subprocess.CalledProcessError):
            if queue_service_pid(hub) != old_pid and caller.call("GET", "sessions").ok:
                return
        time.sleep(0.5)
    raise AssertionError("the queue service did not come back within 60 s")


def test_killing_the_service_loses_no_pending_request(gpu_hub, student):
    before = two_running_one_waiting(student)
    kill_queue_service(gpu_hub, student)
    after = assert_nothing_leaked(student)
    assert {(s["id"], s["status"]) for s in after} == {(s["id"], s["status"]) for s in before}
    # The waiting spawn reconnected: a release still starts it by itself.
    (pending,) = by_status(after, "PENDING")
    student.call("DELETE", f"sessions/{by_status(after, 'RUNNING')[0]['id']}")
    student.wait_for(lambda s: pending["id"] in {r["id"] for r in by_status(s, "RUNNING")})
    assert_nothing_leaked(student)
    for session in student.sessions():
        student.call("DELETE", f"sessions/{session['id']}")
    student.wait_for(lambda s: s == [])


@pytest.fixture
def crowd(gpu_hub):
    """A hundred users, and an admin who watches them; whatever they start is ended afterwards."""
    admin = f"admin-{secrets.token_hex(3)}"
    response = gpu_hub.request("POST", f"users/{admin}", json={"admin": True})
    assert response.status_code == 201, response.text
    watcher = QueueUser(gpu_hub, admin)
    users = [f"crowd-{secrets.token_hex(3)}" for _ in range(100)]
    for user in users:
        gpu_hub.create_user(user)
    yield watcher, users
    end_all(watcher, [s for s in watcher.sessions() if s["user"] in users])
    # The hub lets the cancelled spawns go on its own time: waited for here, so that the next
    # test neither shares the machine with that work nor finds the crowd's servers listed.
    wait_until(
        lambda: not {user for user, _ in gpu_hub.active_servers()} & set(users),
        120,
        "the crowd's servers gone from the hub",
        interval=0.5,
    )


def test_200_concurrent_spawns_never_over_allocate(gpu_hub, crowd):
    watcher, users = crowd
    body = {**SESSION, "mem": "256M", "fgpu": 1}

    def spawn(target):
        user, server = target
        return gpu_hub.request("POST", f"users/{user}/servers/{server}", json=body).status_code

    # Two each: the shipped per-user quota lets a student wait with two requests, not fifty.
    with ThreadPoolExecutor(max_workers=100) as pool:
        codes = list(pool.map(spawn, [(user, f"s{i}") for i in range(2) for user in users]))
    assert set(codes) <= {201, 202}, codes

    def mine(sessions):
        return [s for s in sessions if s["user"] in users]

    sessions = mine(
        watcher.wait_for(
            lambda s: (
                len(by_status(mine(s), "RUNNING")) == 2
                and len(by_status(mine(s), "PENDING")) == 198
            ),
            timeout=180,
        )
    )
    per_gpu: dict[str, float] = {}
    for session in by_status(sessions, "RUNNING"):
        for gpu, fraction in session["grant"]["gpus"].items():
            per_gpu[gpu] = per_gpu.get(gpu, 0) + fraction
    assert all(total <= 1.0 for total in per_gpu.values()), per_gpu
    assert sorted(s["position"] for s in by_status(sessions, "PENDING")) == list(range(1, 199))
    # The DB against the engine: exactly the RUNNING sessions have containers.
    containers = [c for user in users for c in containers_with({"fgpu.user": user})]
    assert {c.labels["fgpu.session_id"] for c in containers} == {
        s["id"] for s in by_status(sessions, "RUNNING")
    }


def join_group_with_quota(hub, user: str, quota: dict) -> str:
    group = f"course-{secrets.token_hex(3)}"
    assert hub.request("POST", f"groups/{group}").status_code == 201
    properties = {"fgpu_quota": quota}
    assert hub.request("PUT", f"groups/{group}/properties", json=properties).status_code == 200
    members = {"users": [user]}
    assert hub.request("POST", f"groups/{group}/users", json=members).status_code == 200
    return group


def test_a_group_quota_holds_across_a_service_restart(gpu_hub, student):
    join_group_with_quota(gpu_hub, student.name, {"fgpu": 1})
    response = student.call("POST", "sessions", json={**SESSION, "fgpu": 1, "count": 2})
    assert response.status_code == 201, response.text
    before = student.wait_for(
        lambda s: len(by_status(s, "RUNNING")) == 1 and len(by_status(s, "PENDING")) == 1
    )
    kill_queue_service(gpu_hub, student)
    # The first pass after the restart must already know the group's quota: there is room on
    # the GPU, so only the quota keeps the second session waiting.
    after = student.sessions()
    assert {(s["id"], s["status"]) for s in after} == {(s["id"], s["status"]) for s in before}
    assert "quota" in by_status(after, "PENDING")[0]["reason"]


def test_a_launch_refused_part_way_leaves_nothing_behind(gpu_hub, student):
    join_group_with_quota(gpu_hub, student.name, {"sessions": 1, "pending": 1})
    response = student.call("POST", "sessions", json={**SESSION, "fgpu": 0.5, "count": 3})
    # The first runs and the second waits; the third is one pending request too many.
    assert response.status_code == 403, response.text
    assert "pending" in response.json()["message"]
    student.wait_for(lambda s: s == [], timeout=60)
    assert containers_with({"fgpu.user": student.name}) == []

    # Not even the named servers' entries stay in the hub (the default server's always does).
    def named_servers() -> list[str]:
        path = f"users/{student.name}?include_stopped_servers=1"
        return [name for name in gpu_hub.request("GET", path).json()["servers"] if name]

    deadline = time.monotonic() + 30
    while named_servers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert named_servers() == []


def test_a_group_quota_cannot_be_exceeded_by_racing(gpu_hub, student):
    join_group_with_quota(gpu_hub, student.name, {"fgpu": 1})
    body = {**SESSION, "mem": "256M", "fgpu": 1}

    def spawn(server):
        return gpu_hub.start_server(student.name, body, server=server).status_code

    # Three at once: the shipped per-user quota lets one run and two wait.
    with ThreadPoolExecutor(max_workers=3) as pool:
        codes = list(pool.map(spawn, [f"q{i}" for i in range(3)]))
    assert set(codes) <= {201, 202}, codes
    sessions = student.wait_for(
        lambda s: len(by_status(s, "RUNNING")) == 1 and len(by_status(s, "PENDING")) == 2
    )
    assert all("quota" in s["reason"] for s in by_status(sessions, "PENDING"))
    for session in sessions:
        student.call("DELETE", f"sessions/{session['id']}")
    student.wait_for(lambda s: s == [])


@pytest.mark.parametrize("fate", ["died", "removed"])
def test_a_container_lost_outside_the_hub_frees_its_slice_within_10_s(gpu_hub, student, fate):
    response = student.call("POST", "sessions", json={**SESSION, "fgpu": 1, "count": 1})
    assert response.status_code == 201, response.text
    (session,) = student.wait_for(lambda s: len(by_status(s, "RUNNING")) == 1)
    (container,) = containers_with({"fgpu.user": student.name})
    if fate == "died":
        container.kill()
    else:
        container.remove(force=True)
    lost_at = time.monotonic()
    student.wait_for(lambda s: s == [], timeout=10)
    print(f"slice freed {time.monotonic() - lost_at:.1f} s after the container {fate}")
    resources = student.call("GET", "resources").json()
    assert resources["allocated"] == {"cpu": 0, "mem": 0, "fgpu": 0}


def test_a_container_whose_record_ended_is_stopped_through_the_hub(gpu_hub, student):
    response = student.call("POST", "sessions", json={**SESSION, "count": 1})
    assert response.status_code == 201, response.text
    (session,) = student.wait_for(lambda s: len(by_status(s, "RUNNING")) == 1)
    # The record ends behind everyone's back (as when a stop through the hub failed midway).
    with sqlite3.connect(gpu_hub.workdir / "fgpu_queue.sqlite") as db:
        db.execute("UPDATE sessions SET status = 'TERMINATED' WHERE id = ?", (session["id"],))
    ended_at = time.monotonic()
    deadline = ended_at + 30
    while (
        gpu_hub.server_model(student.name, session["server_name"]) and time.monotonic() < deadline
    ):
        time.sleep(0.3)
    print(f"ungranted container stopped {time.monotonic() - ended_at:.1f} s after its record ended")
    # The hub stopped it (it no longer lists the server), and the container is gone.
    assert gpu_hub.server_model(student.name, session["server_name"]) is None
    assert containers_with({"fgpu.session_id": session["id"]}) == []


def ended_at(hub, session_id: str) -> float:
    """When the service ended the record, which is when its slice went back to the queue."""
    with sqlite3.connect(hub.workdir / "fgpu_queue.sqlite") as db:
        (text,) = db.execute("SELECT ended FROM sessions WHERE id = ?", (session_id,)).fetchone()
    ended = datetime.fromisoformat(text)
    return ended.replace(tzinfo=ended.tzinfo or UTC).timestamp()


def destroyed_at(engine, container_id: str, since: float) -> float:
    """When the engine removed the container, from its own event log."""
    events = engine.events(
        since=int(since),
        until=int(time.time()) + 1,
        filters={"container": container_id, "event": "destroy"},
        decode=True,
    )
    (event,) = list(events)
    return event["timeNano"] / 1e9


def test_a_stopped_session_frees_its_slice_only_once_its_container_is_gone(
    gpu_hub, student, docker_engine
):
    since = time.time()
    response = student.call("POST", "sessions", json={**SESSION, "fgpu": 1, "count": 1})
    assert response.status_code == 201, response.text
    (session,) = student.wait_for(lambda s: len(by_status(s, "RUNNING")) == 1)
    (container,) = containers_with({"fgpu.session_id": session["id"]})
    assert student.call("DELETE", f"sessions/{session['id']}").status_code == 200
    student.wait_for(lambda s: s == [])
    # Otherwise the next grant of that GPU slice can start while this container still holds it.
    assert destroyed_at(docker_engine, container.id, since) <= ended_at(gpu_hub, session["id"])


def test_a_spawn_stopped_while_starting_frees_its_slice_only_once_its_container_is_gone(
    gpu_hub, student, docker_engine
):
    since = time.time()
    starts = docker_engine.events(
        filters={"label": f"fgpu.user={student.name}", "event": "start"}, decode=True
    )

    def pause_at_start():
        # Hold the server back from ever answering, so its spawn is still starting when ended.
        container = docker_engine.containers.get(next(starts)["id"])
        container.pause()
        return container

    with ThreadPoolExecutor(1) as pool:
        paused = pool.submit(pause_at_start)
        response = student.call("POST", "sessions", json={**SESSION, "fgpu": 1, "count": 1})
        assert response.status_code == 201, response.text
        container = paused.result(timeout=60)
    starts.close()
    (session,) = student.sessions()
    assert session["status"] == "SCHEDULED"
    assert student.call("DELETE", f"sessions/{session['id']}").status_code == 200
    student.wait_for(lambda s: s == [])
    assert destroyed_at(docker_engine, container.id, since) <= ended_at(gpu_hub, session["id"])
    assert not (gpu_hub.server_model(student.name, session["server_name"]) or {}).get("ready")


def test_three_of_0_4_fgpu_on_one_unit_two_run_one_waits(one_gpu_hub):
    student = QueueUser(one_gpu_hub, f"student-{secrets.token_hex(4)}")
    response = student.call("POST", "sessions", json={**SESSION, "fgpu": 0.4, "count": 3})
    assert response.status_code == 201, response.text
    sessions = student.wait_for(
        lambda s: len(by_status(s, "RUNNING")) == 2 and len(by_status(s, "PENDING")) == 1
    )
    running = by_status(sessions, "RUNNING")
    (pending,) = by_status(sessions, "PENDING")
    containers = containers_with({"fgpu.user": student.name})
    assert {c.labels["fgpu.session_id"] for c in containers} == {s["id"] for s in running}
    assert sorted(f for s in running for f in s["grant"]["gpus"].values()) == [0.4, 0.4]
    assert student.call("DELETE", f"sessions/{running[0]['id']}").status_code == 200
    student.wait_for(lambda s: pending["id"] in {r["id"] for r in by_status(s, "RUNNING")})
    end_all(student, student.sessions())


def test_the_spawn_page_progress_shows_the_queue_position(gpu_hub, student):
    """The hub's spawn-pending page renders these events: the pending one says where it stands."""
    sessions = two_running_one_waiting(student)
    (pending,) = by_status(sessions, "PENDING")
    url = f"{gpu_hub.url}/hub/api/users/{student.name}/servers/{pending['server_name']}/progress"
    with student.http.get(url, stream=True, timeout=30) as events:
        assert events.status_code == 200
        for line in events.iter_lines(decode_unicode=True):
            if line.startswith("data:") and "Pending" in line:
                message = json.loads(line[len("data:") :])["message"]
                break
    print(f"spawn page: {message}")
    assert message.startswith("Pending: 1st in line; waiting for 1 fGPU;")


def test_a_pending_request_survives_a_hub_restart_and_starts_in_its_turn(gpu_hub, student):
    before = two_running_one_waiting(student)
    (pending,) = by_status(before, "PENDING")
    restart(gpu_hub)
    # The running sessions kept their containers; the pending one kept its place in line (once
    # the restarted service has counted the engine's containers: no position is placed before).
    kept = {(r["id"], r["status"], r["position"]) for r in before}
    after = student.wait_for(lambda s: {(r["id"], r["status"], r["position"]) for r in s} == kept)
    assert by_status(after, "PENDING")[0]["position"] == 1
    assert_nothing_leaked(student)
    # Its spawn was lost with the hub and is issued again: a release still starts it by itself.
    student.call("DELETE", f"sessions/{by_status(after, 'RUNNING')[0]['id']}")
    student.wait_for(
        lambda s: pending["id"] in {r["id"] for r in by_status(s, "RUNNING")}, timeout=120
    )
    assert_nothing_leaked(student)


@pytest.mark.docker
@pytest.mark.hub
def test_the_hub_stops_at_once_when_started_in_the_background(tmp_path, docker_engine):
    """The hub stops its services with SIGINT and sends SIGTERM only 10 s later. A shell's `&`
    (scripts/up in the background) leaves SIGINT ignored, and a service that relied on Python's
    default handler held every hub shutdown up for about 30 s."""
    with running_hub(tmp_path / "hub", ignore_sigint=True) as hub:
        hub.process.terminate()
        hub.process.wait(timeout=60)
        log = hub.log_text()
        assert "Cleaning up 2 services" in log  # the queue and the idle culler
        # Each service ended on the SIGINT: the hub never had to go on to SIGTERM (it logs
        # "Terminating <pid>" when it does), whatever the machine's load made the stop take.
        assert log.count("Interrupting ") == 2, log[-3000:]
        assert "Terminating " not in log and "Killing " not in log, log[-3000:]


def test_the_service_reads_its_database_from_the_environment_with_the_installed_driver(
    monkeypatch,
):
    from queue_service.app import QueueService

    monkeypatch.delenv("FGPU_QUEUE_DB_URL", raising=False)
    assert QueueService().db_url == "sqlite:///fgpu_queue.sqlite"
    monkeypatch.setenv("FGPU_QUEUE_DB_URL", "postgresql://queue:pw@db.example/fgpu_queue")
    assert QueueService().db_url == "postgresql+psycopg://queue:pw@db.example/fgpu_queue"
    given = QueueService(db_url="postgres://queue:pw@db.example/other")
    assert given.db_url == "postgresql+psycopg://queue:pw@db.example/other"


def test_a_registry_credentials_file_every_user_reads_stops_the_service_before_it_starts(
    tmp_path, capfd
):
    from queue_service.app import QueueService

    path = tmp_path / "registry-auth.json"
    path.write_text('{"username": "u", "password": "p", "serveraddress": "r:5000"}')
    path.chmod(0o644)
    with pytest.raises(SystemExit):
        QueueService(registry_auth_file=str(path)).build()
    assert f"registry_auth_file: registry credentials file {path} is readable by every user" in (
        capfd.readouterr().err
    )
    path.chmod(0o600)
    assert QueueService(registry_auth_file=str(path)).registry_auth()["serveraddress"] == "r:5000"


@pytest.mark.parametrize("mode", ["docker", "swarm"])
def test_the_engine_class_is_read_once_into_its_backend(mode, tmp_path, monkeypatch):
    from queue_service.app import QueueService
    from queue_service.engine.docker_engine import DockerEngine
    from queue_service.engine.swarm_engine import SwarmEngine

    monkeypatch.chdir(tmp_path)
    service = QueueService(engine_class=mode)
    service.init_engine()
    backend = service.engine_backend
    assert type(backend) is {"docker": DockerEngine, "swarm": SwarmEngine}[mode]
    # Only where the sessions' containers run here are their freezers read, their volumes
    # looked into and images built; elsewhere the nodes' agents report.
    here = mode == "docker"
    assert (service.freeze is not None) is (backend.volume_inspector() is not None) is here
    assert (backend.reported_nodes() is None) is here
    service.build_in_background = True
    assert service.builds_here is backend.builds_images is here
    assert backend.nodes_change is (mode == "swarm")
    # In Swarm mode the images sessions can run are listed only from the site's registry.
    assert backend.images_listable is (mode == "docker")


def run_service_alone(workdir, db_url: str) -> subprocess.CompletedProcess:
    """The queue service started by hand in `workdir` on `db_url`, with no hub behind it."""
    env = {
        **os.environ,
        "FGPU_QUEUE_DB_URL": db_url,
        "JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:9",
        "JUPYTERHUB_API_URL": "http://127.0.0.1:9/hub/api",
        "JUPYTERHUB_API_TOKEN": "unused",
    }
    return subprocess.run(
        [sys.executable, "-m", "queue_service"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_database_it_cannot_upgrade_stops_the_service_with_why_and_untouched(tmp_path):
    """A queue DB from a newer release: the service exits before it listens, says why, and
    neither the database nor the state directory changes."""
    from queue_service.store.db import upgrade

    db = tmp_path / "fgpu_queue.sqlite"
    upgrade(f"sqlite:///{db}")
    with contextlib.closing(sqlite3.connect(db)) as connection, connection:
        connection.execute("UPDATE alembic_version SET version_num = '0999'")
    before = db.read_bytes()
    done = run_service_alone(tmp_path, f"sqlite:///{db}")
    assert done.returncode == 1, done.stderr
    assert "Not starting: the queue DB is at schema revision 0999" in done.stderr
    assert "Traceback" not in done.stderr
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fgpu_queue.sqlite"]


def test_a_database_that_does_not_answer_stops_the_service_in_one_line(tmp_path):
    done = run_service_alone(tmp_path, "postgresql://fgpu:s3cret@127.0.0.1:9/fgpu_queue")
    assert done.returncode == 1, done.stderr
    assert (
        "Not starting: the queue DB postgresql+psycopg://fgpu:***@127.0.0.1:9/fgpu_queue does"
        in (done.stderr)
    )
    assert "Traceback" not in done.stderr and "s3cret" not in done.stderr
