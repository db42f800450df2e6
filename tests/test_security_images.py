"""Issue 11, private images (items 2 and 5), against a real hub, service and dockerd.

- Saving a session as an image must not end it: the engine pauses the container while it commits
  it, and a reconciler pass meanwhile must take the paused container for a live one.

The hub here is one of this module's own: its reconciler runs every second, so that many passes
fall within one commit.
"""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from .harness import QueueUser, running_hub
from .test_storage import start_session

#: Written into the session's writable layer: the commit then takes about ten seconds here.
BALLAST = "1G"
RECONCILE_INTERVAL = 1.0

FAST_RECONCILER = f"""
for service in c.JupyterHub.services:
    if service["name"] == "queue":
        service["command"].append("--QueueService.reconcile_interval={RECONCILE_INTERVAL}")
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory, docker_engine):
    """A hub of this module (the name `hub` also lets conftest stop each test's servers)."""
    with running_hub(tmp_path_factory.mktemp("hub-images"), extra_config=FAST_RECONCILER) as hub:
        yield hub


def commit(admin: QueueUser, session_id: str, tag: str):
    return admin.call("POST", f"sessions/{session_id}/image", json={"tag": tag})


def session_status(admin: QueueUser, session_id: str) -> str:
    """The record's status; "ended" once it has left the active sessions."""
    return {s["id"]: s["status"] for s in admin.sessions()}.get(session_id, "ended")


@pytest.mark.docker
@pytest.mark.hub
def test_a_long_commit_keeps_the_session_running_with_its_slots(hub, docker_engine):
    owner = f"student-{secrets.token_hex(4)}"
    container = start_session(hub, owner)
    session_id = container.labels["fgpu.session_id"]
    admin, student = QueueUser(hub, "admin"), QueueUser(hub, owner)
    reference = f"fgpu-private/{owner}:big"
    try:
        # Into the writable layer (not the home volume), which the commit copies.
        written = container.exec_run(["sh", "-c", f"head -c {BALLAST} /dev/zero >/var/tmp/big"])
        assert written.exit_code == 0, written.output
        slots = student.call("GET", "resources").json()["allocated"]
        assert slots["cpu"] == 0.5, slots

        seen, paused_for, began = set(), 0.0, time.monotonic()
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(commit, admin, session_id, "big")
            while not answer.done():
                started = time.monotonic()
                container.reload()
                seen.add(session_status(admin, session_id))
                time.sleep(0.2)
                if container.status == "paused":
                    paused_for += time.monotonic() - started
            response = answer.result()
        print(f"commit of {BALLAST}: {time.monotonic() - began:.1f} s, paused {paused_for:.1f} s")

        assert response.status_code == 201, response.text
        assert response.json()["image"] == reference
        assert docker_engine.images.get(reference).labels["fgpu.private-owner"] == owner
        # The commit really paused the session across several reconciler passes ...
        assert paused_for > 3 * RECONCILE_INTERVAL, f"paused only {paused_for:.1f} s"
        # ... and none of them took it for a lost one.
        assert seen == {"RUNNING"}, seen
        assert session_status(admin, session_id) == "RUNNING"
        assert student.call("GET", "resources").json()["allocated"] == slots
        container.reload()
        assert container.status == "running"
        assert hub.server_model(owner)["ready"]
    finally:
        hub.stop_server(owner)
        # The catalog entry goes with the big image: nothing of it stays on the engine.
        admin.call("DELETE", f"images/{owner}-big")
        for image in docker_engine.images.list(name=f"fgpu-private/{owner}"):
            docker_engine.images.remove(image.id, force=True)
