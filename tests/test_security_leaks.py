"""Nothing leaks, nothing starts by itself. Against real hubs and the real engine.

- the queue service ends with its hub, even when the hub is killed, and the next one takes over;
- the service starts while the engine is down, refuses spawns at once with a 503 that says why,
  and recovers by itself when the engine is back;
- a stop whose `docker stop` fails keeps the grant until the container is really gone;
- grant requests carry a key the spawner chose: a repeat returns the same record, and a request
  whose spawn gave up (released before it arrived) never queues.
The orphan adoption and the paused-container accounting are unit-tested in test_reconciler.py.
"""

from __future__ import annotations

import secrets
import signal
import tempfile
import time
from pathlib import Path

import pytest
import requests

from queue_service.engine.session_containers import SESSION_LABEL

from .engine_proxy import EngineProxy
from .harness import QueueUser, docker_client, relaunch, running_hub
from .harness import wait_until as until

pytestmark = pytest.mark.docker
OPTIONS = {"image": "python-3.11", "cpu": 0.5, "mem": "512M"}
FAST_RECONCILER = """
c.QueueService.reconcile_interval = {interval}
"""


def queue_service_pids(parent: int | None = None) -> set[int]:
    """Pids of `python -m queue_service` processes (children of `parent`, if given)."""
    return pids_of(b"queue_service", parent)


def pids_of(marker: bytes, parent: int | None = None) -> set[int]:
    """Pids of processes with `marker` in their command line (children of `parent`, if given)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if any(marker in part for part in command) and (parent is None or ppid == parent):
            pids.add(int(entry.name))
    return pids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def short_dir():
    """A short folder for Unix sockets (their paths are limited to about 100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="fgpu-", dir="/tmp"))
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def test_the_service_ends_with_a_killed_hub_and_the_next_one_takes_over(tmp_path, docker_engine):
    with running_hub(tmp_path / "hub") as hub:
        old = until(lambda: queue_service_pids(hub.process.pid), 30, "the queue service runs")
        old_culler = until(
            lambda: pids_of(b"jupyterhub_idle_culler", hub.process.pid), 30, "the culler runs"
        )
        # As an OOM kill does: no chance for the hub to stop its services.
        hub.process.send_signal(signal.SIGKILL)
        relaunch(hub)
        until(lambda: not any(alive(pid) for pid in old), 20, f"old service {old} ended")
        until(lambda: not any(alive(pid) for pid in old_culler), 20, "the old culler ended")
        new = until(lambda: queue_service_pids(hub.process.pid), 30, "a new service runs")
        assert not new & old
        user = QueueUser(hub, f"student-{secrets.token_hex(4)}")
        answer = until(
            lambda: (r := user.call("GET", "resources")).status_code == 200 and r,
            30,
            "the new service answers",
        )
        assert answer.json()["user"] == user.name
        assert "Address already in use" not in hub.log_text()
        # What a service manager stops with the hub (systemd's KillMode=mixed signals the hub
        # alone): its idle culler and its proxy as well.
        culler = until(
            lambda: pids_of(b"jupyterhub_idle_culler", hub.process.pid), 30, "the culler runs"
        )
        proxy = until(
            lambda: pids_of(b"configurable-http-proxy", hub.process.pid), 30, "the proxy runs"
        )
    # Stopped cleanly (SIGTERM to the hub alone): nothing it started is left either.
    left = new | culler | proxy
    until(lambda: not any(alive(pid) for pid in left), 20, f"{left} ended with their hub")


def test_the_service_starts_without_the_engine_refuses_at_once_and_recovers(
    tmp_path, short_dir, docker_engine, username
):
    engine = EngineProxy(short_dir / "engine.sock")  # nothing listens there yet
    env = {"DOCKER_HOST": engine.url}
    extra = FAST_RECONCILER.format(interval=1)
    try:
        with running_hub(tmp_path / "hub", env=env, extra_config=extra) as hub:
            started = time.monotonic()
            response = hub.start_server(username, OPTIONS)
            assert time.monotonic() - started < 10
            assert response.status_code == 503, response.text
            assert "Docker engine" in response.json()["message"], response.text
            assert hub.server_model(username) is None
            # A load balancer or probe hears it too, from the service's health (no token).
            health = requests.get(f"{hub.url}/services/queue/api/health", timeout=30)
            assert (health.status_code, health.json()) == (503, {"status": "fail"})
            engine.up()
            until(
                lambda: hub.start_server(username, OPTIONS).status_code in (201, 202),
                30,
                "a spawn succeeds once the engine is back",
                interval=1,
            )
            until(
                lambda: (
                    requests.get(f"{hub.url}/services/queue/api/health", timeout=30).json()
                    == {"status": "ok"}
                ),
                30,
                "the service's health is ok again",
                interval=1,
            )
            hub.wait_ready(username)
            hub.stop_server(username)
    finally:
        engine.down()


