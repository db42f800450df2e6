"""A batch job's end by itself (queue_service/job_ends.py): the words of `finished` and `failed`,
and JobEnds.settle's decisions (end it, leave it to a stop under way, wait for the hub's spawn,
leave a running one alone), with a real QueueManager on SQLite and small stand-ins for the hub's
REST API and the engine (docker-py's containers, behind the real DockerEngine). The real engine's path, events and all, is
tests/test_batch_jobs_hub.py's."""

from __future__ import annotations

import asyncio
import logging

import pytest

from image_catalog.job_options import check_job
from queue_service import job_ends
from queue_service.core import end_reasons, resource_model
from queue_service.engine.docker_engine import DockerEngine
from queue_service.hub_client import HubError
from queue_service.job_ends import JobEnds, job_end
from queue_service.queue import QueueManager
from queue_service.queue_pass import SchedulerSettings
from queue_service.quotas import QuotaBook
from queue_service.store.db import open_database

from .harness import engine_backend

MIB = 1024**2
GIB = 1024**3
NODE = resource_model.Node("node-1", "default", cpu=4.0, mem=8 * GIB, gpus=())


# --- the words ----------------------------------------------------------------------------------


def test_exit_code_0_is_finished():
    assert job_end(0, "anything\n[fgpu job] exited with code 0\n") == (
        end_reasons.FINISHED,
        "finished: the job exited with code 0",
    )


def test_another_exit_code_is_failed_with_the_last_line_of_the_jobs_own_output():
    tail = (
        "[fgpu job] started 20261127-020000 UTC; this log is kept in ~/jobs/job-1.log\n"
        "epoch 1\n"
        "Traceback (most recent call last):\n"
        "ZeroDivisionError: division by zero\n"
        "\n"
        "   \n"
        "[fgpu job] exited with code 1\n"
    )
    assert job_end(1, tail) == (
        end_reasons.FAILED,
        "failed: the job exited with code 1; its last output: ZeroDivisionError: division by zero",
    )


@pytest.mark.parametrize(
    "tail",
    ["", "\n\n", "[fgpu job] started\n[fgpu job] command: exit 3\n[fgpu job] exited with code 3\n"],
)
def test_a_failed_job_without_output_of_its_own_says_its_code_alone(tail):
    assert job_end(3, tail) == (end_reasons.FAILED, "failed: the job exited with code 3")


def test_the_last_line_is_cut_at_300_characters():
    code, reason = job_end(137, "x" * 1000 + "\n")
    assert code == end_reasons.FAILED
    assert reason == "failed: the job exited with code 137; its last output: " + "x" * 300


def test_a_line_that_only_mentions_the_runner_prefix_is_the_jobs_own():
    assert job_end(2, "echo [fgpu job] x\n")[1].endswith("its last output: echo [fgpu job] x")


# --- JobEnds.settle -----------------------------------------------------------------------------


class Container:
    def __init__(self, session_id: str, state: dict, logs: bytes = b""):
        self.id = f"c-{session_id}"
        self.session_id = session_id
        self.attrs = {"State": state}
        self.logs = logs
        self.removed = False

    def remove(self, v=False, force=False):
        assert (v, force) == (True, True)
        self.removed = True


class Engine:
    """docker-py's client, as far as engine/job_containers.py uses it."""

    def __init__(self):
        self.found: dict[str, Container] = {}
        self.containers = self
        self.api = self

    def list(self, all=False, filters=None, ignore_removed=False):
        assert all and ignore_removed
        session_id = filters["label"].removeprefix("fgpu.session_id=")
        found = self.found.get(session_id)
        return [found] if found is not None and not found.removed else []

    def logs(self, container_id, tail=None):
        return next(c.logs for c in self.found.values() if c.id == container_id)


class Hub:
    """The hub's REST API as JobEnds asks it: a user's servers, a server's stop."""

    def __init__(self):
        self.pending: str | None = None
        self.fails: Exception | None = None
        self.stop_fails: Exception | None = None
        self.stopped: list[tuple[str, str]] = []

    async def user_now(self, user):
        if self.fails:
            raise self.fails
        return {"servers": {"job-1": {"pending": self.pending}}}

    async def stop_server(self, user, server_name):
        if self.stop_fails:
            raise self.stop_fails
        self.stopped.append((user, server_name))


@pytest.fixture
def manager(tmp_path):
    db = open_database(f"sqlite:///{tmp_path / 'queue.sqlite'}")
    yield QueueManager(db, (NODE,), SchedulerSettings(), QuotaBook())
    db.kw["bind"].dispose()


@pytest.fixture
def parts(manager):
    engine, hub = Engine(), Hub()
    # The real single-host backend over the stand-in engine.
    backend = engine_backend(DockerEngine, engine)
    return JobEnds(manager, hub, backend, log=logging.getLogger("test")), engine, hub


def request(server="job-1", **job) -> dict:
    ask = {
        "user": "alice",
        "server_name": server,
        "image": "python-3.11",
        "cpu": 1.0,
        "mem": 512 * MIB,
        "fgpu": 0.0,
    }
    if job:
        ask["job"] = check_job({"type": "batch", **job})
    return ask


async def running_job(manager, **job) -> str:
    view = await manager.submit(request(**(job or {"command": "echo hi"})), groups=())
    assert view["status"] == "SCHEDULED"
    await manager.mark_running(view["id"])
    return view["id"]


def exited(session_id: str, code: int, output: str) -> Container:
    return Container(session_id, {"Running": False, "ExitCode": code}, output.encode())


