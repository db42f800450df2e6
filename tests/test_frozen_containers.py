"""A frozen session container is thawed: the freezer files, then real containers on this engine
(cgroup v1 here), then a real hub whose student's container is frozen while the engine is stuck
on an exec inside it, as a "Save image" once left one."""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from pathlib import Path

import pytest
import requests

from queue_service.engine.container_calls import ContainerCalls
from queue_service.engine.frozen_containers import (
    CGROUP_ROOT,
    FreezeWatch,
    freezer_file,
    freezer_value,
    is_frozen,
    read_frozen,
)
from queue_service.engine.session_containers import running_session_containers

from .harness import TEST_LABEL, QueueUser, docker_client
from .test_storage import start_session

IMAGE = "fgpu/jupyter-base:py3.11"

# --- the freezer files ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "relative",
    [
        "freezer/docker/{id}/freezer.state",
        "freezer/system.slice/docker-{id}.scope/freezer.state",
        "docker/{id}/cgroup.freeze",
        "system.slice/docker-{id}.scope/cgroup.freeze",
    ],
)
def test_the_freezer_file_is_found_under_either_cgroup_version_and_driver(tmp_path, relative):
    path = tmp_path / relative.format(id="abc")
    path.parent.mkdir(parents=True)
    path.write_text("THAWED\n")
    assert freezer_file("abc", tmp_path) == path
    assert freezer_file("other", tmp_path) is None


def test_frozen_and_thawed_are_read_and_written_in_each_versions_words(tmp_path):
    assert is_frozen("FROZEN\n") and is_frozen("FREEZING") and is_frozen("1\n")
    assert not is_frozen("THAWED\n") and not is_frozen("0\n")
    assert freezer_value(Path("x/freezer.state"), frozen=False) == "THAWED"
    assert freezer_value(Path("x/freezer.state"), frozen=True) == "FROZEN"
    assert freezer_value(Path("x/cgroup.freeze"), frozen=False) == "0"
    assert freezer_value(Path("x/cgroup.freeze"), frozen=True) == "1"
    assert read_frozen(tmp_path / "gone" / "freezer.state") is False


# --- real containers --------------------------------------------------------------------------


@pytest.fixture
def session_container(docker_engine):
    """A live container that looks like a session to the service (its session label)."""
    session_id = secrets.token_hex(8)
    container = docker_engine.containers.run(
        IMAGE,
        ["sleep", "600"],
        detach=True,
        labels={"fgpu.session_id": session_id, TEST_LABEL: "frozen-containers"},
    )
    yield session_id, container
    thaw_by_hand(container.id)
    container.remove(force=True)


def freeze_by_hand(container_id: str) -> Path:
    """What a stuck `runc exec` once left: the cgroup frozen behind the engine's back."""
    path = freezer_file(container_id)
    assert path is not None, f"no freezer for {container_id} under {CGROUP_ROOT}"
    path.write_text(freezer_value(path, frozen=True))
    assert read_frozen(path)
    return path


def thaw_by_hand(container_id: str) -> None:
    path = freezer_file(container_id)
    if path is not None:
        path.write_text(freezer_value(path, frozen=False))


def listing(docker_engine, session_id: str) -> dict:
    return running_session_containers(docker_engine, session_id)


@pytest.mark.docker
async def test_a_container_frozen_behind_the_engines_back_is_thawed_after_the_bound(
    docker_engine, session_container
):
    session_id, container = session_container
    path = freeze_by_hand(container.id)
    now = [1000.0]
    watch = FreezeWatch(ContainerCalls(), docker_engine, thaw_after=30, clock=lambda: now[0])
    await watch.check(listing(docker_engine, session_id))
    assert read_frozen(path)  # a moment's freeze is left alone
    assert watch.frozen() == [{"container": container.id[:12], "session_id": session_id, "for": 0}]
    now[0] += 30
    await watch.check(listing(docker_engine, session_id))
    assert not read_frozen(path)
    (thaw,) = watch.thaws()
    assert (thaw.session_id, thaw.frozen_for) == (session_id, 30)
    assert "THAWED" in thaw.how and watch.frozen() == []
    assert container.exec_run(["true"]).exit_code == 0  # it answers again


@pytest.mark.docker
async def test_a_container_paused_through_the_engine_is_unpaused_through_it(
    docker_engine, session_container
):
    session_id, container = session_container
    container.pause()
    watch = FreezeWatch(ContainerCalls(), docker_engine, thaw_after=0)
    await watch.check(listing(docker_engine, session_id))
    container.reload()
    assert container.status == "running"
    (thaw,) = watch.thaws()
    assert thaw.how == "docker unpause"


