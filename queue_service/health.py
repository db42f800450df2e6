"""The service's own health, cheap enough to ask on every request (`api/health`): whether its
database answers, whether the Docker engine answered in the last reconciler round, and whether
that round (and the scheduling pass it runs) still comes round.

Each check is a pure function of what the service already knows (times it recorded, the queue's
`engine_problem`), apart from the database's `SELECT 1`. `HealthMonitor` runs them at most once
per `min_interval` seconds, however many callers ask at once: the endpoint answers anyone, a load
balancer or a monitoring probe, and must not let them make the service do more work.

The `containers` check names the session containers the engine did not answer about in time and
those frozen now or thawed in the last hour (container_calls.py, frozen_containers.py): the service
goes on without them, so it is `degraded`, never `fail`.

Statuses: `ok`; `degraded` (late, but working: a round slower than it should be); `fail` (no
session can start: the database or the engine does not answer, or the loop stopped).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from sqlalchemy import text

from queue_service.engine.node_reports import DAEMON_FIX
from queue_service.store.db import DbThread

OK, DEGRADED, FAIL = "ok", "degraded", "fail"
_RANK = {OK: 0, DEGRADED: 1, FAIL: 2}
#: A loop is late past this many of its intervals (one slow round is no fault), plus a margin.
LATE_ROUNDS = 3
LATE_MARGIN_SECONDS = 10.0
#: How long the database may take to answer `SELECT 1`.
DB_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    message: str
    #: What an admin does about it (empty when all is well).
    fix: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def overall(checks: Iterable[Check]) -> str:
    """The worst status among `checks`."""
    return max((c.status for c in checks), key=_RANK.__getitem__, default=OK)


def http_status(status: str) -> int:
    """200 while the service can serve (degraded included), 503 when it cannot."""
    return 503 if status == FAIL else 200


def late_after(interval: float) -> float:
    return LATE_ROUNDS * interval + LATE_MARGIN_SECONDS


def database_check(error: str | None, seconds: float) -> Check:
    if error is None:
        return Check("database", OK, f"the queue database answered in {seconds * 1000:.0f} ms")
    return Check(
        "database",
        FAIL,
        f"the queue database does not answer: {error}",
        "Check that the database server runs and that FGPU_QUEUE_DB_URL names it"
        " (`fgpu-hub doctor` tells more).",
    )


def engine_check(
    engine_problem: str | None, answered_at: float | None, now: float, interval: float
) -> Check:
    """The engine as the reconciler last saw it: it lists the sessions every round."""
    if engine_problem is not None:
        return Check(
            "engine",
            FAIL,
            engine_problem,
            "Start the Docker engine (or check DOCKER_HOST); the service recovers by itself.",
        )
    age = now - answered_at if answered_at is not None else None
    if age is None or age > late_after(interval):
        return Check(
            "engine",
            DEGRADED,
            f"the Docker engine last answered {_ago(age)}; the reconciler asks every"
            f" {interval:g} s",
            "Check the engine's load (`docker info`) and the service's log.",
        )
    return Check("engine", OK, f"the Docker engine answered {_ago(age)}")


def scheduler_check(
    finished_at: float | None, started_at: float, now: float, interval: float
) -> Check:
    """The reconciler's loop, whose every round ends with a scheduling pass (timeouts, what was
    freed outside the service): a round that no longer comes means a stuck loop or DB thread."""
    since = finished_at if finished_at is not None else started_at
    age = now - since
    if age <= late_after(interval):
        what = f"its last round ended {_ago(age)}" if finished_at else "starting"
        return Check("scheduler", OK, f"the scheduling loop runs ({what})")
    last = f"its last round ended {_ago(age)}" if finished_at else "no round ended yet"
    return Check(
        "scheduler",
        FAIL,
        f"the scheduling loop is stuck: {last}, rounds are every {interval:g} s",
        "Restart the hub (systemctl restart fgpu-hub), and report the service's log.",
    )


def containers_check(unresponsive: list, frozen: list[dict], thaws: list) -> Check:
    """Session containers the engine does not answer about, frozen ones, and recent thaws."""
    parts = [
        f"session {u.session_id} (container {u.container_id[:12]}) has not answered {u.what}"
        f" since {_clock(u.since)}"
        for u in unresponsive
    ]
    parts += [
        f"session {f['session_id']} (container {f['container']}) is frozen for {f['for']} s"
        for f in frozen
    ]
    parts += [
        f"session {t.session_id} (container {t.container_id[:12]}) was thawed at {_clock(t.at)}"
        f" after {t.frozen_for:.0f} s frozen ({t.how})"
        for t in thaws
    ]
    if not parts:
        return Check("containers", OK, "every session container answers")
    return Check(
        "containers",
        DEGRADED,
        "; ".join(parts),
        "The service goes on without these containers and thaws a frozen one by itself; if one"
        " stays, stop its session (or `docker rm -f` it) and read the engine's log.",
    )


def node_daemons_check(nodes: list[dict]) -> Check:
    """Swarm nodes whose engine lacks a setting that keeps sessions apart, from their agents'
    fresh reports (`NodeReports.nodes()`): a setting an agent could not read ("unknown") included."""
    parts = [
        f"node {node['node']}: {', '.join(node['isolation_problems'])}"
        for node in nodes
        if not node["stale"] and node.get("isolation_problems")
    ]
    if not parts:
        return Check("node daemons", OK, "every reporting node keeps sessions apart")
    return Check("node daemons", DEGRADED, "; ".join(parts), DAEMON_FIX)


def _clock(moment: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(moment))


def _ago(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.0f} s ago"


def select_one(db) -> None:
    """`SELECT 1` on the database of the sessionmaker `db`."""
    with db() as session:
        session.execute(text("SELECT 1"))


class HealthMonitor:
    """The checks, for `api/health`: run at most once per `min_interval`, the answer shared."""

    def __init__(
        self,
        manager,
        reconciler,
        db_probe: Callable[[], None],
        interval: float,
        containers: Callable[[], Check] | None = None,
        node_daemons: Callable[[], Check] | None = None,
        min_interval: float = 2.0,
        clock: Callable[[], float] = time.time,
    ):
        self.manager = manager
        self.reconciler = reconciler
        self.db_probe = db_probe
        self.interval = interval
        self.min_interval = min_interval
        self.clock = clock
        self.containers = containers
        self.node_daemons = node_daemons
        self.started_at = clock()
        self._last: tuple[float, list[Check]] | None = None
        self._running: asyncio.Future | None = None
        # A thread of its own: neither the queue's (a long pass must not read as a dead
        # database) nor the default executor (slow engine calls there must not either).
        self._thread = DbThread("fgpu-health")

    async def checks(self) -> list[Check]:
        if self._last is not None and self.clock() - self._last[0] < self.min_interval:
            return self._last[1]
        if self._running is None:
            self._running = asyncio.ensure_future(self._run())
            self._running.add_done_callback(self._forget)
        return await asyncio.shield(self._running)

    def _forget(self, _future) -> None:
        self._running = None

    async def _run(self) -> list[Check]:
        database = await self._database()
        now = self.clock()
        found = [
            database,
            engine_check(
                self.manager.engine_problem, self.reconciler.engine_answered_at, now, self.interval
            ),
            scheduler_check(self.reconciler.round_ended_at, self.started_at, now, self.interval),
        ]
        if self.containers is not None:
            found.append(self.containers())
        if self.node_daemons is not None:
            found.append(self.node_daemons())
        self._last = (now, found)
        return found

    async def _database(self) -> Check:
        began = time.monotonic()
        try:
            await asyncio.wait_for(self._thread.run(self.db_probe), DB_TIMEOUT_SECONDS)
        except TimeoutError:
            return database_check(f"no answer in {DB_TIMEOUT_SECONDS:g} s", 0.0)
        except Exception as e:
            return database_check(_first_line(e), 0.0)
        return database_check(None, time.monotonic() - began)


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
