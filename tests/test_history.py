"""The history of ended sessions (queue_service/store/history.py) against SQLite and PostgreSQL, and
the migration that gave records their end codes (0005)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from alembic import command
from sqlalchemy import create_engine, inspect, text

from queue_service.core import end_reasons, resource_model
from queue_service.core.errors import Refusal
from queue_service.core.status import Status
from queue_service.queue import QueueManager
from queue_service.queue_pass import SchedulerSettings
from queue_service.quotas import QuotaBook
from queue_service.store.db import alembic_config, open_database
from queue_service.store.history import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    History,
    HistoryFilter,
    parse_filters,
)
from queue_service.store.models import SessionRecord

GIB = 1024**3
NODE = resource_model.Node("node-1", "default", cpu=64.0, mem=64 * GIB, gpus=())


@pytest.fixture
def db(db_url):
    sessions = open_database(db_url)
    yield sessions
    sessions.kw["bind"].dispose()


def ended_record(n: int, user: str, code: str, ended: datetime, ran: float | None = 60.0):
    status = {
        "cancelled": Status.CANCELLED,
        "pending_timeout": Status.PENDING_TIMEOUT,
        "error": Status.ERROR,
    }.get(code, Status.TERMINATED)
    return SessionRecord(
        id=f"{n:032x}",
        seq=n,
        user=user,
        server_name=f"s-{n:06x}",
        status=status,
        image="python-3.11",
        cpu=1.0,
        mem=GIB,
        fgpu=0.5,
        reason=f"words for {code}",
        created=ended - timedelta(seconds=300),
        started=ended - timedelta(seconds=ran) if ran is not None else None,
        ended=ended,
        end_reason=code,
    )


NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def fill(db) -> None:
    """ann: 3 ended on the 22nd-24th; bob: 2 ended on the 23rd; one active of ann's."""
    with db.begin() as s:
        s.add(ended_record(1, "ann", "user", NOW - timedelta(days=2)))
        s.add(ended_record(2, "bob", "admin", NOW - timedelta(days=1, hours=1)))
        s.add(ended_record(3, "ann", "cancelled", NOW - timedelta(days=1), ran=None))
        s.add(ended_record(4, "bob", "idle", NOW - timedelta(days=1, hours=-1), ran=3600.5))
        s.add(ended_record(5, "ann", "lost", NOW))
        s.add(
            SessionRecord(
                id=f"{6:032x}", seq=6, user="ann", server_name="s-active", status=Status.RUNNING,
                image="python-3.11", cpu=1.0, mem=GIB, fgpu=0.0, reason="",
            )
        )  # fmt: skip


def ids(answer: dict) -> list[int]:
    return [int(s["id"], 16) for s in answer["sessions"]]


async def test_everyone_newest_first_and_only_ended(db):
    fill(db)
    answer = await History(db).finished(HistoryFilter())
    assert ids(answer) == [5, 4, 3, 2, 1]
    assert answer["next_offset"] is None
    idle = answer["sessions"][1]
    assert (idle["end_reason"], idle["end_reason_label"]) == ("idle", "Idle")
    assert idle["reason"] == "words for idle"
    assert idle["duration"] == 3600.5
    assert (idle["cpu"], idle["mem"], idle["fgpu"]) == (1.0, GIB, 0.5)
    assert datetime.fromisoformat(idle["ended"]) == NOW - timedelta(hours=23)
    never_ran = answer["sessions"][2]
    assert (never_ran["started"], never_ran["duration"]) == (None, None)
    assert never_ran["status"] == Status.CANCELLED
    assert answer["reasons"] == end_reasons.LABELS


async def test_filters_by_user_reason_and_dates(db):
    fill(db)
    history = History(db)
    assert ids(await history.finished(HistoryFilter(user="ann"))) == [5, 3, 1]
    assert ids(await history.finished(HistoryFilter(end_reason="admin"))) == [2]
    day = parse_filters({"from": "2026-11-23", "to": "2026-11-23"}, "root", admin=True)
    assert ids(await history.finished(day)) == [4, 3, 2]
    since = parse_filters({"from": "2026-11-23T12:30:00+01:00"}, "root", admin=True)
    assert ids(await history.finished(since)) == [5, 4, 3]


async def test_pages_follow_one_another_without_gaps(db):
    fill(db)
    history = History(db)
    first = await history.finished(HistoryFilter(limit=2))
    second = await history.finished(HistoryFilter(limit=2, offset=first["next_offset"]))
    last = await history.finished(HistoryFilter(limit=2, offset=second["next_offset"]))
    assert (ids(first), ids(second), ids(last)) == ([5, 4], [3, 2], [1])
    assert (first["next_offset"], second["next_offset"], last["next_offset"]) == (2, 4, None)


