"""Batch jobs end by themselves: the moment a job's container exits, its record ends with the job's
own reason and its slice goes to the next waiting request (docs/source/howto/batch-jobs.md).

- `finished` for exit code 0, `failed` for any other, with the code and the last line of the log
  in the reason; the end of the log (engine/job_containers.py's TAIL_LINES) is kept with the
  record, for `GET api/sessions/{id}/logs` once the container is gone.
- The engine's `die` events say at once that a job exited (one engine); the reconciler's rounds
  find the exits the events missed (the service was down, the engine restarted) and hand them
  here too, so that no exited job ends as a lost container. A Swarm reports no task events:
  its jobs' tasks are looked at every SWARM_LOOK_EVERY seconds instead (`look`), a job whose
  task ended `complete` or `failed` (engine/job_services.py) is settled then, and the rounds
  catch up as on one engine.
- The exit code and the log are read through the engine backend (`job_exit`, `remove_job`): a
  container's on one engine, a Swarm service's task and log stream on a Swarm.
- A job that exits because it is being stopped (its owner cancelled it, its time limit, an admin)
  is left to that stop while the hub is stopping it: the spawner's release names why. Where the
  job exited by itself just then, the hub finds it exited and never calls the spawner, so the
  job is ended here with the stop's reason (the service's expected end).

After the record has ended, the hub is asked to stop the job's server, which removes the
container; its release then finds the record ended and changes nothing.
"""

from __future__ import annotations

import asyncio
import threading
import time

from queue_service.core import end_reasons
from queue_service.core.status import Status
from queue_service.engine import job_containers
from queue_service.engine.backend import EngineBackend

from .hub_client import HubError, server_pending

#: After the engine's event stream broke (a restart), wait this long before listening again.
RETRY_AFTER = 5.0
#: On a Swarm, seconds between two looks at the jobs' tasks (two calls to the manager).
SWARM_LOOK_EVERY = 1.0
_ENDS_WHILE = (Status.SCHEDULED, Status.RUNNING)
#: How job_runner.py's own lines begin (not the job's output).
RUNNER_PREFIX = "[fgpu job]"
#: A job that exits while the hub still finishes its spawn is settled once the spawn is over:
#: asked again every second, this many times (the reconciler's rounds take over after).
SPAWN_WAITS = 30


def job_end(exit_code: int, tail: str) -> tuple[str, str]:
    """(end code, reason) of a job that exited with `exit_code`, its log ending with `tail`."""
    if exit_code == 0:
        return end_reasons.FINISHED, "finished: the job exited with code 0"
    lines = (line for line in reversed(tail.splitlines()) if line.strip())
    last = next((line for line in lines if not line.startswith(RUNNER_PREFIX)), "")
    words = f"failed: the job exited with code {exit_code}"
    return end_reasons.FAILED, f"{words}; its last output: {last[:300]}" if last else words


