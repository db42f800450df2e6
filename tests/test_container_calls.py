"""Bounded engine calls about one container, and the per-session lock between commits and execs."""

from __future__ import annotations

import asyncio
import threading

import docker.errors
import pytest
import requests

from queue_service.engine.container_calls import (
    ContainerCalls,
    ContainerLocks,
    ContainerUnresponsive,
    timed_out,
)


class Blocking:
    """A call that does not answer until released; counts how often it was started."""

    def __init__(self):
        self.release = threading.Event()
        self.started = 0

    def __call__(self, value):
        self.started += 1
        self.release.wait(10)
        return value


async def settled(calls: ContainerCalls, container_id: str) -> None:
    for _ in range(200):
        if container_id not in calls._in_flight:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the call about {container_id} never settled")


async def test_an_answered_call_gives_its_value_and_marks_nothing():
    calls = ContainerCalls(timeout=5)
    assert await calls.call("c1", "s1", "stats", lambda x: x * 2, 21) == 42
    assert calls.unresponsive() == []


async def test_a_call_not_answered_in_time_marks_its_container_and_the_caller_goes_on():
    calls, stuck = ContainerCalls(timeout=0.2, clock=lambda: 1000.0), Blocking()
    with pytest.raises(ContainerUnresponsive, match="did not answer exec about c1"):
        await calls.call("c1", "s1", "exec", stuck, "x")
    (mark,) = calls.unresponsive()
    assert (mark.container_id, mark.session_id, mark.what, mark.since) == ("c1", "s1", "exec", 1000)
    # Another container is not held up by it.
    assert await calls.call("c2", "s2", "stats", lambda: "fine") == "fine"
    stuck.release.set()


async def test_no_second_call_starts_about_a_container_whose_call_is_in_flight():
    calls, stuck = ContainerCalls(timeout=0.2), Blocking()
    with pytest.raises(ContainerUnresponsive):
        await calls.call("c1", "s1", "stats", stuck, "x")
    with pytest.raises(ContainerUnresponsive, match="has not been answered"):
        await calls.call("c1", "s1", "stats", stuck, "x")
    assert stuck.started == 1  # one thread held at most, whatever the rounds
    stuck.release.set()


async def test_the_mark_goes_once_the_container_answers_again():
    calls, stuck = ContainerCalls(timeout=0.2), Blocking()
    with pytest.raises(ContainerUnresponsive):
        await calls.call("c1", "s1", "stats", stuck, "x")
    stuck.release.set()
    await settled(calls, "c1")
    assert calls.unresponsive() == []
    assert await calls.call("c1", "s1", "stats", stuck, "again") == "again"


async def test_a_call_that_ends_in_a_read_timeout_keeps_the_mark():
    calls, release = ContainerCalls(timeout=0.2), threading.Event()

    def times_out():
        release.wait(10)
        raise requests.exceptions.ReadTimeout("Read timed out. (read timeout=30)")

    with pytest.raises(ContainerUnresponsive):
        await calls.call("c1", "s1", "stats", times_out)
    release.set()
    await settled(calls, "c1")
    assert [m.container_id for m in calls.unresponsive()] == ["c1"]
    calls.forget(keep=set())  # the container is gone: so is its mark
    assert calls.unresponsive() == []


def test_timeouts_are_told_from_other_errors():
    assert timed_out(requests.exceptions.ReadTimeout("x"))
    assert timed_out(requests.exceptions.ConnectionError("Read timed out. (read timeout=30)"))
    assert not timed_out(docker.errors.NotFound("No such container"))
    assert not timed_out(None)


def test_an_exec_is_skipped_while_a_commit_holds_the_session():
    locks, inside, leave = ContainerLocks(), threading.Event(), threading.Event()

    def commit():
        with locks.committing("s1"):
            inside.set()
            leave.wait(10)

    committer = threading.Thread(target=commit)
    committer.start()
    assert inside.wait(10)
    with locks.exec_unless_committing("s1") as held:
        assert held is False
    with locks.exec_unless_committing("s2") as held:
        assert held is True  # another session is not held
    leave.set()
    committer.join(10)
    with locks.exec_unless_committing("s1") as held:
        assert held is True


def test_a_commit_waits_for_an_exec_in_progress():
    locks, order = ContainerLocks(), []
    with locks.exec_unless_committing("s1") as held:
        assert held
        committer = threading.Thread(
            target=lambda: locks.committing("s1").__enter__() or order.append("commit")
        )
        committer.start()
        committer.join(0.3)
        order.append("exec done")
    committer.join(10)
    assert order == ["exec done", "commit"]


def test_execs_into_one_session_share_it_and_a_commit_waits_for_them_all():
    """Two SSH logins into one session (or a login and the end warnings) at once both enter."""
    locks, order = ContainerLocks(), []
    with locks.exec_unless_committing("s1") as first:
        with locks.exec_unless_committing("s1") as second:
            assert (first, second) == (True, True)
            committer = threading.Thread(
                target=lambda: locks.committing("s1").__enter__() or order.append("commit")
            )
            committer.start()
            committer.join(0.3)
            with locks.exec_unless_committing("s1") as third:
                assert third is False  # none starts while a commit waits
            order.append("second done")
        order.append("first done")
    committer.join(10)
    assert order == ["second done", "first done", "commit"]
