"""utilization_store.py against real databases (SQLite and PostgreSQL): a sample of a real queue
written and read back, nothing written while the engine is unknown, a month of samples that stays
bounded (old samples averaged into buckets, the oldest dropped), long spans thinned, and the
migration. Time is moved by setting the log's clock, never slept through."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from alembic import command
from sqlalchemy import func, inspect, select

from queue_service.core import resource_model
from queue_service.core.utilization import FIELDS
from queue_service.queue import QueueManager
from queue_service.queue_pass import SchedulerSettings
from queue_service.quotas import QuotaBook
from queue_service.store.db import alembic_config, open_database
from queue_service.store.models import UtilizationSample, as_utc
from queue_service.store.utilization import BUCKETED, RAW, UtilizationLog, cluster_figures

GIB = 1024**3
MIB = 1024**2
GPU = "GPU-00000000-0000-0000-0000-000000000001"
NODE = resource_model.Node(
    "node-1", "default", cpu=4.0, mem=8 * GIB, gpus=(resource_model.Gpu(GPU, 8 * GIB),)
)
T0 = datetime(2026, 11, 1, tzinfo=UTC)


class Clock:
    def __init__(self, now: datetime = T0):
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def opened(db_url):
    engines = []

    def open_(**settings) -> tuple[QueueManager, UtilizationLog, Clock]:
        db = open_database(db_url)
        engines.append(db.kw["bind"])
        manager = QueueManager(db, [NODE], SchedulerSettings(units_per_gpu=2), QuotaBook())
        clock = Clock()
        measure = settings.pop("measure", lambda: cluster_figures(manager))
        log = UtilizationLog(db, measure, clock=clock, **settings)
        return manager, log, clock

    yield open_
    for engine in engines:
        engine.dispose()


def rows(log: UtilizationLog) -> list[UtilizationSample]:
    with log.db() as db:
        return list(db.scalars(select(UtilizationSample).order_by(UtilizationSample.at)))


async def test_a_sample_of_the_queue_is_kept_and_read_back(opened):
    manager, log, clock = opened()
    granted = await manager.submit(
        {"user": "ann", "server_name": "", "image": "python-3.11", "cpu": 0.5, "mem": 512 * MIB,
         "fgpu": 1.0}, groups=(),
    )  # fmt: skip
    await manager.mark_running(granted["id"])
    live = {"cpu_percent": 30.0, "mem_bytes": 100 * MIB, "gpu_util_percent": None}
    manager.usage_of = lambda session_id: live if session_id == granted["id"] else None

    assert await log.sample_once()
    samples, width = await log.read(clock.now - timedelta(hours=1), clock.now)
    assert width is None
    [sample] = samples
    assert sample.at == clock.now and sample.seconds == log.interval
    assert {f: sample.get(f) for f in FIELDS} == {
        "cpu_capacity": 4.0, "cpu_allocated": 0.5, "cpu_used": pytest.approx(0.3),
        "mem_capacity": 8 * GIB, "mem_allocated": 512 * MIB, "mem_used": 100 * MIB,
        "fgpu_capacity": 2.0, "fgpu_allocated": 1.0, "fgpu_used": None,
    }  # fmt: skip
    # A span that ends before it, or starts after it, has none of it.
    assert (await log.read(clock.now - timedelta(hours=1), clock.now - timedelta(seconds=1)))[
        0
    ] == []


async def test_nothing_is_written_while_the_engine_is_unknown(opened):
    manager, log, _ = opened()
    manager.engine_problem = "The Docker engine has not answered yet."
    assert not await log.sample_once()
    assert rows(log) == []


async def test_a_month_of_samples_stays_bounded_and_keeps_its_hourly_averages(opened):
    taken = []

    def alternating() -> dict:
        taken.append(None)
        return {field: float(len(taken) % 2) for field in FIELDS}  # 1, 0, 1, 0, ...

    interval, detail, bucket, retention = 600.0, timedelta(hours=2), 3600.0, timedelta(days=1)
    _, log, clock = opened(
        measure=alternating, interval=interval, detail=detail, bucket=bucket, retention=retention
    )
    most = 0
    for _ in range(int(timedelta(days=3).total_seconds() // interval)):
        assert await log.sample_once()
        most = max(most, len(rows(log)))
        clock.advance(interval)
    kept = rows(log)
    # Raw samples of the detail period (and the bucket not yet over), one row per older hour.
    bound = (detail.total_seconds() + bucket) / interval + retention.total_seconds() / bucket + 1
    assert most <= bound
    assert all(as_utc(r.at) >= clock.now - retention - timedelta(seconds=interval) for r in kept)
    bucketed = [r for r in kept if r.level == BUCKETED]
    raw = [r for r in kept if r.level == RAW]
    assert len(bucketed) >= 20 and raw
    assert max(as_utc(r.at) for r in bucketed) < min(as_utc(r.at) for r in raw)
    for row in bucketed:
        assert as_utc(row.at).minute == 0 and as_utc(row.at).second == 0
        assert row.seconds == bucket
        assert row.cpu_used == pytest.approx(0.5)  # three samples of 1 and three of 0
    assert {r.seconds for r in raw} == {interval}


async def test_a_bucket_that_gets_a_late_sample_stays_one_row(opened):
    def constant(value):
        return lambda: {field: value for field in FIELDS}

    _, log, clock = opened(measure=constant(2.0), interval=60.0, detail=timedelta(0), bucket=600.0)
    await log.sample_once()  # at T0
    clock.advance(600)
    await log.sample_once()  # T0's bucket is over: averaged
    # A sample from T0's bucket written afterwards (the clock was set back, say).
    log.record({field: 4.0 for field in FIELDS}, T0 + timedelta(seconds=60))
    clock.advance(600)
    await log.sample_once()
    first = [r for r in rows(log) if as_utc(r.at) == T0]
    assert len(first) == 1
    assert (first[0].level, first[0].seconds) == (BUCKETED, 120.0)
    assert first[0].cpu_capacity == pytest.approx(3.0)  # 2 and 4, a minute each


async def test_a_long_span_is_read_as_a_bounded_number_of_points(opened):
    _, log, clock = opened(measure=lambda: {field: 1.0 for field in FIELDS}, interval=60.0)
    start = clock.now
    for _ in range(100):
        await log.sample_once()
        clock.advance(60)
    samples, width = await log.read(start, clock.now, max_points=10)
    assert len(samples) <= 10 and width >= 600
    assert sum(s.seconds for s in samples) == 100 * 60
    assert {s.get("mem_used") for s in samples} == {1.0}


def test_bad_settings_are_refused_with_a_message(db_url):
    db = open_database(db_url)
    try:
        with pytest.raises(ValueError, match="bucket=0"):
            UtilizationLog(db, lambda: None, bucket=0)
        with pytest.raises(ValueError, match="retention"):
            UtilizationLog(db, lambda: None, retention=timedelta(0))
    finally:
        db.kw["bind"].dispose()


def test_the_migration_adds_and_removes_the_table(db_url):
    db = open_database(db_url)
    engine = db.kw["bind"]
    try:
        assert "utilization_samples" in inspect(engine).get_table_names()
        command.downgrade(alembic_config(db_url), "0006")
        assert "utilization_samples" not in inspect(engine).get_table_names()
        command.upgrade(alembic_config(db_url), "head")
        with db() as session:
            assert session.scalar(select(func.count()).select_from(UtilizationSample)) == 0
    finally:
        engine.dispose()
