"""The reconciler: the DB's allocations checked against the containers that really run.

A PENDING or SCHEDULED record whose spawn the hub no longer runs (the hub restarted, say) has its
spawn issued again through the hub's API, with the record's own options; the service adopts the
record, so the request keeps its place in line, or its grant.

A slice is held by a record in SCHEDULED or RUNNING. It is given back when:
- the session's container (found by its `fgpu.session_id` label) died or was removed outside the
  hub: the record ends as TERMINATED (a paused container, one being committed to an image, is
  alive: its session goes on once the commit is done);
- a grant's container never appeared within `start_grace` seconds (the spawn died with the hub,
  say): the record ends as ERROR.

Fail closed the other way too: a container still running for a record that has already ended
(TERMINATED, CANCELLED, ERROR, PENDING_TIMEOUT) holds no grant, so it is stopped. Through the hub
when the hub still lists that server and no newer record owns the server's name, so the hub's view
stays right; otherwise directly on the engine (stopped and removed, as the spawner would). Only
containers whose session id is one of this service's records are touched: other hubs may share
the engine.

This runs on a bounded timer, off the grant path: releases through the spawner stay event-driven.
"""

from __future__ import annotations

import asyncio
import time

import docker.errors

from .hub_client import HubError
from .models import Status, as_utc
from .session_containers import alive_session_containers


class Reconciler:
    def __init__(
        self,
        manager,
        docker_client,
        log=None,
        start_grace: float = 180.0,
        hub=None,
        respawn_grace: float = 20.0,
    ):
        self.manager = manager
        self.docker = docker_client
        self.log = log
        self.start_grace = start_grace
        self.hub = hub
        self.respawn_grace = respawn_grace
        self._respawning: set[str] = set()
        # The event loop keeps only weak references to tasks: hold them until they are done.
        self._tasks: set[asyncio.Task] = set()

    async def reconcile(self) -> None:
        # The records are read before the engine is asked: a session that turns RUNNING while the
        # engine answers is still SCHEDULED here, within its grace, and not taken for one whose
        # container is gone.
        active = self.manager.active_records()
        running = await asyncio.get_running_loop().run_in_executor(
            None, alive_session_containers, self.docker
        )
        await self._release_lost(active, running)
        await self._stop_ungranted(running)

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
        if gone:
            self._say("container gone, releasing %s", gone)
            await self.manager.release_where(gone, Status.TERMINATED, "the container stopped")
        if never_started:
            self._say("grant never used, reclaiming %s", never_started)
            await self.manager.release_where(
                never_started, Status.ERROR, f"no container started within {self.start_grace:g} s"
            )

    async def _stop_ungranted(self, running: dict) -> None:
        """Stop the containers of records that have ended: they run without a grant."""
        ended = self.manager.ended_among(set(running))
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
            await asyncio.get_running_loop().run_in_executor(None, _stop_and_remove, container)

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
        waiting = [
            r
            for r in self.manager.active_records()
            if r.status in (Status.PENDING, Status.SCHEDULED)
            and r.id not in self._respawning
            and now - as_utc(r.created).timestamp() > self.respawn_grace
        ]
        for user in {r.user for r in waiting}:
            try:
                servers = (await self.hub.user_now(user)).get("servers", {})
            except HubError as e:
                self._say("cannot read %s from the hub: %s", user, e.message)
                continue
            for record in (r for r in waiting if r.user == user):
                if (servers.get(record.server_name) or {}).get("pending") != "spawn":
                    self._respawning.add(record.id)
                    task = asyncio.create_task(self._respawn(record))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)

    async def _respawn(self, record) -> None:
        options = {
            "image": record.image,
            "cpu": record.cpu,
            "mem": record.mem,
            "fgpu": record.fgpu,
            "resource_group": record.resource_group,
        }
        try:
            # Read again: the user may have cancelled while the hub was asked about the server.
            if self.manager.get(record.id)["status"] not in (Status.PENDING, Status.SCHEDULED):
                return
            self._say("spawn of %s/%s was lost; issuing it again", record.user, record.server_name)
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
                except Exception:  # tried again next round
                    if self.log:
                        self.log.exception("reconciler: %s failed", step.__name__)

    def _say(self, message: str, *args) -> None:
        if self.log:
            self.log.warning("reconciler: " + message, *args)


def _stop_and_remove(container) -> None:
    try:
        container.stop(timeout=5)
        container.remove(force=True)
    except docker.errors.NotFound:
        pass  # gone already: what was wanted
