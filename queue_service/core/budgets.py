"""Budgets: how many core-, GiB- or fGPU-hours a hub group may use per UTC day or week.

Set in the same group property as the quotas (`fgpu_quota`, quotas.py), next to them:

    {"fgpu": 2, "fgpu_hours_per_week": 20, "cpu_hours_per_day": 48, "mem_gib_hours_per_week": 500}

A budget counts what all the group's members used in the current window (as quotas count all
members' holdings): the UTC day, or the ISO week from Monday 00:00 UTC. Once a window's use
reaches the budget, a new request that would use that slot is refused at admission, with a
message naming the budget and when the next window frees it; sessions already running or
waiting are left alone. Windows are whole UTC days, so the stored daily figures (usage.py) add
up to a window's use exactly.

Pure (no I/O): the clock's `now` and the group's use are passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from queue_service.core.usage import start_of_day

#: Figure → (slot it charges, how a person reads it).
FIGURE_SLOTS = {
    "cpu_hours": ("cpu", "CPU core-hours"),
    "mem_gib_hours": ("mem", "memory GiB-hours"),
    "fgpu_hours": ("fgpu", "fGPU-hours"),
}
PERIODS = ("day", "week")
#: Every budget key the `fgpu_quota` property may hold: `<figure>_per_<period>`.
BUDGET_KEYS = {f"{figure}_per_{period}" for figure in FIGURE_SLOTS for period in PERIODS}


class BudgetError(ValueError):
    pass


@dataclass(frozen=True)
class Budget:
    group: str
    figure: str  # one of FIGURE_SLOTS
    period: str  # one of PERIODS
    limit: float

    @property
    def label(self) -> str:
        return FIGURE_SLOTS[self.figure][1]

    def charges(self, request: dict) -> bool:
        """Whether a request with these slots uses what this budget counts (a CPU-only session
        uses no fGPU-hours)."""
        return float(request.get(FIGURE_SLOTS[self.figure][0]) or 0) > 0


def parse_budgets(data: dict | None, group: str) -> tuple[Budget, ...]:
    """The budgets in a group's `fgpu_quota` mapping (its other keys are the quota's)."""
    budgets = []
    for key in sorted(BUDGET_KEYS & set(data or {})):
        value = data[key]
        try:
            limit = float(value)
        except (TypeError, ValueError):
            limit = math.nan
        if isinstance(value, bool) or not math.isfinite(limit) or limit < 0:
            raise BudgetError(f"group {group}: {key} must be a number of hours, not {value!r}")
        figure, period = key.rsplit("_per_", 1)
        budgets.append(Budget(group, figure, period, limit))
    return tuple(budgets)


def window(period: str, now: datetime) -> tuple[datetime, datetime]:
    """[start, end) of the window around `now`: its UTC day, or its ISO week (Monday first)."""
    day = now.date()
    if period == "week":
        day -= timedelta(days=day.weekday())
    start = start_of_day(day)
    return start, start + timedelta(days=1 if period == "day" else 7)


def used_up(budget: Budget, used: float) -> bool:
    # Rounded as the pages show figures, so "20 of 20" never reads as room left.
    return round(used, 6) >= budget.limit


def refusal_message(budget: Budget, used: float, now: datetime) -> str:
    _, frees = window(budget.period, now)
    slot = FIGURE_SLOTS[budget.figure][0]
    what = "fGPU" if slot == "fgpu" else "CPU" if slot == "cpu" else "memory"
    return (
        f"The group {budget.group} has used its budget of {budget.limit:g} {budget.label} "
        f"per {budget.period} ({_hours(used)} used this {budget.period}): no new session with "
        f"{what} starts before it frees up at {frees:%Y-%m-%d %H:%M} UTC."
    )


def _hours(used: float) -> str:
    # Two decimals, or two significant digits for a small figure (0.0004 is not "0.00").
    return f"{used:.2f}" if used >= 0.1 or used == 0 else f"{used:.2g}"


def first_refusal(
    budgets: list[Budget], used: dict[Budget, float], request: dict, now: datetime
) -> str | None:
    """The message for the first budget that is used up and that `request` would charge."""
    for budget in budgets:
        if budget.charges(request) and used_up(budget, used[budget]):
            return refusal_message(budget, used[budget], now)
    return None


def status(budget: Budget, used: float, now: datetime) -> dict:
    """A budget as the indicator shows it."""
    start, end = window(budget.period, now)
    return {
        "group": budget.group,
        "figure": budget.figure,
        "label": budget.label,
        "period": budget.period,
        "limit": budget.limit,
        "used": round(used, 6),
        "window_start": start.isoformat(),
        "frees_at": end.isoformat(),
        "used_up": used_up(budget, used),
    }
