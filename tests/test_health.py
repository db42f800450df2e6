"""The service's health checks (queue_service/health.py): the pure checks, and the monitor that
runs them against a real database (SQLite and PostgreSQL), at most once per interval."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from sqlalchemy.orm import sessionmaker

from queue_service import health
from queue_service.engine.container_calls import Unanswered
from queue_service.engine.frozen_containers import Thaw
from queue_service.store.db import make_engine

INTERVAL = 5.0


def test_the_worst_check_decides_and_only_a_failure_answers_503():
    ok = health.Check("a", health.OK, "")
    slow = health.Check("b", health.DEGRADED, "")
    down = health.Check("c", health.FAIL, "")
    assert health.overall([ok]) == health.OK
    assert health.overall([ok, slow]) == health.DEGRADED
    assert health.overall([slow, down, ok]) == health.FAIL
    assert [health.http_status(s) for s in (health.OK, health.DEGRADED, health.FAIL)] == [
        200,
        200,
        503,
    ]


def test_the_engine_check_follows_the_reconcilers_last_answer():
    now = 1000.0
    assert health.engine_check(None, now - 4, now, INTERVAL).status == health.OK
    late = health.engine_check(None, now - 60, now, INTERVAL)
    assert late.status == health.DEGRADED and "60 s ago" in late.message
    assert health.engine_check(None, None, now, INTERVAL).status == health.DEGRADED
    down = health.engine_check("The Docker engine is not answering (gone)", now - 1, now, INTERVAL)
    assert down.status == health.FAIL
    assert "not answering" in down.message and "DOCKER_HOST" in down.fix


def test_the_scheduler_check_fails_once_its_rounds_stop_coming():
    started = 1000.0
    assert health.scheduler_check(None, started, started + 3, INTERVAL).status == health.OK
    assert health.scheduler_check(started + 20, started, started + 24, INTERVAL).status == "ok"
    stuck = health.scheduler_check(started + 20, started, started + 200, INTERVAL)
    assert stuck.status == health.FAIL and "stuck" in stuck.message and stuck.fix
    never = health.scheduler_check(None, started, started + 200, INTERVAL)
    assert never.status == health.FAIL and "no round ended yet" in never.message


def monitor(db, clock, engine_problem=None) -> health.HealthMonitor:
    manager = SimpleNamespace(engine_problem=engine_problem)
    reconciler = SimpleNamespace(engine_answered_at=clock(), round_ended_at=clock())
    return health.HealthMonitor(
        manager, reconciler, lambda: health.select_one(db), INTERVAL, clock=clock
    )


async def test_a_reachable_database_is_healthy(db_url):
    db = sessionmaker(make_engine(db_url))
    checks = await monitor(db, lambda: 1000.0).checks()
    assert [(c.name, c.status) for c in checks] == [
        ("database", "ok"),
        ("engine", "ok"),
        ("scheduler", "ok"),
    ]
    db.kw["bind"].dispose()


async def test_a_file_that_is_no_database_fails_the_check(tmp_path):
    path = tmp_path / "queue.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    db = sessionmaker(make_engine(f"sqlite:///{path}"))
    checks = await monitor(db, lambda: 1000.0).checks()
    (database,) = [c for c in checks if c.name == "database"]
    assert database.status == health.FAIL
    assert "not a database" in database.message
    assert health.overall(checks) == health.FAIL


async def test_checks_run_at_most_once_per_interval_whoever_asks(tmp_path):
    calls = []
    now = [1000.0]
    db = sessionmaker(make_engine(f"sqlite:///{tmp_path / 'q.sqlite'}"))

    def probe():
        calls.append(1)
        health.select_one(db)

    watched = monitor(db, lambda: now[0])
    watched.db_probe = probe
    answers = await asyncio.gather(*(watched.checks() for _ in range(50)))
    assert len(calls) == 1 and all(a == answers[0] for a in answers)
    now[0] += 1.0
    await watched.checks()
    assert len(calls) == 1  # within min_interval: the same answer
    now[0] += watched.min_interval
    await watched.checks()
    assert len(calls) == 2


def test_the_containers_check_names_what_does_not_answer_is_frozen_or_was_thawed():
    assert health.containers_check([], [], []).status == health.OK
    stuck = Unanswered("a" * 64, "s1", "exec", 0.0)
    frozen = {"container": "b" * 12, "session_id": "s2", "for": 42}
    thaw = Thaw("c" * 64, "s3", 61.4, 0.0, "docker unpause")
    check = health.containers_check([stuck], [frozen], [thaw])
    assert check.status == health.DEGRADED  # the service goes on without them: never `fail`
    assert "session s1 (container aaaaaaaaaaaa) has not answered exec" in check.message
    assert "session s2 (container bbbbbbbbbbbb) is frozen for 42 s" in check.message
    assert "session s3 (container cccccccccccc) was thawed" in check.message
    assert "after 61 s frozen (docker unpause)" in check.message
    assert check.fix


def test_the_node_daemons_check_names_each_fresh_node_whose_engine_does_not_keep_sessions_apart():
    from queue_service.engine.node_reports import NodeReports, parse_report

    store = NodeReports()
    base = {"version": 2, "sampled_at": "t", "sessions": {}, "gpus": None}
    store.put(
        parse_report(
            "n1", {**base, "node": "n1", "daemon": {"icc": False, "no_new_privileges": True}}
        )
    )
    assert health.node_daemons_check(store.nodes()).status == health.OK
    store.put(parse_report("n2", {**base, "node": "n2"}))  # no "daemon": unknown
    store.put(
        parse_report(
            "n3", {**base, "node": "n3", "daemon": {"icc": True, "no_new_privileges": True}}
        )
    )
    check = health.node_daemons_check(store.nodes())
    assert check.status == health.DEGRADED
    assert "node n2: icc unknown" in check.message and "node n3: icc is true" in check.message
    assert "node n1" not in check.message
    assert '"icc": false' in check.fix and "no-new-privileges" in check.fix
