"""Engine calls about one session container, bounded: no round waits on a container that does not
answer, and the service's own `docker exec` never enters a container while it is committed.

Why (docs/source/howto/logs-and-health.md, "A container that does not answer"): on cgroup v1 a `docker exec` that
enters a frozen container leaves its `runc init` stuck in the freezer, and from then on the engine's
calls about that container (inspect, stats, exec, stop) hang until their HTTP timeout. One such
container must not stall the stats of every other session, the end warnings or the reconciler.

- `ContainerCalls.call` runs one call on a pool of its own, bounded by `timeout` seconds. A call not
  answered by then marks its container *unresponsive* (`unresponsive()`, read by `api/health`, the
  Cluster page and so `fgpu-hub doctor`), and the caller goes on with `ContainerUnresponsive`.
- While a call about a container is still in flight, no other is started about it: a stuck
  container holds one thread at most, never the pool, and later rounds do not wait on it at all.
- The mark goes as soon as a call about that container is answered again.

`ContainerLocks` holds one lock per session: a commit takes it alone for as long as it copies the
container; the service's execs (the end warnings', SSH shells) share it, so that two logins into
one session do not turn each other away, and only try it: while a commit holds it the end
warnings skip the round and a login is told to try again.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

#: Seconds one engine call about one container may take (a stats read, an exec, an unpause).
CALL_TIMEOUT_SECONDS = 10.0
#: Threads for those calls: each stuck container holds one at most.
CALL_WORKERS = 8


class ContainerUnresponsive(Exception):
    """The engine did not answer about this container in time, or still has not."""


@dataclass(frozen=True)
class Unanswered:
    container_id: str
    session_id: str
    what: str
    since: float

    def as_dict(self) -> dict:
        return {
            "container": self.container_id[:12],
            "session_id": self.session_id,
            "call": self.what,
            "since": self.since,
        }


class ContainerCalls:
    """Bounded engine calls about single containers (see the module's docstring)."""

    def __init__(
        self,
        timeout: float = CALL_TIMEOUT_SECONDS,
        workers: int = CALL_WORKERS,
        clock: Callable[[], float] = time.time,
        log=None,
    ):
        self.timeout = timeout
        self.clock = clock
        self.log = log
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="fgpu-container")
        self._in_flight: dict[str, asyncio.Future] = {}
        self._unanswered: dict[str, Unanswered] = {}

    async def call(
        self, container_id: str, session_id: str, what: str, fn, *args, remedy: bool = False
    ):
        """`fn(*args)` on the pool; its answer, or `ContainerUnresponsive` after `timeout`.

        A `remedy` (a thaw) is started even while another call about the container hangs, since
        it is what frees that call."""
        if container_id in self._in_flight and not remedy:
            self._mark(container_id, session_id, what)
            raise ContainerUnresponsive(
                f"an earlier engine call about {container_id[:12]} has not been answered"
            )
        future = asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        if not remedy:
            self._in_flight[container_id] = future
            future.add_done_callback(lambda done: self._settled(container_id, done))
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.timeout)
        except TimeoutError:
            self._mark(container_id, session_id, what)
            raise ContainerUnresponsive(
                f"the engine did not answer {what} about {container_id[:12]} in {self.timeout:g} s"
            ) from None

    def unresponsive(self) -> list[Unanswered]:
        return sorted(self._unanswered.values(), key=lambda u: u.since)

    def forget(self, keep: set[str]) -> None:
        """Drop the marks of containers that are gone (only `keep` are still live)."""
        for container_id in set(self._unanswered) - keep:
            self._unanswered.pop(container_id, None)

    def _mark(self, container_id: str, session_id: str, what: str) -> None:
        if container_id in self._unanswered:
            return
        self._unanswered[container_id] = Unanswered(container_id, session_id, what, self.clock())
        if self.log:
            self.log.warning(
                "engine: the container %s of session %s does not answer (%s); its rounds go on"
                " without it",
                container_id[:12],
                session_id,
                what,
            )

    def _settled(self, container_id: str, future: asyncio.Future) -> None:
        self._in_flight.pop(container_id, None)
        if future.cancelled() or timed_out(future.exception()):
            return
        # Answered, even with an error (no such container, say): the engine is not stuck on it.
        if self._unanswered.pop(container_id, None) and self.log:
            self.log.warning("engine: the container %s answers again", container_id[:12])


def timed_out(error: BaseException | None) -> bool:
    """Whether a call failed for want of an answer (the engine client's read timeout)."""
    if error is None:
        return False
    names = {cls.__name__ for cls in type(error).__mro__}
    return bool(names & {"Timeout", "ReadTimeout", "ReadTimeoutError", "TimeoutError"}) or (
        "timed out" in str(error).lower()
    )


class ContainerLocks:
    """One lock per session container: a commit holds it alone, the service's execs share it
    (several shells, the end warnings) and only try it: none starts while a commit holds it or
    waits for it."""

    def __init__(self):
        self._guard = threading.Lock()
        self._locks: dict[str, _SharedLock] = {}

    def _lock(self, session_id: str) -> _SharedLock:
        with self._guard:
            return self._locks.setdefault(session_id, _SharedLock())

    @contextlib.contextmanager
    def committing(self, session_id: str):
        """Held for a commit: waits for the execs in progress to end first."""
        lock = self._lock(session_id)
        lock.take_alone()
        try:
            yield
        finally:
            lock.release_alone()

    @contextlib.contextmanager
    def exec_unless_committing(self, session_id: str):
        """Yields True while held, or False at once when a commit holds the container."""
        lock = self._lock(session_id)
        held = lock.try_share()
        try:
            yield held
        finally:
            if held:
                lock.release_share()


class _SharedLock:
    """Shared by execs, held alone by one commit at a time, which new execs do not pass."""

    def __init__(self):
        self._changed = threading.Condition()
        self._execs = 0
        self._committing = False

    def try_share(self) -> bool:
        with self._changed:
            if self._committing:
                return False
            self._execs += 1
            return True

    def release_share(self) -> None:
        with self._changed:
            self._execs -= 1
            self._changed.notify_all()

    def take_alone(self) -> None:
        with self._changed:
            self._changed.wait_for(lambda: not self._committing)
            self._committing = True
            self._changed.wait_for(lambda: not self._execs)

    def release_alone(self) -> None:
        with self._changed:
            self._committing = False
            self._changed.notify_all()
