"""Pending timeouts on their own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from queue_service.core.pending_timeouts import pending_timeouts


def test_pending_timeouts_with_seconds_and_datetimes():
    enqueued = {"old": 100.0, "new": 190.0, "older": 50.0}
    assert pending_timeouts(enqueued, now=200.0, timeout=60) == ("older", "old")
    assert pending_timeouts(enqueued, now=200.0, timeout=None) == ()
    assert pending_timeouts(enqueued, now=200.0, timeout=0) == ()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    stamps = {"a": start, "b": start + timedelta(minutes=9)}
    assert pending_timeouts(stamps, start + timedelta(minutes=10), timedelta(minutes=5)) == ("a",)