class JobEnds:
    """Ends jobs whose containers have exited; `watch()` listens to the engine's events."""

    def __init__(self, manager, hub, backend: EngineBackend, deployment_id: str = "", log=None):
        self.manager = manager
        self.hub = hub
        self.backend = backend
        self.deployment_id = deployment_id
        self.log = log
        self._tasks: set[asyncio.Task] = set()
        self._after_spawn: set[str] = set()
        self._settling: set[str] = set()

    async def settle(self, session_id: str) -> bool:
        """End the job if its container has exited and nobody is stopping it; True when its
        end is handled (here, or by the stop under way), False when there is no job to end."""
        if session_id in self._settling:
            return True  # the event's and a round's settle of one exit: one is enough
        self._settling.add(session_id)
        try:
            return await self._settle(session_id)
        finally:
            self._settling.discard(session_id)

    async def _settle(self, session_id: str) -> bool:
        view = await self._active_job(session_id)
        if view is None:
            return False
        pending = await self._hub_pending(view)
        if pending == "stop":
            return True
        if pending == "spawn":
            self._settle_after_spawn(session_id)
            return True
        found = await asyncio.to_thread(self.backend.job_exit, session_id)
        if found is None:
            return False  # removed, or ended by no exit of its own: lost
        code, tail = found
        if code is None:
            return True  # still running
        why, reason = job_end(code, tail)
        # A stop the service asked for (the time limit, an owner's cancel, an admin) met the
        # job's exit: the hub then finds it exited and never stops it, so no release comes,
        # and the stop's reason is given here.
        expected = self.manager.take_expected_end(session_id)
        if expected is not None:
            why, reason = expected[0], expected[1] or reason
        await self.manager.end_job(session_id, why, reason, code, tail)
        self._say("job %s of %s ended: %s", session_id, view["user"], reason)
        await self._stop_server(view)
        # The hub finds the container (or task) exited and forgets the server without stopping
        # it: the container or service is removed here (its log has been read).
        await asyncio.to_thread(self.backend.remove_job, session_id)
        return True

    async def _hub_pending(self, view: dict) -> str | None:
        # A hub that does not answer: the exit is real either way.
        return await server_pending(self.hub, view["user"], view["server_name"])

    def _settle_after_spawn(self, session_id: str) -> None:
        if session_id in self._after_spawn:
            return
        self._after_spawn.add(session_id)
        task = asyncio.create_task(self._settle_when_spawned(session_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle_when_spawned(self, session_id: str) -> None:
        try:
            for _ in range(SPAWN_WAITS):
                await asyncio.sleep(1.0)
                view = await self._active_job(session_id)
                if view is None:
                    return
                if await self._hub_pending(view) != "spawn":
                    break
        finally:
            self._after_spawn.discard(session_id)
        await self._settle_logged(session_id)

    async def _active_job(self, session_id: str) -> dict | None:
        """The job's record while it holds a slice; None for anything else."""
        try:
            view = await self.manager.get(session_id)
        except KeyError:
            return None
        if view["type"] != "batch" or view["status"] not in _ENDS_WHILE:
            return None
        return view

    async def _stop_server(self, view: dict) -> None:
        """The hub's server of an ended job: stopped, so that its container is removed."""
        try:
            await self.hub.stop_server(view["user"], view["server_name"])
        except (HubError, OSError) as e:
            # The hub's own poll finds the server stopped; the container goes with its next start.
            self._say("the hub did not stop job server %s: %s", view["server_name"], e)

    async def watch(self) -> None:
        """Settle each job as the engine reports its exit (a thread reads the event stream)."""
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._listen, args=(loop,), daemon=True, name="job-exits").start()

    async def look(self, every: float = SWARM_LOOK_EVERY) -> None:
        """Settle each job whose task has exited, looking every `every` seconds (a Swarm)."""
        while True:
            await asyncio.sleep(every)
            try:
                exited = await asyncio.to_thread(self.backend.exited_jobs, self.deployment_id)
            except Exception as e:  # the manager not answering: the rounds say so
                self._say("the jobs' tasks could not be read (%s)", e)
                await asyncio.sleep(RETRY_AFTER)
                continue
            for session_id in exited:
                await self._settle_logged(session_id)

    def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        while not loop.is_closed():
            try:
                exits = job_containers.job_exits(self.backend.client, self.deployment_id)
                for session_id, _code in exits:
                    asyncio.run_coroutine_threadsafe(self._settle_logged(session_id), loop)
            except Exception as e:  # the engine restarting: listen again; rounds catch up
                self._say("the engine's events stopped (%s); listening again", e)
            time.sleep(RETRY_AFTER)

    async def _settle_logged(self, session_id: str) -> None:
        try:
            await self.settle(session_id)
        except Exception:
            if self.log:
                self.log.exception("Ending job %s failed; the reconciler tries again", session_id)

    def _say(self, message: str, *args) -> None:
        if self.log:
            self.log.warning("jobs: " + message, *args)
