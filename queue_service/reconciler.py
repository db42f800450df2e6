"""The reconciler: the DB's allocations checked against the containers that really run.

A slice is held by a record in SCHEDULED or RUNNING. It is given back when:
- the session's container (found by its `fgpu.session_id` label) died or was removed outside the
  hub: the record ends as TERMINATED;
- a grant's container never appeared within `start_grace` seconds (the spawn died with the hub,
  say): the record ends as ERROR.

This runs on a bounded timer, off the grant path: releases through the spawner stay event-driven.
"""

from __future__ import annotations

import asyncio
import time

from .models import Status, as_utc

SESSION_LABEL = "fgpu.session_id"


class Reconciler:
    def __init__(self, manager, docker_client, log=None, start_grace: float = 180.0):
        self.manager = manager
        self.docker = docker_client
        self.log = log
        self.start_grace = start_grace

    def _running_sessions(self) -> set[str]:
        containers = self.docker.containers.list(filters={"label": SESSION_LABEL})
        return {c.labels[SESSION_LABEL] for c in containers if c.status == "running"}

    async def reconcile(self) -> None:
        running = await asyncio.get_running_loop().run_in_executor(None, self._running_sessions)
        gone, never_started = [], []
        now = time.time()
        for record in self.manager.active_records():
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

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reconcile()
                # Pending timeouts are checked in a pass; a quiet queue has none otherwise.
                await self.manager.schedule()
            except Exception as e:  # the engine may be restarting; try again next round
                self._say("reconcile failed: %s", e)

    def _say(self, message: str, *args) -> None:
        if self.log:
            self.log.warning("reconciler: " + message, *args)
