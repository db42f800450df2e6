"""Ghost servers: servers the hub lists as running with nothing behind them.

A server is a ghost when the hub lists it ready, yet the queue holds no live record (PENDING,
SCHEDULED, RUNNING) for it and no session container carries its name. The hub's own stop of a
spawn waiting in the queue could leave such servers: it cancelled the spawn, the spawner gave its
place in line back, and the hub then refused to stop the server (its spawn still unwinding) and
kept it listed. A ghost's student cannot start it again (the hub says it runs) and its link leads
nowhere. Whatever made one, the reconciler stops it through the hub's API once it has been listed
longer than a grace period (a server the hub has just started has its record already: the
spawner confirms it as RUNNING before the hub calls it ready).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import datetime

from queue_service.engine.session_containers import server_of

from .hub_client import HubError


def ghosts(
    started: dict[tuple[str, str], str | None],
    behind: set[tuple[str, str]],
    grace: float,
    now: float,
) -> list[tuple[str, str]]:
    """The servers of `started` (the hub's ready ones, with their start times) that nothing in
    `behind` accounts for and that were started more than `grace` seconds before `now`."""
    return sorted(
        key for key, since in started.items() if key not in behind and _age(since, now) > grace
    )


def _age(since: str | None, now: float) -> float:
    if not since:
        return float("inf")  # the hub keeps no start time: it is not a start in progress
    return now - datetime.fromisoformat(since.replace("Z", "+00:00")).timestamp()


def servers_behind(records: Iterable, containers: Iterable) -> set[tuple[str, str]]:
    """(user, server name) of every live record and every live session container."""
    keys = {(r.user, r.server_name) for r in records}
    return keys | {key for key in map(server_of, containers) if key is not None}


async def stop_ghosts(
    hub, manager, containers: dict, started: dict, grace: float, say: Callable
) -> None:
    """Stop, through the hub, each of its ready servers (`started`: HubClient.ready_server_starts)
    that has nothing behind it."""
    found = ghosts(
        started, servers_behind(manager.active_records(), containers.values()), grace, time.time()
    )
    if not found:
        return
    # Read again: a spawn may have been granted while the hub was asked.
    behind = servers_behind(manager.active_records(), containers.values())
    for user, server_name in (key for key in found if key not in behind):
        say(
            "the hub lists %s/%s as running, with no session and no container behind it; "
            "stopping it",
            user,
            server_name,
        )
        try:
            await hub.stop_server(user, server_name)
        except HubError as e:
            say("the hub cannot stop %s/%s (%s); trying again later", user, server_name, e.message)
