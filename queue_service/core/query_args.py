"""Query-string values (`?offset=`, `?from=`, `?wait=`...) as the API's handlers read them.

Every number, date, time and yes/no the handlers take from a query string goes through here, so
that a bad or extreme value is one clear 400 (a `Refusal`, "invalid") naming the parameter and
what it takes, never a 500 from deeper down: `offset=²` (a digit to `str.isdigit`, not to
`int`), `offset=99999999999999999999` (beyond the database's integers), `to=9999-12-31` (whose
next day no `datetime` holds). Dates and times are kept within `FIRST_DAY`..`LAST_DAY`, far
enough from `datetime`'s own ends that the spans the handlers build around them (a day later, ten
years before) always exist.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, date, datetime

from queue_service.core.errors import Refusal

FIRST_DAY = date(1970, 1, 1)
LAST_DAY = date(2999, 12, 31)
#: The largest whole number taken (an offset into the history, say): PostgreSQL's `integer`.
MAX_WHOLE = 2**31 - 1
#: ASCII digits only (`int` refuses "²", isdigit takes it), and few enough for any `high` taken
#: (a file's offset, to a PiB).
_WHOLE = re.compile(r"[0-9]{1,16}")
_TRUE, _FALSE = ("1", "true"), ("0", "false")


def whole(text: str | None, name: str, default: int, low: int, high: int = MAX_WHOLE) -> int:
    """A whole number from `low` to `high` (`default` when absent or empty)."""
    if not text:
        return default
    if not _WHOLE.fullmatch(text) or not low <= int(text) <= high:
        raise Refusal(f"`{name}` must be a whole number from {low} to {high}, not {text!r}.")
    return int(text)


def number(
    text: str | None, name: str, default: float, low: float, high: float, above_low=False
) -> float:
    """A finite number in [`low`, `high`], or in (`low`, `high`] with `above_low`."""
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan  # fails every comparison below
    floor_ok = value > low if above_low else value >= low
    if not (floor_ok and value <= high):
        span = f"above {low:g} and at most {high:g}" if above_low else f"from {low:g} to {high:g}"
        raise Refusal(f"`{name}` must be a number {span}, not {text!r}.")
    return value


def day(text: str | None, name: str) -> date | None:
    """An ISO date (2026-11-24) from `FIRST_DAY` to `LAST_DAY`; None when absent or empty."""
    if not text:
        return None
    try:
        value = date.fromisoformat(text)
    except ValueError:
        raise Refusal(f"`{name}` must be an ISO date (YYYY-MM-DD), not {text!r}.") from None
    _within_range(value, name, text)
    return value


def moment(text: str | None, name: str) -> datetime | None:
    """An ISO 8601 date and time (2026-11-24T06:00:00Z) in UTC (without an offset it is UTC);
    None when absent or empty."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise Refusal(
            f"`{name}` must be an ISO date (2026-11-24) or time (2026-11-24T06:00:00Z), "
            f"not {text!r}."
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    # Range first: near datetime's ends, converting to UTC could itself overflow.
    _within_range(value.date(), name, text)
    return value.astimezone(UTC)


def flag(text: str | None, name: str, default: bool) -> bool:
    """1/true or 0/false (any case); `default` when absent or empty."""
    if not text:
        return default
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise Refusal(f"`{name}` must be 1 or 0, not {text!r}.")


def _within_range(value: date, name: str, text: str) -> None:
    if not FIRST_DAY <= value <= LAST_DAY:
        raise Refusal(f"`{name}` must be from {FIRST_DAY} to {LAST_DAY}, not {text!r}.")
