"""The reconciler: the DB's allocations checked against the containers that really run.

A PENDING or SCHEDULED record whose spawn the hub no longer runs (the hub restarted, say) has its
spawn issued again through the hub's API, with the options the hub kept for that server (its
`user_options`: storage folders, environment variables and the rest come back too) under the
record's own slots and job (`respawn_options`); the service adopts the record, so the request
keeps its place in line, or its grant. A record a spawn of this service's
life has dealt with waits `respawn_grace` first (a cancelled spawn's release may be on its way);
one none has, at once (the service ends with its hub: that spawn and any release of it died in a
crash). Either way the hub is asked first, and a server whose spawn it runs is not issued twice.

A slice is held by a record in SCHEDULED or RUNNING. It is given back when:
- the session's container (found by its `fgpu.session_id` label) died or was removed outside the
  hub: the record ends as TERMINATED (a paused container is alive: its session goes on once it
  is unpaused, by hand or by frozen_containers.py);
- a grant's container never appeared within `start_grace` seconds (the spawn died with the hub,
  say): the record ends as ERROR.

Fail closed the other way too: a container still running for a record that has already ended
(TERMINATED, CANCELLED, ERROR, PENDING_TIMEOUT) holds no grant, so it is stopped. Through the hub
when the hub still lists that server and no newer record owns the server's name, so the hub's view
stays right; otherwise directly on the engine (stopped and removed, as the spawner would). Only
containers whose session id is one of this service's records are touched: other hubs may share
the engine.

Nothing runs unaccounted:
- a live container of this deployment (its `fgpu.deployment` label) whose session has no record at
  all (the DB was lost, or replaced by an older copy), or a record still PENDING (an older copy,
  such as a restored backup, taken before the request was granted), is adopted from its labels as
  RUNNING, its grant with it, before any slice is granted again (the queue grants nothing until
  the engine's containers have been counted once);
- a RUNNING session whose container lives on although the hub no longer lists its server (a stop
  whose `docker stop` or remove failed: the spawner then keeps the grant) is stopped here, and its
  grant given back once the container is gone. An adopted session the hub does not know ends so.

Nothing is listed without a session: a server the hub lists as running with no live record and
no container behind it (a ghost, ghost_servers.py) is stopped through the hub after a grace.

This runs on a bounded timer, off the grant path: releases through the spawner stay event-driven.
"""

from __future__ import annotations

import asyncio
import time

from image_catalog.job_options import JOB_OPTIONS, parse_job
from queue_service.core import end_reasons
from queue_service.core.status import Status
from queue_service.engine.container_calls import ContainerCalls, ContainerUnresponsive
from queue_service.engine.errors import ENGINE_ERRORS
from queue_service.engine.session_containers import (
    deployment_of,
    session_from_labels,
    stop_and_remove,
)
from queue_service.store.models import as_utc

from .ghost_servers import stop_ghosts
from .hub_client import HubError, server_pending

ADOPTED_REASON = "adopted from its container: the service had no record of it"
#: What a spawn issued again does not take from the hub's saved options: a request key names one
#: start only (its record is adopted by its server and slots), and a preset's slots are the
#: record's (a preset beside slots is refused, and the preset may have changed since).
_NOT_RESPAWNED = ("request_key", "preset", *JOB_OPTIONS)


