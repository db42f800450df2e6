"""budgets.py: budget keys in a group's `fgpu_quota`, windows of UTC days and weeks, refusals."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from queue_service.core.budgets import (
    Budget,
    BudgetError,
    first_refusal,
    parse_budgets,
    status,
    window,
)

WEDNESDAY = datetime(2026, 11, 25, 15, 30, tzinfo=UTC)
FGPU_REQUEST = {"cpu": 1.0, "mem": 1 << 30, "fgpu": 1.0}
CPU_REQUEST = {"cpu": 1.0, "mem": 1 << 30, "fgpu": 0.0}


def test_budget_keys_are_read_and_quota_keys_left_alone():
    data = {"fgpu": 2, "fgpu_hours_per_week": 20, "cpu_hours_per_day": "48"}
    assert parse_budgets(data, "students") == (
        Budget("students", "cpu_hours", "day", 48.0),
        Budget("students", "fgpu_hours", "week", 20.0),
    )
    assert parse_budgets(None, "students") == ()
    assert parse_budgets({"cpu": 4}, "students") == ()


@pytest.mark.parametrize("value", ["lots", -1, float("inf"), True, None, [20]])
def test_a_malformed_budget_is_refused_naming_group_and_key(value):
    with pytest.raises(BudgetError, match="group students: fgpu_hours_per_week"):
        parse_budgets({"fgpu_hours_per_week": value}, "students")


def test_windows_are_the_utc_day_and_the_iso_week():
    assert window("day", WEDNESDAY) == (
        datetime(2026, 11, 25, tzinfo=UTC),
        datetime(2026, 11, 26, tzinfo=UTC),
    )
    assert window("week", WEDNESDAY) == (
        datetime(2026, 11, 23, tzinfo=UTC),
        datetime(2026, 11, 30, tzinfo=UTC),
    )
    monday = datetime(2026, 11, 30, tzinfo=UTC)
    assert window("week", monday)[0] == monday


def test_a_used_up_budget_refuses_naming_it_and_when_it_frees_up():
    budget = Budget("students", "fgpu_hours", "week", 20.0)
    message = first_refusal([budget], {budget: 20.0}, FGPU_REQUEST, WEDNESDAY)
    assert "students" in message
    assert "20 fGPU-hours per week" in message
    assert "2026-11-30 00:00 UTC" in message
    assert "(20.00 used this week)" in message
    small = Budget("students", "fgpu_hours", "week", 0.0001)
    assert "(0.00042 used" in first_refusal([small], {small: 0.00042}, FGPU_REQUEST, WEDNESDAY)


def test_a_budget_with_room_or_not_charged_lets_the_request_in():
    budget = Budget("students", "fgpu_hours", "week", 20.0)
    assert first_refusal([budget], {budget: 19.99}, FGPU_REQUEST, WEDNESDAY) is None
    # A CPU-only session uses no fGPU-hours.
    assert first_refusal([budget], {budget: 25.0}, CPU_REQUEST, WEDNESDAY) is None
    cpu_budget = Budget("students", "cpu_hours", "day", 1.0)
    message = first_refusal([cpu_budget], {cpu_budget: 1.0}, CPU_REQUEST, WEDNESDAY)
    assert "2026-11-26 00:00 UTC" in message


def test_status_says_use_limit_and_when_the_window_ends():
    budget = Budget("students", "fgpu_hours", "week", 20.0)
    shown = status(budget, 12.5, WEDNESDAY)
    assert shown["used"] == 12.5 and shown["limit"] == 20.0 and not shown["used_up"]
    assert shown["frees_at"] == "2026-11-30T00:00:00+00:00"
