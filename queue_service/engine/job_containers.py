"""A batch job's container on the engine: its exit, its exit code and its log.

A job's container carries the session labels and `fgpu.kind=batch` (the spawner's
container_spec.py). It is kept after it exits until the hub stops its server, so its exit code and
its output can still be read; the engine's `die` events say at once that one has exited.

Blocking calls (docker-py): the callers run them in a thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import docker.errors

from . import log_reads
from .session_containers import DEPLOYMENT_LABEL, SESSION_LABEL

KIND_LABEL = "fgpu.kind"
BATCH = "batch"
#: The end of a log the service keeps for an ended job: lines, and bytes at most.
TAIL_LINES = 200
TAIL_BYTES = 64 * 1024
_NOT_EXITED = ("created", "restarting", "removing")


def job_container(client, session_id: str):
    """The job's container, running or exited; None once it is removed."""
    found = client.containers.list(
        all=True, filters={"label": f"{SESSION_LABEL}={session_id}"}, ignore_removed=True
    )
    return found[0] if found else None


def exit_code(container) -> int | None:
    """The exit code of an exited container; None while it runs, is paused, or has not started
    yet (a created container reads exit code 0, which is no finished job)."""
    state = container.attrs.get("State") or {}
    if state.get("Running") or state.get("Paused") or state.get("Status") in _NOT_EXITED:
        return None
    return int(state.get("ExitCode", -1))


def log_tail(client, container, lines: int = TAIL_LINES) -> str:
    """The last lines of the container's output (at most TAIL_BYTES, cut at a line)."""
    try:
        raw = client.api.logs(container.id, tail=lines)
    except docker.errors.NotFound:
        return ""
    return cut_tail(raw.decode(errors="replace"), TAIL_BYTES)


def cut_tail(text: str, limit: int = TAIL_BYTES) -> str:
    """The end of `text` within `limit` bytes, from a line's start."""
    if len(text.encode()) > limit:
        text = text.encode()[-limit:].decode(errors="ignore").partition("\n")[2]
    return text


def remove(container) -> None:
    """Remove an exited job's container (and its anonymous volumes; the home is a named one)."""
    with contextlib.suppress(docker.errors.NotFound):  # removed already: the hub's stop was first
        container.remove(v=True, force=True)


def running_tail(client, container, lines: int) -> str:
    """A running job's last `lines` lines, read within log_reads.READ_MAX bytes."""

    def read(window: int) -> Iterable[bytes]:
        return client.api.logs(container.id, stream=True, follow=False, tail=window)

    try:
        return log_reads.bounded_tail(read, lines)
    except docker.errors.NotFound:
        return ""


def follow_log(client, container, tail: int = TAIL_LINES) -> Iterator[bytes]:
    """The container's output from its last `tail` lines on, as it comes, until it exits."""
    return client.api.logs(container.id, stream=True, follow=True, tail=tail)


def job_exits(client, deployment_id: str = "") -> Iterator[tuple[str, int]]:
    """(session id, exit code) of each job container of this deployment as it exits; blocks
    between events, for as long as the engine answers."""
    labels = [f"{KIND_LABEL}={BATCH}"]
    if deployment_id:
        labels.append(f"{DEPLOYMENT_LABEL}={deployment_id}")
    events = client.events(
        decode=True, filters={"type": "container", "event": "die", "label": labels}
    )
    for event in events:
        attributes = (event.get("Actor") or {}).get("Attributes") or {}
        session_id = attributes.get(SESSION_LABEL)
        if session_id:
            yield session_id, int(attributes.get("exitCode", -1))
