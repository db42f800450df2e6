"""`queue_service.job_ends.JobEnds.settle` through the engine backend's seam (`job_exit`,
`remove_job`), with fakes: the same settle ends a job on one engine and on a Swarm."""

from __future__ import annotations

import pytest

from queue_service.job_ends import JobEnds


class FakeManager:
    def __init__(self, status: str = "RUNNING"):
        self.view = {"type": "batch", "status": status, "user": "ada", "server_name": "job-1"}
        self.ended: list[tuple] = []

    async def get(self, session_id: str) -> dict:
        return self.view

    def expects_end(self, session_id: str) -> bool:
        return False

    async def end_job(self, session_id, code, reason, exit_code, tail) -> None:
        self.ended.append((session_id, code, exit_code, tail))


class FakeHub:
    def __init__(self):
        self.stopped: list[tuple[str, str]] = []

    async def user_now(self, name: str) -> dict:
        return {"servers": {"job-1": {"pending": None}}}

    async def stop_server(self, user: str, server_name: str) -> None:
        self.stopped.append((user, server_name))


class FakeBackend:
    client = None

    def __init__(self, found):
        self.found = found
        self.removed: list[str] = []

    def job_exit(self, session_id: str):
        return self.found

    def remove_job(self, session_id: str) -> None:
        self.removed.append(session_id)


@pytest.mark.parametrize(
    ("found", "code"), [((0, "done\n"), "finished"), ((3, "oops\n[fgpu job] exited"), "failed")]
)
async def test_an_exit_ends_the_job_with_its_code_stops_its_server_and_removes_it(found, code):
    manager, hub, backend = FakeManager(), FakeHub(), FakeBackend(found)
    assert await JobEnds(manager, hub, backend).settle("s1") is True
    assert manager.ended == [("s1", code, found[0], found[1])]
    assert hub.stopped == [("ada", "job-1")]
    assert backend.removed == ["s1"]


async def test_a_running_job_is_left_running():
    manager, backend = FakeManager(), FakeBackend((None, ""))
    assert await JobEnds(manager, FakeHub(), backend).settle("s1") is True
    assert manager.ended == [] and backend.removed == []


async def test_no_exit_of_its_own_leaves_the_job_to_the_reconcilers_lost_path():
    """Removed, or (on a Swarm) a task on a lost node or ended by Swarm itself."""
    manager, backend = FakeManager(), FakeBackend(None)
    assert await JobEnds(manager, FakeHub(), backend).settle("s1") is False
    assert manager.ended == [] and backend.removed == []
