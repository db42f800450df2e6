"""usage_store.py against real databases (SQLite and PostgreSQL): sessions filed as they end,
live ones counted up to the book's clock, figures that outlive pruned records, and budgets at
admission. Time is moved by setting the book's clock, never slept through. The only test double
is a stand-in for the hub's REST API (group properties and members)."""

from __future__ import annotations

import threading
from datetime import UTC, date, datetime, timedelta

import pytest
from sqlalchemy import delete, event, func, select, update

from queue_service.core import resource_model
from queue_service.core.status import Status
from queue_service.core.usage import GIB, Figures, total
from queue_service.queue import QueueManager, Refused
from queue_service.queue_pass import SchedulerSettings
from queue_service.quotas import QuotaBook
from queue_service.store.db import open_database
from queue_service.store.models import SessionRecord, UsageDay, UsageRecorded, as_utc
from queue_service.store.usage import UsageBook

MIB = 1024**2
GPU = "GPU-00000000-0000-0000-0000-000000000001"
NODE = resource_model.Node(
    "node-1", "default", cpu=4.0, mem=8 * GIB, gpus=(resource_model.Gpu(GPU, 8 * GIB, 80),)
)
SETTINGS = SchedulerSettings(units_per_gpu=2)
MONDAY = date(2026, 11, 23)


def at(day: date, hour: int, minute: int = 0) -> datetime:
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=UTC)


class FakeHub:
    """Stands in for the hub's REST API (HubClient.group), nothing else."""

    def __init__(self, groups: dict[str, dict]):
        self.groups = groups

    async def group(self, name: str) -> dict:
        return {"name": name, **self.groups.get(name, {})}


@pytest.fixture
def opened(db_url):
    engines = []

    def open_(quotas=None) -> tuple[QueueManager, UsageBook]:
        db = open_database(db_url)
        engines.append(db.kw["bind"])
        quotas = quotas if quotas is not None else QuotaBook()
        manager = QueueManager(db, [NODE], SETTINGS, quotas)
        book = UsageBook(db, lambda node: "default" if node == "node-1" else None, quotas=quotas)
        manager.admission_check = book.admission_check
        return manager, book

    yield open_
    for engine in engines:
        engine.dispose()


def ask(user="alice", server="", fgpu=1.0, cpu=0.5, mem=512 * MIB) -> dict:
    image = "python-3.11"
    return {
        "user": user,
        "server_name": server,
        "image": image,
        "cpu": cpu,
        "mem": mem,
        "fgpu": fgpu,
    }


def whole(table) -> Figures:
    return total(table.values())


def expected(hours: float, cpu=0.5, mem=512 * MIB, fgpu=1.0) -> Figures:
    return Figures(cpu * hours, mem / GIB * hours, fgpu * hours)


def assert_figures(actual: Figures, wanted: Figures) -> None:
    for figure in ("cpu_hours", "mem_gib_hours", "fgpu_hours"):
        assert actual.get(figure) == pytest.approx(wanted.get(figure), rel=1e-9, abs=1e-12)


def add_ended(db, user: str, start: datetime, end: datetime, fgpu=1.0, seq=None) -> str:
    with db.begin() as s:
        seq = seq or (s.scalar(select(func.max(SessionRecord.seq))) or 0) + 1
        record = SessionRecord(
            id=f"{seq:032x}", seq=seq, user=user, server_name=f"s{seq}", image="python-3.11",
            cpu=0.5, mem=512 * MIB, fgpu=fgpu, node="node-1", status=Status.TERMINATED,
            created=start, scheduled_at=start, started=start, ended=end,
        )  # fmt: skip
        s.add(record)
        return record.id


async def test_an_ended_session_is_filed_and_its_figures_outlive_its_record(opened):
    manager, book = opened()
    granted = await manager.submit(ask(), groups=())
    await manager.mark_running(granted["id"])
    await manager.release(granted["id"])
    with manager.db() as db:
        record = db.get(SessionRecord, granted["id"])
        held = (as_utc(record.ended) - as_utc(record.scheduled_at)).total_seconds() / 3600
        first, last = as_utc(record.scheduled_at).date(), as_utc(record.ended).date()
        assert db.get(UsageRecorded, granted["id"]) is not None
    assert held > 0
    figures = whole(await book.report(first, last))
    assert_figures(figures, expected(held))

    # Touched again after its end (an edited reason), it is not filed twice.
    with manager.db.begin() as db:
        db.get(SessionRecord, granted["id"]).reason = "edited"
    assert whole(await book.report(first, last)) == figures

    # Pruned: the stored days still say the same.
    with manager.db.begin() as db:
        db.execute(delete(SessionRecord))
    assert whole(await book.report(first, last)) == figures
    rows = await book.report(first, last, users=["alice"])
    assert {user for _, user, _ in rows} == {"alice"}
    assert await book.report(first, last, users=["bob"]) == {}


