"""Whether a stop is the idle culler's: the reason a spawner gives when it releases a grant.

The hub does not tell a spawner who asked for a stop: the culler's `DELETE .../servers/{name}` and a
student's look the same from `stop()`. But the culler's decision is a test on data the spawner
holds, and holds unchanged while it stops: the hub's `last_activity` of this server (the culler
reads the same field from the hub's API; the hub moves it to "now" only after `stop()` returns,
`jupyterhub.user.User.stop`), or the server's start when it has none, older than the culler's
timeout. When that test holds in `stop()`, the stop is one the culler makes, or would make on its
next round: the session ended because nobody used it for the whole timeout, which is what the
`idle` reason tells people. The only stops it names `idle` that the culler did not send are those a
person sends in that window after the timeout and before the culler's next round (`--cull-every`,
a minute in the shipped config) to a session that had been idle all that time.

Asking the queue service to check instead would read the same field later, after the hub has
already moved it; wrapping the culler to announce its stops would depend on its internals.
"""

from __future__ import annotations

from datetime import UTC, datetime

IDLE = "idle"


def stop_reason(
    last_activity: datetime | None, started: datetime | None, idle_timeout: float, now: datetime
) -> str | None:
    """`idle` when the server has been inactive for at least `idle_timeout` seconds (the culler's
    own test: `inactive >= timeout`), else None. `idle_timeout` 0: no culler, never idle."""
    since = last_activity or started
    if idle_timeout <= 0 or since is None:
        return None
    inactive = (_aware(now) - _aware(since)).total_seconds()
    return IDLE if inactive >= idle_timeout else None


def reason_of(orm_spawner, idle_timeout: float) -> str | None:
    """`stop_reason` of the hub's record of a server (None for none), now."""
    if orm_spawner is None:
        return None
    return stop_reason(
        orm_spawner.last_activity, orm_spawner.started, idle_timeout, datetime.now(UTC)
    )


def _aware(moment: datetime) -> datetime:
    """The hub's ORM keeps naive UTC datetimes."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