class IncidentMaker:
    """Makes the incident again on one container: commits that pause it (`pause=True`, as the
    service's commits once did) while execs keep entering it, until one leaves it frozen and the
    engine's calls about it hang. `stop()` ends the execs and commits (the container stays as
    they left it); the hung commit ends once the container is thawed."""

    def __init__(self, container):
        self.container = container
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._execs, daemon=True) for _ in range(3)]
        self._threads.append(threading.Thread(target=self._commits, daemon=True))
        for thread in self._threads:
            thread.start()

    def stop(self, wait: float = 0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(wait)

    def _execs(self):
        while not self._stop.is_set():
            try:
                self.container.exec_run(["sh", "-c", "echo x > /tmp/x"])
            except Exception:  # the engine gave up on it: keep entering
                time.sleep(0.2)

    def _commits(self):
        client = docker_client()
        while not self._stop.is_set():
            try:
                client.api.commit(self.container.id, repository=PAUSED_COMMITS, pause=True)
            except Exception:  # it hung until the engine's client gave up: what this is for
                return


PAUSED_COMMITS = "fgpu-test/paused-commit"


async def until_the_engine_hangs_on(calls, docker_engine, container, session_id, others=()):
    """Inspect `container` (and `others`, which must answer every time) until the engine does not
    answer about it within `calls`' timeout."""
    inspect = docker_engine.api.inspect_container
    for _ in range(40):
        await asyncio.sleep(0.5)
        answers = await asyncio.gather(
            calls.call(container.id, session_id, "inspect", inspect, container.id),
            *(calls.call(o.id, "other", "inspect", inspect, o.id) for o in others),
            return_exceptions=True,
        )
        assert [a["Id"] for a in answers[1:]] == [o.id for o in others]  # never held up
        if isinstance(answers[0], Exception):
            return
    raise AssertionError("the engine never hung on the container")


def remove_paused_commits(docker_engine) -> None:
    for image in docker_engine.images.list(PAUSED_COMMITS):
        docker_engine.images.remove(image.id, force=True)


@pytest.mark.docker
async def test_the_engine_stuck_as_a_paused_commit_left_it_answers_again_after_the_thaw(
    docker_engine, session_container
):
    """The incident, made again: calls about another container still answer, the stuck one is
    reported, and the watch's thaw frees it, the engine's state following in the next round."""
    session_id, container = session_container
    other = docker_engine.containers.run(
        IMAGE, ["sleep", "600"], detach=True, labels={TEST_LABEL: "frozen-containers"}
    )
    incident = IncidentMaker(container)
    try:
        calls = ContainerCalls(timeout=3)
        await until_the_engine_hangs_on(calls, docker_engine, container, session_id, [other])
        assert [m.session_id for m in calls.unresponsive()] == [session_id]
        incident.stop()
        watch = FreezeWatch(calls, docker_engine, thaw_after=0, log=logging.getLogger("watch"))
        await watch.check(listing(docker_engine, session_id))
        assert [t.session_id for t in watch.thaws()] == [session_id]
        incident.stop(wait=60)
        started = time.monotonic()
        container.reload()
        assert time.monotonic() - started < 5, "the engine still hangs on the container"
        # The engine's own state still says paused: the next round unpauses it through the engine.
        await watch.check(listing(docker_engine, session_id))
        container.reload()
        assert container.status == "running"
        assert container.exec_run(["true"]).exit_code == 0
    finally:
        incident.stop()
        other.remove(force=True)
        remove_paused_commits(docker_engine)


# --- a real hub -------------------------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.hub
async def test_a_session_the_engine_hangs_on_stalls_neither_the_hub_nor_the_queue_and_is_thawed(
    hub, docker_engine
):
    """The incident on a real hub: the engine hangs on a student's container, and the hub is
    asked to stop that server (its call hangs). Another student's spawn still starts; the service
    names the container in `api/health`, thaws it (the `hub` fixture's service waits
    `thaw_frozen_after` = 30 s), and the stop then goes through."""
    stuck_user, other_user = (f"student-{secrets.token_hex(4)}" for _ in range(2))
    container = start_session(hub, stuck_user)
    session_id = container.labels["fgpu.session_id"]
    incident = IncidentMaker(container)
    try:
        calls = ContainerCalls(timeout=3)
        await until_the_engine_hangs_on(calls, docker_engine, container, session_id)
        incident.stop()
        path = freezer_file(container.id)
        stopping = threading.Thread(target=hub.stop_server, args=(stuck_user,), daemon=True)
        stopping.start()
        started = time.monotonic()
        options = {"image": "python-3.11", "cpu": 0.5, "mem": "512M"}
        response = await asyncio.to_thread(hub.start_server, other_user, options)
        assert response.status_code in (201, 202), response.text
        await asyncio.to_thread(hub.wait_ready, other_user, "", 60)
        # Ready while the other is still frozen: the spawn did not wait behind the stuck calls.
        assert read_frozen(path), "the spawn waited for the thaw (or for the engine's timeout)"
        admin = QueueUser(hub, "admin")
        thawed = await asyncio.to_thread(
            wait_for_check, admin, lambda m: f"session {session_id}" in m and "thawed" in m
        )
        assert "frozen" in thawed
        stopping.join(120)
        assert not stopping.is_alive() and hub.server_model(stuck_user) is None
        assert "freeze watch: thawed the container" in hub.log_text()
        assert time.monotonic() - started < 180
    finally:
        incident.stop()
        thaw_by_hand(container.id)
        remove_paused_commits(docker_engine)


def wait_for_check(admin: QueueUser, matches, timeout: float = 90) -> str:
    """The `containers` health check's message once `matches` it."""
    deadline, message = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        try:
            answer = admin.call("GET", "health").json()
        except requests.RequestException:
            answer = {}
        found = [c for c in answer.get("checks", []) if c["name"] == "containers"]
        message = found[0]["message"] if found else ""
        if matches(message):
            return message
        time.sleep(1)
    raise AssertionError(f"the containers check never matched; it said: {message!r}")