def test_a_stop_the_engine_refuses_keeps_the_grant_until_the_container_is_gone(
    tmp_path, short_dir, docker_engine, username
):
    engine = EngineProxy(short_dir / "spawner.sock")
    engine.up()
    # Only the spawner goes through the forwarder; the service reaches the engine directly.
    extra = f"c.DockerSpawner.client_kwargs = {{'base_url': {engine.url!r}}}\n"
    try:
        with running_hub(tmp_path / "hub", extra_config=extra) as hub:
            assert hub.start_server(username, OPTIONS).status_code in (201, 202)
            hub.wait_ready(username)
            user = QueueUser(hub, username)
            (session,) = user.sessions()
            engine.refuse("POST", r"/containers/[^/]+/stop")  # the spawner's stop now fails
            hub.request("DELETE", f"users/{username}/servers/")
            until(lambda: hub.server_model(username) is None, 60, "the hub forgot the server")
            # Until the container is gone its slice stays held: a record read as ended must
            # never be followed by a live container. The reconciler then stops it (retries).
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                status = session_status(user, session["id"])
                live = live_containers(session["id"])
                assert status == "RUNNING" or not live, f"released while it runs: {status}"
                if not live and status != "RUNNING":
                    break
                time.sleep(0.2)
            assert status == "ended"
            assert (
                docker_client().containers.list(
                    all=True, filters={"label": [f"{SESSION_LABEL}={session['id']}"]}
                )
                == []
            )
    finally:
        engine.down()


def live_containers(session_id: str) -> list:
    filters = {"label": f"{SESSION_LABEL}={session_id}", "status": ["running", "paused"]}
    return docker_client().containers.list(filters=filters)


def session_status(user: QueueUser, session_id: str) -> str:
    """The session's status while it is active; "ended" once it left the active list."""
    statuses = {record["id"]: record["status"] for record in user.sessions()}
    return statuses.get(session_id, "ended")


def test_grant_requests_are_idempotent_and_a_given_up_one_never_queues(hub, username):
    grants = requests.Session()
    grants.headers["Authorization"] = f"token {hub.spawner_token}"
    url = f"{hub.url}/services/queue/api/grants"
    hub.create_user(username)
    body = {"user": username, "server_name": "keyed", "image": "python-3.11", "cpu": 0.5}
    body["mem"] = 512 * 1024**2
    key = secrets.token_hex(16)
    first = grants.post(url, json={**body, "id": key}, timeout=60)
    again = grants.post(url, json={**body, "id": key}, timeout=60)
    assert first.status_code == again.status_code == 201, (first.text, again.text)
    assert first.json()["id"] == again.json()["id"] == key
    assert grants.delete(f"{url}/{key}", timeout=60).status_code == 200
    # A spawn that timed out releases its key before its request arrived.
    late = secrets.token_hex(16)
    assert grants.delete(f"{url}/{late}", timeout=60).status_code == 404
    refused = grants.post(url, json={**body, "server_name": "late", "id": late}, timeout=60)
    assert refused.status_code == 409, refused.text
    assert "given up" in refused.json()["message"]
    sessions = QueueUser(hub, username).sessions()
    assert [s for s in sessions if s["server_name"] == "late"] == []


def test_a_session_the_service_db_lost_is_adopted_and_ends_cleanly(tmp_path, docker_engine):
    """The service's DB is replaced by an empty one while a session runs (a lost or restored DB):
    the restarted service adopts the session from its container's labels, counts its slice, and
    the hub's stop then ends it as usual."""
    with running_hub(tmp_path / "hub") as hub:
        user = QueueUser(hub, f"student-{secrets.token_hex(4)}")
        assert hub.start_server(user.name, OPTIONS).status_code in (201, 202)
        hub.wait_ready(user.name)
        (session,) = user.sessions()
        (container,) = live_containers(session["id"])
        deployment = (hub.workdir / "fgpu_deployment_id").read_text().strip()
        assert container.labels["fgpu.deployment"] == deployment
        hub.process.terminate()  # sessions outlive a hub restart (cleanup_servers = False)
        for leftover in hub.workdir.glob("fgpu_queue.sqlite*"):
            leftover.unlink()
        relaunch(hub)
        (adopted,) = until(user.sessions, 30, "the session is adopted")
        assert (adopted["id"], adopted["status"]) == (session["id"], "RUNNING")
        assert adopted["grant"] == session["grant"]
        held = user.call("GET", "resources").json()["allocated"]
        assert (held["cpu"], held["mem"]) == (0.5, 512 * 1024**2)
        hub.stop_server(user.name)
        assert session_status(user, session["id"]) == "ended"
        assert live_containers(session["id"]) == []
