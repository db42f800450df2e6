"""A batch job's Swarm service: its exit, its exit code and its log (job_containers.py's twin).

In Swarm mode a job is a service with restart condition "none" (fgpu_spawner/service_spec.py),
pinned to its node. The manager cannot see the task's container, which runs on the node: the
task's own record says how it ended (`task_exit_code`, pure), and the service's log stream,
which the manager gathers from the node, holds its output. Both stay readable until the service is
removed: the node keeps an ended task's container until then.

- a task that ended `complete` (exit code 0) or `failed` (another code) with a container of its
  own: the job exited by itself, with `Status.ContainerStatus.ExitCode`;
- a task still starting or running, or one that ended otherwise (`rejected` before any container
  ran, `shutdown` when its service was removed, `orphaned`): no exit of the job's own; the
  reconciler's reasons (a lost node, a task Swarm could not run) stand.

Blocking calls (docker-py): the callers run them in a thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping

import docker.errors
from docker.types.daemon import CancellableStream

from . import log_reads
from .job_containers import BATCH, KIND_LABEL, TAIL_BYTES, TAIL_LINES, cut_tail
from .session_containers import DEPLOYMENT_LABEL, SESSION_LABEL

#: How a task that ran its container to the end is recorded: by itself, with its exit code.
EXITED_STATES = frozenset({"complete", "failed"})


def task_exit_code(task: Mapping | None) -> int | None:
    """The job's exit code from its task as the manager lists it; None when the task did not end
    by its container's exit (it still runs, or Swarm ended it some other way). Pure."""
    status = (task or {}).get("Status") or {}
    if status.get("State") not in EXITED_STATES:
        return None
    container = status.get("ContainerStatus") or {}
    if status["State"] == "complete":
        return int(container.get("ExitCode") or 0)
    if not container.get("ContainerID"):
        return None  # no container ever ran: Swarm's failure, not the job's
    return int(container.get("ExitCode", -1))


def newest_task(tasks: Iterable[Mapping]) -> Mapping | None:
    """A job's service has one task (restart condition "none"); the newest speaks for it."""
    return max(tasks, key=lambda t: t.get("CreatedAt", ""), default=None)


def exited_jobs(client, deployment_id: str = "") -> list[str]:
    """The session ids of this deployment's job services whose task has exited by itself: two
    calls to the manager (Swarm reports no task events), none more while no job runs."""
    labels = [f"{KIND_LABEL}={BATCH}"]
    if deployment_id:
        labels.append(f"{DEPLOYMENT_LABEL}={deployment_id}")
    services = client.api.services(filters={"label": labels})
    if not services:
        return []
    tasks = client.api.tasks(filters={"service": [s["ID"] for s in services]})
    return exited_sessions(services, tasks)


def exited_sessions(services: Iterable[Mapping], tasks: Iterable[Mapping]) -> list[str]:
    """Which of the job `services` have a newest task that exited by itself. Pure."""
    tasks_of: dict[str, list[Mapping]] = {}
    for task in tasks:
        tasks_of.setdefault(task.get("ServiceID", ""), []).append(task)
    return [
        service["Spec"]["Labels"][SESSION_LABEL]
        for service in services
        if SESSION_LABEL in (service["Spec"].get("Labels") or {})
        and task_exit_code(newest_task(tasks_of.get(service["ID"], []))) is not None
    ]


def job_service(client, session_id: str) -> Mapping | None:
    """The job's service as the manager lists it; None once it is removed."""
    found = client.api.services(filters={"label": f"{SESSION_LABEL}={session_id}"})
    return found[0] if found else None


def job_task(client, service: Mapping) -> Mapping | None:
    return newest_task(client.api.tasks(filters={"service": service["ID"]}))


def log_tail(client, service_id: str, lines: int = TAIL_LINES) -> str:
    """The last lines of the service's output (at most TAIL_BYTES, cut at a line)."""
    try:
        chunks = client.api.service_logs(
            service_id, stdout=True, stderr=True, tail=lines, is_tty=False
        )
        raw = b"".join(chunks)
    except docker.errors.NotFound:
        return ""
    return cut_tail(raw.decode(errors="replace"), TAIL_BYTES)


def running_tail(client, service_id: str, lines: int) -> str:
    """A running job's last `lines` lines, read within log_reads.READ_MAX bytes."""

    def read(window: int) -> Iterable[bytes]:
        return client.api.service_logs(
            service_id, stdout=True, stderr=True, tail=window, is_tty=False
        )

    try:
        return log_reads.bounded_tail(read, lines)
    except docker.errors.NotFound:
        return ""


def follow_log(client, service_id: str, tail: int = TAIL_LINES) -> CancellableStream:
    """The service's output from its last `tail` lines on, as it comes. The manager keeps such a
    stream open after the task has ended (it waits for another task), so the caller closes it
    once the job has ended; `close()` works from another thread, unlike the generator's own."""
    api = client.api
    params = {"follow": True, "stdout": True, "stderr": True, "tail": tail}
    response = api._get(api._url("/services/{0}/logs", service_id), params=params, stream=True)
    api._raise_for_status(response)
    return CancellableStream(api._multiplexed_response_stream_helper(response), response)


def remove(client, service_id: str) -> None:
    """Remove an ended job's service (Swarm then removes the task's container on its node)."""
    with contextlib.suppress(docker.errors.NotFound):  # removed already: the hub's stop was first
        client.api.remove_service(service_id)


def chunks_of(stream: Iterable[bytes]) -> Iterator[bytes]:
    """The stream's chunks until it is closed under it (a closed socket ends the read with an
    error in the reading thread)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        yield from stream
