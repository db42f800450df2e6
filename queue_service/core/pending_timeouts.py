"""Pending timeouts: which requests have waited longer than the configured limit. Pure: the
clock is passed in."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta


def pending_timeouts(
    enqueued_at: Mapping[str, datetime | float],
    now: datetime | float,
    timeout: timedelta | float | None,
) -> tuple[str, ...]:
    """Ids of the requests that have waited longer than `timeout`, oldest first.

    Times are datetimes (with a timedelta timeout) or seconds (with a number). A timeout of None or
    zero means requests wait for as long as it takes.
    """
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if seconds is None or seconds <= 0:
        return ()
    expired = [(t, rid) for rid, t in enqueued_at.items() if now - t > timeout]
    return tuple(rid for _, rid in sorted(expired))
