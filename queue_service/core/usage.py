"""Usage arithmetic: the time a session held its slots, times those slots, split into UTC days.

Pure (no I/O, no clock): the store (`usage_store.py`) reads the sessions and passes `now` in, so
the figures can be checked against hand-made intervals, and time is never slept through in tests.

A session holds its slice from its grant (`scheduled_at`: from then on nobody else can have it,
whether or not its container is up yet) to its end (`ended`), or to `now` while it lasts. Each
day's share is that day's part of the interval, cut at 00:00 UTC, so the days of one session add
up to the whole: `cpu_hours` are core-hours, `mem_gib_hours` GiB-hours, `fgpu_hours` fGPU-hours.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

GIB = 1024**3
SECONDS_PER_HOUR = 3600.0
#: The slots as the figures name them, in the order CSV columns and pages show them.
FIGURES = ("cpu_hours", "mem_gib_hours", "fgpu_hours")


@dataclass(frozen=True)
class Held:
    """One session's hold: who, where, from when to when, and how much (cpu in cores, mem in
    bytes, fgpu in units)."""

    user: str
    resource_group: str
    start: datetime
    end: datetime
    cpu: float
    mem: int
    fgpu: float


@dataclass(frozen=True)
class Figures:
    cpu_hours: float = 0.0
    mem_gib_hours: float = 0.0
    fgpu_hours: float = 0.0

    def __add__(self, other: Figures) -> Figures:
        return Figures(*(getattr(self, f) + getattr(other, f) for f in FIGURES))

    def get(self, figure: str) -> float:
        return getattr(self, figure)

    def as_dict(self) -> dict[str, float]:
        return {f: getattr(self, f) for f in FIGURES}


#: Rows of the daily figures: (UTC day, user, resource group) → figures.
DayKey = tuple[date, str, str]


def start_of_day(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def day_spans(start: datetime, end: datetime) -> list[tuple[date, float]]:
    """[(UTC day, seconds of [start, end) on that day)], cut at each 00:00 UTC; empty when the
    interval is empty (or backwards, as a clock step could make it)."""
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    spans = []
    while start < end:
        next_midnight = start_of_day(start.date() + timedelta(days=1))
        part_end = min(end, next_midnight)
        spans.append((start.date(), (part_end - start).total_seconds()))
        start = part_end
    return spans


def figures_for(held: Held, seconds: float) -> Figures:
    hours = seconds / SECONDS_PER_HOUR
    return Figures(held.cpu * hours, held.mem / GIB * hours, held.fgpu * hours)


def clip(held: Held, start: datetime | None = None, end: datetime | None = None) -> Held:
    """The part of `held` within [start, end) (either open); possibly empty."""
    new_start = max(held.start, start) if start is not None else held.start
    new_end = min(held.end, end) if end is not None else held.end
    return Held(held.user, held.resource_group, new_start, new_end, held.cpu, held.mem, held.fgpu)


def daily(helds: Iterable[Held]) -> dict[DayKey, Figures]:
    """Each hold's figures, per UTC day, user and resource group, summed."""
    rows: dict[DayKey, Figures] = {}
    for held in helds:
        for day, seconds in day_spans(held.start, held.end):
            key = (day, held.user, held.resource_group)
            rows[key] = rows.get(key, Figures()) + figures_for(held, seconds)
    return rows


def merge(*tables: dict[DayKey, Figures]) -> dict[DayKey, Figures]:
    """Several daily tables (the stored days and the live sessions) as one."""
    merged: dict[DayKey, Figures] = {}
    for table in tables:
        for key, figures in table.items():
            merged[key] = merged.get(key, Figures()) + figures
    return merged


def total(rows: Iterable[Figures]) -> Figures:
    result = Figures()
    for figures in rows:
        result = result + figures
    return result


def as_rows(table: dict[DayKey, Figures]) -> list[dict]:
    """The API's rows, oldest day first, then by user and resource group; figures unrounded, so
    that they add up to slots × time (pages round them for people)."""
    return [
        {
            "day": day.isoformat(),
            "user": user,
            "resource_group": group,
            **figures.as_dict(),
        }
        for (day, user, group), figures in sorted(table.items())
    ]
