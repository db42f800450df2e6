"""Ended sessions' named servers, removed from the hub.

Every launch makes a named server (`s-xxxxxx`); once its session has ended, the hub would list the
stopped server on its home page forever. The history lives in the service instead
(`history.py`), so the server is removed from the hub (`DELETE /hub/api/users/{name}/servers/
{server}` with `{"remove": true}`; the service's role holds `servers`, which includes
`delete:servers`) once the hub has stopped it.

A record is done (`server_removed` set) once the hub no longer has the server, or a newer session
of the same name owns it. Anything else is tried again at the next round: a server the hub is
still stopping, a hub that is away or refuses (logged, then retried after `retry_after`
seconds). This runs on a timer of its own, off the grant path: it never holds up the queue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from sqlalchemy import select, update
from sqlalchemy.orm import sessionmaker

from queue_service.core.status import FINAL
from queue_service.store.db import DbThread
from queue_service.store.models import SessionRecord, utcnow

from .hub_client import HubError

_FINAL_VALUES = [status.value for status in FINAL]


def removal_candidates_query(limit: int):
    """Ended records of named servers not yet removed from the hub, oldest end first."""
    return (
        select(SessionRecord.user, SessionRecord.server_name)
        .where(
            SessionRecord.server_removed.is_(None),
            SessionRecord.ended.is_not(None),
            SessionRecord.status.in_(_FINAL_VALUES),
            SessionRecord.server_name != "",
        )
        .order_by(SessionRecord.ended)
        .limit(limit)
    )


def hub_server_state(user_model: dict, server_name: str) -> str:
    """What the hub has of this server: `gone`, `stopped`, or `active` (running, starting or
    stopping). `user_model` is the hub's, read with include_stopped_servers."""
    server = (user_model.get("servers") or {}).get(server_name)
    if server is None:
        return "gone"
    if server.get("pending") or server.get("ready") or not server.get("stopped", False):
        return "active"
    return "stopped"


class ServerRemover:
    """Removes the hub's stopped named servers of ended sessions, a batch per round."""

    def __init__(
        self,
        db: sessionmaker,
        hub,
        active_servers: Callable[[], set[tuple[str, str]]],
        log=None,
        batch: int = 50,
        retry_after: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.db = db
        self.hub = hub
        # (user, server name) of the sessions that have not ended (the queue's published state).
        self.active_servers = active_servers
        self.log = log
        self.batch = batch
        self.retry_after = retry_after
        self.clock = clock
        self._thread = DbThread("fgpu-server-removal")
        # (user, server name) → when a failed removal may be tried again.
        self._failed_until: dict[tuple[str, str], float] = {}

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.run_once()
            except Exception:  # tried again next round
                if self.log:
                    self.log.exception("server removal failed; trying again later")

    async def run_once(self) -> list[tuple[str, str]]:
        """One round; the (user, server name) pairs it settled."""
        now, round_start = self.clock(), utcnow()
        servers = [
            server
            for server in dict.fromkeys(await self._thread.run(self._candidates))
            if self._failed_until.get(server, 0) <= now
        ][: self.batch]
        done = []
        for user in dict.fromkeys(user for user, _ in servers):
            names = [name for u, name in servers if u == user]
            done += await self._settle_user(user, names)
        if done:
            await self._thread.run(self._mark_removed, done, round_start)
        return done

    async def _settle_user(self, user: str, names: list[str]) -> list[tuple[str, str]]:
        try:
            model = await self.hub.user_with_stopped_servers(user)
        except HubError as e:
            if e.status == 404:
                return [(user, name) for name in names]  # the user is gone, and their servers
            self._failed(user, names, e.message)
            return []
        except OSError as e:  # the hub is away
            self._failed(user, names, str(e))
            return []
        done = []
        for name in names:
            if await self._settle(user, name, model):
                done.append((user, name))
        return done

    async def _settle(self, user: str, name: str, model: dict) -> bool:
        """True once nothing is left to do for this server."""
        if (user, name) in self.active_servers():
            return True  # a newer session of the same name owns it; its own end removes it
        state = hub_server_state(model, name)
        if state == "gone":
            return True
        if state == "active":
            return False  # still stopping (or started again): looked at next round
        try:
            await self.hub.stop_server(user, name, remove=True)
        except HubError as e:
            if e.status == 404:
                return True
            self._failed(user, [name], e.message)
            return False
        except OSError as e:
            self._failed(user, [name], str(e))
            return False
        self._failed_until.pop((user, name), None)
        return True

    def _failed(self, user: str, names: list[str], message: str) -> None:
        if self.log:
            self.log.warning(
                "could not remove %s's ended server(s) %s from the hub (%s); trying again in %g s",
                user,
                ", ".join(names),
                message,
                self.retry_after,
            )
        for name in names:
            self._failed_until[(user, name)] = self.clock() + self.retry_after

    def _candidates(self) -> list[tuple[str, str]]:
        # More than a batch: those waiting out a failure must not starve the others.
        with self.db() as db:
            return [tuple(row) for row in db.execute(removal_candidates_query(self.batch * 4))]

    def _mark_removed(self, servers: list[tuple[str, str]], ended_by) -> None:
        """Mark the ended records of these servers; only those that had ended when the round
        began (one ending since has a server this round never looked at)."""
        now = utcnow()
        with self.db.begin() as db:
            for user, name in servers:
                db.execute(
                    update(SessionRecord)
                    .where(
                        SessionRecord.user == user,
                        SessionRecord.server_name == name,
                        SessionRecord.status.in_(_FINAL_VALUES),
                        SessionRecord.server_removed.is_(None),
                        SessionRecord.ended <= ended_by,
                    )
                    .values(server_removed=now)
                )
