"""A session record's status, and which statuses hold an allocation or are final."""

from __future__ import annotations

import enum


class Status(enum.StrEnum):
    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    TERMINATED = "TERMINATED"
    CANCELLED = "CANCELLED"
    ERROR = "ERROR"
    PENDING_TIMEOUT = "PENDING_TIMEOUT"


#: Statuses that hold an allocation.
ALLOCATED = (Status.SCHEDULED, Status.RUNNING)
#: Statuses a record never leaves.
FINAL = (Status.TERMINATED, Status.CANCELLED, Status.ERROR, Status.PENDING_TIMEOUT)