async def test_a_running_session_counts_up_to_the_clocks_now_split_at_midnight(opened):
    manager, book = opened()
    granted = await manager.submit(ask(fgpu=0.5), groups=())
    await manager.mark_running(granted["id"])
    with manager.db.begin() as db:
        db.execute(
            update(SessionRecord)
            .where(SessionRecord.id == granted["id"])
            .values(scheduled_at=at(MONDAY, 22), started=at(MONDAY, 22, 1))
        )
    tuesday = MONDAY + timedelta(days=1)
    book.clock = lambda: at(tuesday, 1, 30)
    table = await book.report(MONDAY, tuesday)
    assert_figures(table[(MONDAY, "alice", "default")], expected(2.0, fgpu=0.5))
    assert_figures(table[(tuesday, "alice", "default")], expected(1.5, fgpu=0.5))

    book.clock = lambda: at(tuesday, 4)
    table = await book.report(MONDAY, tuesday)
    assert_figures(table[(tuesday, "alice", "default")], expected(4.0, fgpu=0.5))
    # A window that ends before the session began has none of it.
    assert await book.report(MONDAY - timedelta(days=3), MONDAY - timedelta(days=1)) == {}


async def test_a_session_ended_outside_the_service_counts_until_filed_once(opened, db_url):
    manager, book = opened()
    outside = open_database(db_url)  # another process's sessionmaker: nothing files its ends
    try:
        session_id = add_ended(outside, "bob", at(MONDAY, 9), at(MONDAY, 12))
        with manager.db() as db:
            assert db.get(UsageRecorded, session_id) is None
        before = await book.report(MONDAY, MONDAY)
        assert_figures(whole(before), expected(3.0))
        filing = FilingThreads(manager.db)
        assert await book.file_unfiled() == 1
        assert await book.file_unfiled() == 0
        # Filed off the event loop's thread: a long backlog must not stall the service's start.
        assert filing.threads and threading.get_ident() not in filing.threads
        assert whole(await book.report(MONDAY, MONDAY)) == whole(before)
        with manager.db() as db:
            assert db.scalar(select(func.count()).select_from(UsageDay)) == 1
    finally:
        outside.kw["bind"].dispose()


class FilingThreads:
    """The threads on which `db`'s sessions commit (a real SQLAlchemy event, no stand-in)."""

    def __init__(self, db):
        self.threads: set[int] = set()
        event.listen(db, "before_commit", lambda _: self.threads.add(threading.get_ident()))


async def test_a_used_up_group_budget_refuses_until_the_window_moves(opened):
    quotas = QuotaBook()
    students = {
        "properties": {"fgpu_quota": {"fgpu_hours_per_week": 10}},
        "users": ["carol", "dave"],
    }
    hub = FakeHub({"students": students})
    for user in ("carol", "dave"):
        await quotas.refresh({"name": user, "groups": ["students"]}, hub)
    manager, book = opened(quotas)
    # carol used the group's 10 fGPU-hours on Monday.
    add_ended(manager.db, "carol", at(MONDAY, 8), at(MONDAY, 18))
    wednesday = at(MONDAY + timedelta(days=2), 12)
    book.clock = lambda: wednesday

    with pytest.raises(Refused) as refused:
        await manager.submit(ask(user="dave"), groups=("students",))
    assert refused.value.cause == "quota"
    message = refused.value.message
    assert "students" in message and "10 fGPU-hours per week" in message, message
    assert "2026-11-30 00:00 UTC" in message, message
    assert manager.sessions(user="dave") == []
    shown = await book.budget_status("dave", ("students",))
    assert [(b["figure"], b["used"], b["used_up"]) for b in shown] == [("fgpu_hours", 10.0, True)]

    # A CPU-only session uses no fGPU-hours: in.
    cpu_only = await manager.submit(ask(user="dave", server="cpu", fgpu=0), groups=("students",))
    assert cpu_only["status"] == Status.SCHEDULED
    # A user outside the group has no such budget.
    erin = await manager.submit(ask(user="erin", server="g"), groups=())
    assert erin["status"] == Status.SCHEDULED
    await manager.release(erin["id"])

    # The next week begins: the budget is whole again.
    book.clock = lambda: at(MONDAY + timedelta(days=7), 0)
    granted = await manager.submit(ask(user="dave", server="gpu"), groups=("students",))
    assert granted["status"] == Status.SCHEDULED, granted["reason"]
