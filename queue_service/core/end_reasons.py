"""Why a session ended, as a short code kept beside its free-text reason (docs/source/explanation/architecture.md, "The session lifecycle").

The code is what pages filter on and what the history API answers as `end_reason`; the label is
what people read. Every place that ends a record names one of these codes (the queue manager's
`release`, `release_where` and its pass; the reconciler; launches); a release that names none gets
`default_for(status)`.
"""

from __future__ import annotations

from queue_service.core.status import Status

USER = "user"
#: An admin stopped it: from the Sessions page, or the hub's admin panel and REST API
#: (fgpu_spawner/stop_requests.py).
ADMIN = "admin"
#: A course's instructor stopped a student's session (courses.py).
INSTRUCTOR = "instructor"
IDLE = "idle"
LIFETIME = "lifetime"
RECLAIMED = "reclaimed"
LOST = "lost"
ERROR = "error"
PENDING_TIMEOUT = "pending_timeout"
CANCELLED = "cancelled"
SUPERSEDED = "superseded"
HUB_STOPPED = "hub_stopped"
# A batch job's own ends (job_ends.py; a job over its time limit: automatic_ends.py).
FINISHED = "finished"
FAILED = "failed"
TIMEOUT = "timeout"

#: Every code, in the order pages list them, with the words people read.
LABELS: dict[str, str] = {
    USER: "Stopped by the user",
    ADMIN: "Stopped by an admin",
    INSTRUCTOR: "Stopped by an instructor",
    IDLE: "Idle",
    LIFETIME: "Lifetime reached",
    RECLAIMED: "Reclaimed for the queue",
    LOST: "Container or node lost",
    ERROR: "Failed to start or error",
    PENDING_TIMEOUT: "Waited too long in the queue",
    CANCELLED: "Cancelled",
    SUPERSEDED: "Replaced by a new start of the same server",
    HUB_STOPPED: "The hub stopped its server",
    FINISHED: "Job finished",
    FAILED: "Job failed",
    TIMEOUT: "Job reached its time limit",
}

_DEFAULTS = {
    Status.TERMINATED: USER,
    Status.CANCELLED: CANCELLED,
    Status.ERROR: ERROR,
    Status.PENDING_TIMEOUT: PENDING_TIMEOUT,
}


def is_code(value: object) -> bool:
    return isinstance(value, str) and value in LABELS


def label(code: str | None) -> str:
    """The words for `code`; an unknown one (from a newer version, say) is shown as it is."""
    if code is None:
        return ""
    return LABELS.get(code, code)


def default_for(status: str) -> str:
    """The code of an end that named none: a release of a running session is the user's stop
    (through the hub's home page, say), a release of a waiting one a cancel."""
    return _DEFAULTS[Status(status)]