async def test_an_exited_job_ends_with_its_code_its_log_is_kept_and_its_server_stopped(
    manager, parts
):
    ends, engine, hub = parts
    session_id = await running_job(manager)
    container = engine.found[session_id] = exited(
        session_id, 1, "step\nValueError: bad\n[fgpu job] exited with code 1\n"
    )

    assert await ends.settle(session_id) is True

    view = await manager.get(session_id)
    assert (view["status"], view["end_reason"], view["exit_code"]) == ("TERMINATED", "failed", 1)
    assert view["reason"] == "failed: the job exited with code 1; its last output: ValueError: bad"
    assert await manager.job_log(session_id) == container.logs.decode()
    assert hub.stopped == [("alice", "job-1")]
    assert container.removed
    # Settled again (an event and a reconciler round both saw it): nothing more to do.
    assert await ends.settle(session_id) is False
    assert hub.stopped == [("alice", "job-1")]


async def test_a_job_that_exited_0_is_finished(manager, parts):
    ends, engine, _ = parts
    session_id = await running_job(manager)
    engine.found[session_id] = exited(session_id, 0, "hi\n")
    assert await ends.settle(session_id) is True
    view = await manager.get(session_id)
    assert (view["end_reason"], view["exit_code"]) == ("finished", 0)


async def test_a_running_job_is_left_alone_and_a_removed_one_is_the_reconcilers(manager, parts):
    ends, engine, hub = parts
    session_id = await running_job(manager)
    engine.found[session_id] = Container(session_id, {"Running": True})
    assert await ends.settle(session_id) is True  # handled: it runs
    engine.found[session_id] = Container(session_id, {"Running": False, "Paused": True})
    assert await ends.settle(session_id) is True
    del engine.found[session_id]
    assert await ends.settle(session_id) is False  # no container: lost, for the reconciler
    assert (await manager.get(session_id))["status"] == "RUNNING"
    assert hub.stopped == []


async def test_a_job_the_hub_is_stopping_is_left_to_its_stop(manager, parts):
    """A cancel or a time limit stops the container through the hub: the spawner's release
    names the end, not the exit's 143."""
    ends, engine, hub = parts
    session_id = await running_job(manager)
    engine.found[session_id] = exited(session_id, 143, "")
    manager.expect_end(session_id, end_reasons.TIMEOUT, "timeout: ...")
    hub.pending = "stop"
    assert await ends.settle(session_id) is True
    assert (await manager.get(session_id))["status"] == "RUNNING"
    assert not engine.found[session_id].removed


async def test_a_job_that_exits_as_the_service_stops_it_ends_with_the_stops_reason(manager, parts):
    """The time limit fired as the job exited by itself: the hub finds it exited and never
    calls the spawner, so no release comes; the exit is ended with the stop's reason, its log
    kept, and the container removed."""
    ends, engine, hub = parts
    session_id = await running_job(manager)
    engine.found[session_id] = exited(session_id, 0, "done\n")
    manager.expect_end(session_id, end_reasons.TIMEOUT, "timeout: the job ran for 1 min")
    assert await ends.settle(session_id) is True
    view = await manager.get(session_id)
    assert (view["status"], view["end_reason"], view["reason"], view["exit_code"]) == (
        "TERMINATED",
        "timeout",
        "timeout: the job ran for 1 min",
        0,
    )
    assert await manager.job_log(session_id) == "done\n"
    assert engine.found[session_id].removed
    assert manager.take_expected_end(session_id) is None


async def test_a_job_that_exits_during_its_spawn_is_ended_once_the_spawn_is_over(manager, parts):
    ends, engine, hub = parts
    session_id = await running_job(manager)
    engine.found[session_id] = exited(session_id, 0, "quick\n")
    hub.pending = "spawn"
    assert await ends.settle(session_id) is True
    assert await ends.settle(session_id) is True  # asked again: one wait, not two
    assert len(ends._tasks) == 1
    assert (await manager.get(session_id))["status"] == "RUNNING"
    hub.pending = None
    await asyncio.wait_for(asyncio.gather(*ends._tasks), timeout=10)
    assert (await manager.get(session_id))["end_reason"] == "finished"
    assert hub.stopped == [("alice", "job-1")]


async def test_when_the_hub_does_not_answer_the_exit_still_ends_the_job(manager, parts):
    ends, engine, hub = parts
    session_id = await running_job(manager)
    container = engine.found[session_id] = exited(session_id, 0, "")
    hub.fails = HubError("the hub is restarting", 503)
    hub.stop_fails = OSError("connection refused")
    assert await ends.settle(session_id) is True
    assert (await manager.get(session_id))["end_reason"] == "finished"
    assert container.removed  # removed here, the hub's stop having failed


async def test_only_an_active_job_is_settled(manager, parts):
    ends, engine, _ = parts
    assert await ends.settle("0" * 32) is False  # no such record
    session = (await manager.submit(request(server="notebook"), groups=()))["id"]
    engine.found[session] = exited(session, 0, "")
    assert await ends.settle(session) is False  # an interactive session: the reconciler's
    # A job still waiting (the node is full) has no container to settle.
    await manager.submit(request(server="big", command="x"), groups=())
    waiting = (await manager.submit({**request(server="w", command="x"), "cpu": 4.0}, groups=()))[
        "id"
    ]
    assert (await manager.get(waiting))["status"] == "PENDING"
    assert await ends.settle(waiting) is False


def test_the_prefix_left_out_is_the_one_the_runner_writes():
    from pathlib import Path

    from fgpu_spawner import job_runner

    source = Path(job_runner.__file__).read_text()
    assert source.count(f'say(f"{job_ends.RUNNER_PREFIX} ') >= 5
