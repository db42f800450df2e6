"""usage.py: a hold's slots × time, split exactly at 00:00 UTC (pure arithmetic, no I/O)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

import pytest

from queue_service.core.usage import (
    GIB,
    Figures,
    Held,
    as_rows,
    clip,
    daily,
    day_spans,
    merge,
    total,
)

D1, D2, D3 = date(2026, 11, 23), date(2026, 11, 24), date(2026, 11, 25)


def at(day: date, hour: int, minute: int = 0, second: int = 0) -> datetime:
    return datetime(day.year, day.month, day.day, hour, minute, second, tzinfo=UTC)


def held(start, end, cpu=2.0, mem=3 * GIB, fgpu=0.5, user="alice", group="default") -> Held:
    return Held(user, group, start, end, cpu, mem, fgpu)


def test_a_span_within_one_day_is_one_part():
    assert day_spans(at(D1, 10), at(D1, 12, 30)) == [(D1, 9000.0)]


def test_a_span_is_cut_at_each_utc_midnight_and_its_parts_add_up():
    start, end = at(D1, 23), at(D3, 1, 30)
    spans = day_spans(start, end)
    assert spans == [(D1, 3600.0), (D2, 86400.0), (D3, 5400.0)]
    assert sum(seconds for _, seconds in spans) == (end - start).total_seconds()


def test_an_empty_or_backwards_span_has_no_parts():
    assert day_spans(at(D1, 10), at(D1, 10)) == []
    assert day_spans(at(D1, 10), at(D1, 9)) == []


def test_other_time_zones_are_cut_at_utc_midnight():
    plus_two = timezone(timedelta(hours=2))
    start = datetime(2026, 11, 24, 0, 30, tzinfo=plus_two)  # 22:30 UTC on the 23rd
    end = datetime(2026, 11, 24, 3, 0, tzinfo=plus_two)  # 01:00 UTC on the 24th
    assert day_spans(start, end) == [(D1, 5400.0), (D2, 3600.0)]


def test_daily_figures_are_slots_times_hours_per_day():
    table = daily([held(at(D1, 23), at(D2, 1, 30))])
    assert table == {
        (D1, "alice", "default"): Figures(2.0, 3.0, 0.5),
        (D2, "alice", "default"): Figures(3.0, 4.5, 0.75),
    }


def test_holds_of_the_same_day_user_and_group_add_up_and_others_stay_apart():
    table = daily(
        [
            held(at(D1, 8), at(D1, 9)),
            held(at(D1, 10), at(D1, 12), cpu=1.0, mem=GIB, fgpu=0.0),
            held(at(D1, 8), at(D1, 9), user="bob"),
            held(at(D1, 8), at(D1, 9), group="a100"),
        ]
    )
    assert table[(D1, "alice", "default")] == Figures(4.0, 5.0, 0.5)
    assert table[(D1, "bob", "default")] == Figures(2.0, 3.0, 0.5)
    assert table[(D1, "alice", "a100")] == Figures(2.0, 3.0, 0.5)


def test_clip_keeps_the_part_within_the_window():
    part = clip(held(at(D1, 20), at(D3, 4)), at(D2, 0), at(D2, 6))
    assert (part.start, part.end) == (at(D2, 0), at(D2, 6))
    assert clip(held(at(D1, 20), at(D1, 21)), at(D2, 0), None).start == at(D2, 0)
    assert daily([clip(held(at(D1, 20), at(D1, 21)), at(D2, 0), None)]) == {}


def test_merge_and_total_add_tables_and_figures():
    one = {(D1, "alice", "default"): Figures(1.0, 2.0, 3.0)}
    two = {(D1, "alice", "default"): Figures(0.5, 0.5, 0.5), (D2, "bob", ""): Figures(1, 1, 1)}
    merged = merge(one, two)
    assert merged[(D1, "alice", "default")] == Figures(1.5, 2.5, 3.5)
    assert total(merged.values()) == Figures(2.5, 3.5, 4.5)


def test_rows_are_oldest_day_first_with_figures_unrounded():
    table = {
        (D2, "alice", "default"): Figures(1 / 3, 0.0, 0.0),
        (D1, "bob", "default"): Figures(1.0, 2.0, 3.0),
    }
    rows = as_rows(table)
    assert [r["day"] for r in rows] == ["2026-11-23", "2026-11-24"]
    assert rows[1] == {
        "day": "2026-11-24",
        "user": "alice",
        "resource_group": "default",
        "cpu_hours": 1 / 3,
        "mem_gib_hours": 0.0,
        "fgpu_hours": 0.0,
    }


@pytest.mark.parametrize("seconds", [1, 59, 3601, 86399, 86401, 7 * 86400 + 17])
def test_the_days_of_a_hold_add_up_to_its_whole(seconds):
    start = at(D1, 13, 7, 11)
    end = start + timedelta(seconds=seconds)
    whole = total(daily([held(start, end)]).values())
    hours = seconds / 3600
    assert whole.cpu_hours == pytest.approx(2.0 * hours, rel=1e-12)
    assert whole.mem_gib_hours == pytest.approx(3.0 * hours, rel=1e-12)
    assert whole.fgpu_hours == pytest.approx(0.5 * hours, rel=1e-12)
