"""Private images, against a real hub, service and dockerd.

- Saving a session as an image must not end it, nor pause it: the commit copies the container
  while it runs (a paused commit once froze a session for good), and no reconciler pass meanwhile
  takes it for a lost one.
- A student's private image is known by what the engine resolves a reference to (its owner label,
  its private repository tag), so an instructor cannot list it under another spelling.

The hub here is one of this module's own: its reconciler runs every second, so that many passes
fall within one commit.
"""

from __future__ import annotations

import json
import secrets
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from .conftest import shared_hub
from .harness import QueueUser
from .test_storage import start_session

SHARED_BASE = "fgpu/jupyter-base:py3.11"
#: Written into the session's writable layer: the commit then takes about ten seconds here.
BALLAST = "1G"
RECONCILE_INTERVAL = 1.0

FAST_RECONCILER = f"""
c.QueueService.reconcile_interval = {RECONCILE_INTERVAL}
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory, docker_engine):
    """A hub of this module (the name `hub` also lets conftest stop each test's servers)."""
    yield from shared_hub("hub-images", tmp_path_factory, extra_config=FAST_RECONCILER)


def commit(admin: QueueUser, session_id: str, tag: str):
    return admin.call("POST", f"sessions/{session_id}/image", json={"tag": tag})


def session_status(admin: QueueUser, session_id: str) -> str:
    """The record's status; "ended" once it has left the active sessions."""
    return {s["id"]: s["status"] for s in admin.sessions()}.get(session_id, "ended")


@pytest.mark.docker
@pytest.mark.hub
def test_a_long_commit_keeps_the_session_running_unpaused_with_its_slots(hub, docker_engine):
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
        # The commit spanned several reconciler passes, never paused the session ...
        assert time.monotonic() - began > 3 * RECONCILE_INTERVAL
        assert paused_for == 0, f"paused {paused_for:.1f} s"
        # ... and none of the passes took it for a lost one.
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


@pytest.fixture(scope="module")
def private_image(hub, docker_engine):
    """A student's session saved by the admin: the private image and its catalog entry."""
    owner = f"student-{secrets.token_hex(4)}"
    container = start_session(hub, owner)
    admin = QueueUser(hub, "admin")
    response = commit(admin, container.labels["fgpu.session_id"], "t1")
    hub.stop_server(owner)
    assert response.status_code == 201, response.text
    image = docker_engine.images.get(response.json()["image"])
    other_tag = f"fgpu-test/relisted-{secrets.token_hex(3)}:copy"
    image.tag(other_tag)
    yield {
        "reference": response.json()["image"],
        "id": image.id,
        "other_tag": other_tag,
        "owner": owner,
        "name": response.json()["catalog"]["name"],
    }
    admin.call("DELETE", f"images/{response.json()['catalog']['name']}")
    docker_engine.images.remove(image.id, force=True)


@pytest.fixture(scope="module")
def teacher(hub):
    name = f"teacher-{secrets.token_hex(4)}"
    hub.create_user(name)
    response = hub.request("POST", "groups/instructors/users", json={"users": [name]})
    assert response.status_code == 200, response.text
    return QueueUser(hub, name)  # its token carries the instructors' manage scope


@pytest.fixture(scope="module")
def shared_entry(hub, teacher):
    """A shared catalog entry the instructor curates."""
    name = f"shared-{secrets.token_hex(3)}"
    added = teacher.call("POST", "images", json={"name": name, "image": SHARED_BASE})
    assert added.status_code == 201, added.text
    yield name
    QueueUser(hub, "admin").call("DELETE", f"images/{name}")


SPELLINGS = {
    "docker.io": lambda image: f"docker.io/{image['reference']}",
    "sha256-id": lambda image: image["id"],
    "short-id": lambda image: image["id"].removeprefix("sha256:")[:12],
    "other-tag": lambda image: image["other_tag"],
}


def catalog(admin: QueueUser) -> str:
    response = admin.call("GET", "images?all=1")
    assert response.status_code == 200, response.text
    return json.dumps(sorted(response.json()["images"], key=lambda image: image["name"]))


@pytest.mark.docker
@pytest.mark.hub
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_instructors_cannot_list_a_private_image_under_another_spelling(
    hub, private_image, teacher, shared_entry, spelling
):
    admin = QueueUser(hub, "admin")
    reference = SPELLINGS[spelling](private_image)
    name = f"relist-{secrets.token_hex(3)}"
    before = catalog(admin)
    try:
        for method, path, body in [
            ("POST", "images", {"name": name, "image": reference}),
            ("PATCH", f"images/{shared_entry}", {"image": reference}),
        ]:
            answer = teacher.call(method, path, json=body)
            assert answer.status_code == 403, (method, reference, answer.text)
            message = answer.json()["message"]
            assert "private image" in message and "only admins" in message, message
        assert catalog(admin) == before
    finally:
        admin.call("DELETE", f"images/{name}")


@pytest.mark.docker
@pytest.mark.hub
def test_admins_still_list_a_private_image_under_any_spelling(hub, private_image, shared_entry):
    admin = QueueUser(hub, "admin")
    name = f"relist-{secrets.token_hex(3)}"
    try:
        listed = admin.call(
            "POST", "images", json={"name": name, "image": SPELLINGS["sha256-id"](private_image)}
        )
        assert listed.status_code == 201, listed.text
        by_hub_name = SPELLINGS["docker.io"](private_image)
        moved = admin.call("PATCH", f"images/{shared_entry}", json={"image": by_hub_name})
        assert moved.status_code == 200, moved.text
        assert moved.json()["image"] == by_hub_name
    finally:
        admin.call("DELETE", f"images/{name}")


@pytest.mark.docker
@pytest.mark.hub
def test_instructors_cannot_read_another_users_images_with_user(hub, private_image, teacher):
    """`?user=` answers what that user may start, private images included: admins' and the
    spawner's alone, not the instructors' (who curate the shared catalog only)."""
    owner, name = private_image["owner"], private_image["name"]
    for path in (f"images?user={owner}", f"images/{name}?user={owner}"):
        answer = teacher.call("GET", path)
        assert answer.status_code == 403, (path, answer.text)
        assert "Only admins" in answer.json()["message"]
        assert private_image["reference"] not in answer.text
    # Their own list still answers; the admin still reads the owner's.
    assert teacher.call("GET", f"images?user={teacher.name}").status_code == 200
    listed = QueueUser(hub, "admin").call("GET", f"images?user={owner}").json()["images"]
    assert name in {image["name"] for image in listed}