async def test_a_managers_ends_reach_the_history_with_their_codes(db):
    manager = QueueManager(db, [NODE], SchedulerSettings(), QuotaBook())
    ask = {"user": "ann", "image": "python-3.11", "cpu": 1.0, "mem": GIB}
    running = await manager.submit({**ask, "server_name": "s-1"}, groups=())
    await manager.mark_running(running["id"])
    lost = await manager.submit({**ask, "server_name": "s-2"}, groups=())
    await manager.release(running["id"])
    await manager.release_where([lost["id"]], Status.TERMINATED, "node gone", end_reason="lost")

    answer = await History(db).finished(HistoryFilter(user="ann"))

    assert [(s["id"], s["end_reason"]) for s in answer["sessions"]] == [
        (lost["id"], "lost"),
        (running["id"], "user"),
    ]
    assert answer["sessions"][1]["duration"] >= 0


def test_students_see_their_own_and_naming_another_is_refused():
    own = parse_filters({}, "ann", admin=False)
    assert own == HistoryFilter(user="ann")
    assert parse_filters({"user": "ann"}, "ann", admin=False).user == "ann"
    with pytest.raises(Refusal) as refused:
        parse_filters({"user": "bob"}, "ann", admin=False)
    assert refused.value.cause == "forbidden"
    assert parse_filters({}, "root", admin=True).user is None
    assert parse_filters({"user": "bob"}, "root", admin=True).user == "bob"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"reason": "bored"}, "Unknown reason 'bored'"),
        ({"from": "yesterday"}, "`from` must be an ISO date"),
        ({"to": "2026-13-01"}, "`to` must be an ISO date"),
        ({"from": "2026-11-24", "to": "2026-11-23"}, "`from` must come before `to`"),
        ({"limit": "0"}, f"`limit` must be a whole number from 1 to {MAX_LIMIT}"),
        ({"limit": str(MAX_LIMIT + 1)}, "`limit` must be a whole number"),
        ({"offset": "-1"}, "`offset` must be a whole number from 0 to 2147483647"),
        ({"limit": "ten"}, "`limit` must be a whole number"),
    ],
)
def test_bad_filters_are_refused_with_what_is_wrong(args, words):
    with pytest.raises(Refusal) as refused:
        parse_filters(args, "root", admin=True)
    assert refused.value.cause == "invalid"
    assert words in refused.value.message


def test_the_default_page_is_bounded():
    assert parse_filters({}, "root", admin=True).limit == DEFAULT_LIMIT <= MAX_LIMIT


def test_migration_0005_codes_the_ended_records_it_finds(db_url):
    """Records ended before the codes existed get theirs from their status and reason."""
    config = alembic_config(db_url)
    command.upgrade(config, "0004")
    engine = create_engine(db_url)
    rows = [
        ("a", "TERMINATED", ""),
        ("b", "TERMINATED", "superseded by a new start of the same server"),
        ("c", "TERMINATED", "the hub had stopped its server"),
        ("d", "TERMINATED", "the container stopped"),
        ("e", "CANCELLED", ""),
        ("f", "PENDING_TIMEOUT", "waited over 3600 s"),
        ("g", "ERROR", "no container started within 180 s"),
        ("h", "RUNNING", ""),
    ]
    with engine.begin() as connection:
        for seq, (key, status, reason) in enumerate(rows, 1):
            connection.execute(
                text(
                    'INSERT INTO sessions (id, seq, "user", server_name, status, image, cpu, '
                    "mem, fgpu, reason, skips, created) VALUES (:id, :seq, 'ann', '', :status, "
                    "'x', 1, 1, 0, :reason, 0, CURRENT_TIMESTAMP)"
                ),
                {"id": key, "seq": seq, "status": status, "reason": reason},
            )
    command.upgrade(config, "head")
    with engine.connect() as connection:
        codes = dict(connection.execute(text("SELECT id, end_reason FROM sessions")).all())
    indexes = {index["name"] for index in inspect(engine).get_indexes("sessions")}
    engine.dispose()
    assert codes == {
        "a": "user",
        "b": "superseded",
        "c": "hub_stopped",
        "d": "lost",
        "e": "cancelled",
        "f": "pending_timeout",
        "g": "error",
        "h": None,
    }
    assert {"ix_sessions_ended", "ix_sessions_user_ended", "ix_sessions_server_removed"} <= indexes
    command.downgrade(config, "0004")  # and back, leaving the table as 0004 had it
    engine = create_engine(db_url)
    columns = {column["name"] for column in inspect(engine).get_columns("sessions")}
    engine.dispose()
    assert "end_reason" not in columns and "server_removed" not in columns
