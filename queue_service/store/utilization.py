"""Cluster utilization over time in the service's DB: a sample every interval, kept bounded.

- **Sampling.** Every `interval` seconds the log measures the cluster (`cluster_figures`: the
  queue's inventory, its active records and the live usage the service already keeps, from the
  stats sampler or, in Swarm mode, the node reports) and writes one row (`level` 0). While the
  engine's state is unknown (the service just started, or the engine is down) nothing is
  written: a gap, not a made-up zero.
- **Bounded.** Rows older than `detail` are averaged into `bucket`-second rows (`level` 1,
  utilization.buckets: time-weighted means), and rows older than `retention` are deleted, at
  every sample. The table then holds at most about detail / interval + retention / bucket rows
  (1440 + 4320 with the defaults), however long the hub runs.
- **Reading.** `read(start, end)` answers at most `max_points` samples, averaged into equal
  buckets when there are more, so a week's chart is as light as an hour's.

Writes and reads run on the log's own thread, never on the event loop or the queue's DB thread.
The clock (`clock`) can be set, so tests move time instead of sleeping through it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from queue_service.core import utilization
from queue_service.store.db import DbThread
from queue_service.store.models import UtilizationSample, as_utc, utcnow

#: Most samples one answer carries (a week of 60-second samples is averaged into 14-minute ones).
MAX_POINTS = 720
RAW, BUCKETED = 0, 1


def cluster_figures(manager) -> dict | None:
    """The cluster now, from the queue's published state (no DB, no engine call); None while the
    engine's state is unknown."""
    if manager.engine_problem is not None:
        return None
    records = manager.active_records()
    usage = {r.id: manager.usage_of(r.id) for r in records if r.status == utilization.RUNNING}
    return utilization.measure(manager.nodes, records, usage, manager.settings.units_per_gpu)


class UtilizationLog:
    def __init__(
        self,
        db: sessionmaker,
        measure: Callable[[], dict | None],
        interval: float = 60.0,
        retention: timedelta = timedelta(days=30),
        detail: timedelta = timedelta(days=1),
        bucket: float = 600.0,
        clock: Callable[[], datetime] = utcnow,
        log=None,
    ):
        if interval < 0 or bucket <= 0 or detail < timedelta(0) or retention <= timedelta(0):
            raise ValueError(
                "Utilization sampling needs an interval of 0 (off) or more, a bucket and a "
                f"retention above 0 and a detail period of 0 or more; got interval={interval}, "
                f"bucket={bucket}, retention={retention}, detail={detail}."
            )
        self.db = db
        self.measure = measure
        self.interval = interval
        self.retention = retention
        self.detail = detail
        self.bucket = bucket
        self.clock = clock
        self.log = log
        self._thread = DbThread("fgpu-utilization")

    # -- writing ----------------------------------------------------------------------------------

    def record(self, figures: dict, at: datetime) -> None:
        """Write one sample taken at `at`, then average and drop what is old by then."""
        with self.db.begin() as db:
            db.add(_row(utilization.Sample(at, self.interval, figures), RAW))
            self.tidy(db, at)

    def tidy(self, db: Session, now: datetime) -> None:
        """Average the samples older than `detail` into buckets; drop rows past `retention`."""
        cutoff = utilization.bucket_start(now - self.detail, self.bucket)
        old = select(UtilizationSample).where(
            UtilizationSample.level == RAW, UtilizationSample.at < cutoff
        )
        raw = [_sample(row) for row in db.scalars(old)]
        if raw:
            db.execute(
                delete(UtilizationSample).where(
                    UtilizationSample.level == RAW, UtilizationSample.at < cutoff
                ),
                execution_options={"synchronize_session": False},
            )
            for averaged in utilization.buckets(raw, self.bucket):
                db.add(_row(self._merged(db, averaged), BUCKETED))
        db.execute(
            delete(UtilizationSample).where(UtilizationSample.at < now - self.retention),
            execution_options={"synchronize_session": False},
        )

    def _merged(self, db: Session, averaged: utilization.Sample) -> utilization.Sample:
        """`averaged` together with a bucket row already kept for the same bucket (written before
        a change of the clock or the settings), which is removed: one row per bucket."""
        query = select(UtilizationSample).where(
            UtilizationSample.level == BUCKETED, UtilizationSample.at == averaged.at
        )
        kept = list(db.scalars(query))
        if not kept:
            return averaged
        for row in kept:
            db.delete(row)
        return utilization.average([averaged, *map(_sample, kept)], averaged.at)

    async def sample_once(self) -> bool:
        """Measure the cluster now (on the loop, where the queue's state is published) and write
        it (on the log's thread). False when nothing could be measured."""
        figures = self.measure()
        if figures is None:
            return False
        at = self.clock()
        await self._thread.run(self.record, figures, at)
        return True

    async def run(self) -> None:
        while True:
            try:
                await self.sample_once()
            except Exception as e:  # the DB may be restarting; the next round tries again
                if self.log:
                    self.log.warning("utilization: sampling failed: %s", e)
            await asyncio.sleep(self.interval)

    # -- reading ----------------------------------------------------------------------------------

    def samples(self, db: Session, start: datetime, end: datetime) -> list[utilization.Sample]:
        """Every stored sample of [start, end], oldest first."""
        query = (
            select(UtilizationSample)
            .where(UtilizationSample.at >= start, UtilizationSample.at <= end)
            .order_by(UtilizationSample.at, UtilizationSample.id)
        )
        return [_sample(row) for row in db.scalars(query)]

    async def read(self, start: datetime, end: datetime, max_points: int = MAX_POINTS):
        """(samples of [start, end], at most about `max_points`; the width they were averaged
        into, or None when they are the stored ones)."""

        def read():
            with self.db() as db:
                return utilization.thin(self.samples(db, start, end), start, end, max_points)

        return await self._thread.run(read)


def _row(sample: utilization.Sample, level: int) -> UtilizationSample:
    return UtilizationSample(
        at=sample.at,
        level=level,
        seconds=sample.seconds,
        **{field: sample.get(field) for field in utilization.FIELDS},
    )


def _sample(row: UtilizationSample) -> utilization.Sample:
    figures = {field: getattr(row, field) for field in utilization.FIELDS}
    return utilization.Sample(as_utc(row.at), row.seconds, figures)