class Reconciler:
    def __init__(
        self,
        manager,
        *,
        sessions,
        log=None,
        start_grace: float = 180.0,
        hub=None,
        respawn_grace: float = 120.0,
        deployment_id: str = "",
        unlisted_grace: float = 10.0,
        ghost_grace: float = 60.0,
        prepare=None,
        watch=None,
        calls: ContainerCalls | None = None,
        jobs=None,
    ):
        self.manager = manager
        # Ends a batch job that exited by itself with its own reason (job_ends.py), where the
        # engine's event of its exit was missed.
        self.jobs = jobs
        self.log = log
        self.start_grace = start_grace
        self.hub = hub
        self.respawn_grace = respawn_grace
        # When each waiting record was first seen with no spawn waiting on it (its long-poll).
        self._unwatched_since: dict[str, float] = {}
        # Empty: containers are not told apart by hub (tests of one hub; nothing is adopted).
        self.deployment_id = deployment_id
        self.unlisted_grace = unlisted_grace
        # How long the hub may list a server with nothing behind it (ghost_servers.py).
        self.ghost_grace = ghost_grace
        # Awaited before each pass's engine reads (the service reads its node there, once).
        self.prepare = prepare
        # What runs: the engine backend's `session_lister()`, containers on one engine
        # (session_containers.py) or services on a Swarm (session_services.py). None for a
        # reconciler that only issues lost spawns again.
        self.sessions = sessions
        # Called with each round's live containers: frozen_containers.FreezeWatch.check.
        self.watch = watch
        self.calls = calls or ContainerCalls(log=log)
        self._respawning: set[str] = set()
        # When the engine last listed the sessions, and when `run`'s last round ended: the
        # health checks (health.py) read them.
        self.engine_answered_at: float | None = None
        self.round_ended_at: float | None = None
        # The event loop keeps only weak references to tasks: hold them until they are done.
        self._tasks: set[asyncio.Task] = set()

    async def reconcile(self) -> None:
        # The records are read before the engine is asked: a session that turns RUNNING while the
        # engine answers is still SCHEDULED here, within its grace, and not taken for one whose
        # container is gone. They are read from the DB, not from memory: a record may have been
        # ended outside this process.
        await self.manager.refresh()
        active = self.manager.active_records()
        try:
            if self.prepare is not None:
                await self.prepare()
            listed = await asyncio.get_running_loop().run_in_executor(None, self.sessions)
        except ENGINE_ERRORS as e:
            self.manager.engine_problem = (
                f"The Docker engine is not answering ({_short(e)}), so no session can start "
                "now. Try again in a minute; the hub recovers by itself once the engine is back."
            )
            raise
        self.engine_answered_at = time.time()
        running = {
            session_id: container
            for session_id, container in listed.items()
            if deployment_of(container) in (None, self.deployment_id) or not self.deployment_id
        }
        if self.watch is not None:
            await self.watch(running)
        await self._adopt_orphans(running)
        if self.manager.engine_problem is not None:
            self._say("the engine answers; every session container is counted")
            self.manager.engine_problem = None
        await self._release_lost(active, running)
        await self._stop_ungranted(running)
        if self.hub is None:
            return
        try:
            # Only the ready ones: the active ones include every spawn waiting in the queue, and
            # listing thousands of them every round held the hub's loop for seconds. Read once
            # a round, for both checks below.
            started = await self.hub.ready_server_starts()
        except (HubError, OSError) as e:
            self._say("cannot list the hub's servers (%s); checking again later", e)
            return
        await self._stop_unlisted(active, running, started)
        await stop_ghosts(self.hub, self.manager, running, started, self.ghost_grace, self._say)

    async def _adopt_orphans(self, running: dict) -> None:
        """Record the sessions of this hub's containers that the DB does not know, or knows as
        still waiting."""
        if not self.deployment_id:
            return
        ours = {sid for sid, c in running.items() if deployment_of(c) == self.deployment_id}
        waiting = {r.id for r in self.manager.active_records() if r.status == Status.PENDING}
        unknown = await self.manager.unknown_among(ours)
        orphans = [running[sid] for sid in sorted(unknown | (waiting & ours))]
        sessions = [s for s in map(session_from_labels, orphans) if s is not None]
        if sessions:
            adopted = await self.manager.adopt(sessions, ADOPTED_REASON)
            self._say("sessions with no record, adopted from their labels: %s", adopted)

    async def _stop_unlisted(self, active, running: dict, listed) -> None:
        """Stop the containers of RUNNING sessions that the hub has stopped or never knew
        (`listed`: the servers the hub has ready, by (user, server name))."""
        now = time.time()
        candidates = [
            r
            for r in active
            if r.status == Status.RUNNING
            and r.id in running
            and r.started is not None
            and now - as_utc(r.started).timestamp() > self.unlisted_grace
        ]
        for record in candidates:
            if (record.user, record.server_name) in listed:
                continue
            # Not ready, yet maybe still known: the hub checks a new server for a while before
            # it is ready, and is slow to under load. Its user's own model says.
            if await self._hub_still_has(record):
                continue
            # Read again: a release may have ended it while the hub was asked.
            if (await self.manager.get(record.id))["status"] != Status.RUNNING:
                continue
            self._say(
                "the hub does not list %s/%s, yet session %s runs; stopping its container",
                record.user,
                record.server_name,
                record.id,
            )
            stopped = await self._stop_container(record.id, running[record.id])
            if stopped:
                await self.manager.release_where(
                    [record.id],
                    Status.TERMINATED,
                    "the hub had stopped its server",
                    end_reason=end_reasons.HUB_STOPPED,
                )

    async def _hub_still_has(self, record) -> bool:
        try:
            servers = (await self.hub.user_now(record.user)).get("servers") or {}
        except HubError as e:
            return e.status != 404  # a user the hub deleted has no server; else ask again later
        except OSError:
            return True
        return record.server_name in servers

    async def _release_lost(self, active, running: dict) -> None:
        gone, never_started = [], []
        now = time.time()
        for record in active:
            if record.status == Status.RUNNING and record.id not in running:
                gone.append(record.id)
            elif record.status == Status.SCHEDULED and record.id not in running:
                granted = as_utc(record.scheduled_at).timestamp() if record.scheduled_at else now
                if now - granted > self.start_grace:
                    never_started.append(record.id)
        gone = [session_id for session_id in gone if not await self._job_settled(session_id)]
        by_id = {record.id: record for record in active}
        gone = [
            session_id for session_id in gone if not await self._hub_stopping(by_id[session_id])
        ]
        if gone:
            self._say("container gone, releasing %s", gone)
            by_reason: dict[str, list[str]] = {}
            for session_id in gone:
                reason = self.sessions.why_gone(session_id) or "the container stopped"
                by_reason.setdefault(reason, []).append(session_id)
            for reason, session_ids in by_reason.items():
                await self.manager.release_where(
                    session_ids, Status.TERMINATED, reason, end_reason=end_reasons.LOST
                )
            await asyncio.get_running_loop().run_in_executor(None, self.sessions.remove_gone, gone)
            lost = set(gone)
            await self._hub_forgets(
                r for r in active if r.id in lost and self.sessions.why_gone(r.id) is not None
            )
        if never_started:
            self._say("grant never used, reclaiming %s", never_started)
            await self.manager.release_where(
                never_started,
                Status.ERROR,
                f"no container started within {self.start_grace:g} s",
                end_reason=end_reasons.ERROR,
            )

    async def _hub_stopping(self, record) -> bool:
        """Whether the hub is stopping the record's server right now: its spawner removes the
        container before it releases the grant, so a round between the two finds the container
        gone. That release names why the session ended (the student's stop, the culler's); taking
        the session for lost first would record `lost` instead."""
        if self.hub is None:
            return False
        return await server_pending(self.hub, record.user, record.server_name) == "stop"

    async def _job_settled(self, session_id: str) -> bool:
        return self.jobs is not None and await self.jobs.settle(session_id)

    async def _hub_forgets(self, lost) -> None:
        """Stop the hub's servers of sessions lost with their node: the hub would otherwise go on
        listing them, its proxy routing to an address nobody answers, until its next poll."""
        for record in lost:
            await self._hub_stops(record)

    async def _stop_ungranted(self, running: dict) -> None:
        """Stop the containers of records that have ended: they run without a grant."""
        ended = await self.manager.ended_among(set(running))
        if not ended:
            return
        # Read now, not before the listing: a newer session on the same server name must count.
        owned = {(r.user, r.server_name) for r in self.manager.active_records()}
        for record in ended:
            container = running[record.id]
            self._say(
                "session %s ended as %s but its container runs; stopping it",
                record.id,
                record.status,
            )
            if (record.user, record.server_name) not in owned and await self._hub_stops(record):
                continue
            await self._stop_container(record.id, container)

    async def _stop_container(self, session_id: str, container) -> bool:
        """Stop and remove, bounded (container_calls.py): a container the engine does not answer
        about is reported and tried again next round, never waited on."""
        try:
            return await self.calls.call(
                container.id, session_id, "stop", stop_and_remove, container, self.log
            )
        except ContainerUnresponsive as e:
            self._say("%s", e)
            return False

    async def _hub_stops(self, record) -> bool:
        """Ask the hub to stop the record's server, if the hub lists it; True if it did."""
        if self.hub is None:
            return False
        try:
            servers = (await self.hub.user_now(record.user)).get("servers", {})
            if record.server_name not in servers:
                return False
            await self.hub.stop_server(record.user, record.server_name)
        except HubError as e:
            self._say(
                "the hub cannot stop %s/%s (%s); stopping the container",
                record.user,
                record.server_name,
                e.message,
            )
            return False
        return True

    async def respawn_abandoned(self) -> None:
        """Issue again the spawns of records that no spawner waits for any more."""
        now = time.time()
        # A record with a long-poll open on it has its spawn: the hub is not asked. Asking about
        # every waiting student each round cost the hub a read per student every 5 s (200/s
        # with 1,000 waiting), more than its event loop could serve beside its own API.
        unwatched = [
            r
            for r in self.manager.active_records()
            if r.status in (Status.PENDING, Status.SCHEDULED)
            and r.id not in self._respawning
            and not self.manager.awaited(r.id)
        ]
        # Counted from when no spawn was seen waiting on it, not from the request: a cancelled
        # spawn's long-poll ends before its release arrives, which a storm of stops delays by
        # tens of seconds; issuing it again then would undo the cancel. A record no spawn of
        # this service's life has dealt with has no release on its way (the service ends with
        # its hub: its spawn died in a crash), so the hub alone is asked, at once.
        since = {r.id: self._unwatched_since.get(r.id, now) for r in unwatched}
        self._unwatched_since = since
        waiting = [
            r
            for r in unwatched
            if not self.manager.handled_here(r.id) or now - since[r.id] >= self.respawn_grace
        ]
        for user in {r.user for r in waiting}:
            try:
                # Stopped servers too: a spawn that died with the hub leaves its server stopped,
                # and its saved options are still the hub's.
                servers = (await self.hub.user_with_stopped_servers(user)).get("servers", {})
            except HubError as e:
                self._say("cannot read %s from the hub: %s", user, e.message)
                continue
            for record in (r for r in waiting if r.user == user):
                server = servers.get(record.server_name) or {}
                if server.get("pending") != "spawn":
                    self._respawning.add(record.id)
                    options = respawn_options(record, server.get("user_options"))
                    task = asyncio.create_task(self._respawn(record, options))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)

    async def _respawn(self, record, options: dict) -> None:
        try:
            # Read again: the user may have cancelled while the hub was asked about the server.
            if (await self.manager.get(record.id))["status"] not in (
                Status.PENDING,
                Status.SCHEDULED,
            ):
                return
            self._say("spawn of %s/%s was lost; issuing it again", record.user, record.server_name)
            # From now on its spawn is this life's: if it is lost again, the grace applies.
            self.manager.note_handled(record.id)
            await self.hub.start_server(record.user, record.server_name, options)
        except HubError as e:
            self._say("could not issue %s/%s again: %s", record.user, record.server_name, e.message)
        finally:
            self._respawning.discard(record.id)

    async def run(self, interval: float) -> None:
        # Each step is tried on its own: an engine that is restarting must not hold up the respawns
        # or the pending timeouts, which are checked in a pass (a quiet queue has none otherwise).
        steps = [self.reconcile, self.manager.schedule]
        if self.hub is not None:
            steps.insert(1, self.respawn_abandoned)
        while True:
            await asyncio.sleep(interval)
            for step in steps:
                try:
                    await step()
                except ENGINE_ERRORS as e:  # the engine is away: say so briefly, each round
                    self._say("%s: the engine does not answer (%s)", step.__name__, _short(e))
                except Exception:  # tried again next round
                    if self.log:
                        self.log.exception("reconciler: %s failed", step.__name__)
            self.round_ended_at = time.time()

    def _say(self, message: str, *args) -> None:
        if self.log:
            self.log.warning("reconciler: " + message, *args)


def _short(error: Exception) -> str:
    text = str(error) or type(error).__name__
    return text if len(text) <= 200 else text[:200] + "..."


def respawn_options(record, saved: dict | None) -> dict:
    """The options of a lost spawn issued again: the hub's saved `user_options` of the server
    (folders, env and the rest, as the spawn was asked for), under the record's own slots and
    job, so the spawn asks for exactly the request the record holds and adopts it. Without saved
    options (a hub that keeps none, or a token that may not read them), the record's alone."""
    kept = saved if isinstance(saved, dict) else {}
    return {
        **{key: value for key, value in kept.items() if key not in _NOT_RESPAWNED},
        "image": record.image,
        "cpu": record.cpu,
        "mem": record.mem,
        "fgpu": record.fgpu,
        "resource_group": record.resource_group,
        # A job's own options, so that it runs what it was submitted with.
        **({"type": "batch", **parse_job(record.job_json)} if record.job_json else {}),
    }
