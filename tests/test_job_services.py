"""`queue_service.engine.job_services`: a batch job's exit on a Swarm, read from its task as the
manager lists it. The `Status` shapes are the lab's (dockerd 20.10, API 1.41), as
test_swarm_hub.py's `test_a_job_services_exit_code_and_log_are_read_from_the_manager` printed
them; a zero `ExitCode` left out (Go's omitempty, in other versions) reads as 0 too."""

import pytest

from queue_service.engine.job_services import exited_sessions, newest_task, task_exit_code
from queue_service.engine.session_services import live_sessions


def task(state: str, message: str, err: str | None = None, container=None, created="1") -> dict:
    status = {"Timestamp": "2026-11-27T03:00:00.1Z", "State": state, "Message": message}
    if err:
        status["Err"] = err
    if container is not None:
        status["ContainerStatus"] = container
    status["PortStatus"] = {}
    return {
        "ID": f"task-{created}",
        "ServiceID": "svc-1",
        "NodeID": "n1",
        "CreatedAt": created,
        "DesiredState": "shutdown" if state not in ("running", "starting") else "running",
        "Status": status,
    }


#: A job's tasks as the lab's manager listed them (their `Status`, ids shortened).
COMPLETE = {
    "Timestamp": "2026-11-27T03:05:57.137305892Z",
    "State": "complete",
    "Message": "finished",
    "ContainerStatus": {"ContainerID": "69f9b88ff343", "PID": 0, "ExitCode": 0},
    "PortStatus": {},
}
FAILED = {
    "Timestamp": "2026-11-27T03:05:56.990126864Z",
    "State": "failed",
    "Message": "started",
    "Err": "task: non-zero exit (3)",
    "ContainerStatus": {"ContainerID": "a42115342460", "PID": 0, "ExitCode": 3},
    "PortStatus": {},
}


@pytest.mark.parametrize(
    ("found", "code"),
    [
        ({"ServiceID": "svc-1", "DesiredState": "shutdown", "Status": COMPLETE}, 0),
        ({"ServiceID": "svc-1", "DesiredState": "shutdown", "Status": FAILED}, 3),
        # exit 0 with the zero left out
        (task("complete", "finished", container={"ContainerID": "c1"}), 0),
        (task("complete", "finished", container={"ContainerID": "c1", "ExitCode": 0}), 0),
        (
            task(
                "failed",
                "started",
                "task: non-zero exit (3)",
                {"ContainerID": "c1", "ExitCode": 3},
            ),
            3,
        ),
        # killed by the kernel's OOM killer, or a signal: still the job's own exit
        (
            task(
                "failed",
                "started",
                "task: non-zero exit (137)",
                {"ContainerID": "c1", "ExitCode": 137},
            ),
            137,
        ),
    ],
)
def test_a_task_that_ran_to_its_end_gives_its_containers_exit_code(found, code):
    assert task_exit_code(found) == code


@pytest.mark.parametrize(
    "found",
    [
        None,
        task("running", "started", container={"ContainerID": "c1", "PID": 4242}),
        task("starting", "starting"),
        # the image could not be pulled: no container ran, Swarm's failure, not the job's
        task("rejected", "preparing", "No such image: registry/x:1"),
        task("failed", "preparing", "mount source path does not exist", {}),
        # its service removed (a cancel, a time limit): the stop names the end
        task("shutdown", "shutdown", container={"ContainerID": "c1", "ExitCode": 143}),
        task("orphaned", "started", container={"ContainerID": "c1"}),
    ],
)
def test_a_task_that_did_not_end_by_its_own_exit_has_no_exit_code(found):
    assert task_exit_code(found) is None


def test_the_newest_task_speaks_for_the_job():
    old = task("failed", "started", "task: non-zero exit (1)", {"ContainerID": "a", "ExitCode": 1})
    new = task("complete", "finished", container={"ContainerID": "b"}, created="2")
    assert task_exit_code(newest_task([new, old])) == 0
    assert newest_task([]) is None


def test_a_completed_jobs_service_is_gone_as_an_ended_task_not_as_a_lost_node():
    """The reconciler hands it to the job's settle with this reason, which names no node."""
    services = [
        {"ID": "svc-1", "Spec": {"Labels": {"fgpu.session_id": "j1", "fgpu.kind": "batch"}}}
    ]
    nodes = [{"ID": "n1", "Description": {"Hostname": "node-1"}, "Status": {"State": "ready"}}]
    done = task("complete", "finished", container={"ContainerID": "c1"})
    found = live_sessions(services, [done], nodes, {}, 100.0, 30.0)
    assert found.alive == {}
    reason = found.gone["j1"][0]
    assert reason == "its Swarm task ended (complete: finished)"
    assert "node" not in reason


def test_the_jobs_whose_newest_task_exited_are_the_ones_to_settle():
    def job(sid: str) -> dict:
        return {
            "ID": f"svc-{sid}",
            "Spec": {"Labels": {"fgpu.session_id": sid, "fgpu.kind": "batch"}},
        }

    def of(sid: str, status: dict, created: str = "1") -> dict:
        return {"ServiceID": f"svc-{sid}", "CreatedAt": created, "Status": status}

    running = {"State": "running", "Message": "started", "ContainerStatus": {"ContainerID": "c"}}
    tasks = [of("a", COMPLETE), of("b", FAILED), of("c", running), of("d", FAILED, "1"),
             of("d", running, "2")]  # fmt: skip
    services = [job("a"), job("b"), job("c"), job("d"), job("e")]  # e: no task yet
    assert exited_sessions(services, tasks) == ["a", "b"]
