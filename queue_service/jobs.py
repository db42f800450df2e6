"""Batch jobs' rules: the time limit a job runs under, the longest it may ask for, and how many
one user may have waiting (docs/source/howto/batch-jobs.md).

The site sets a default and a maximum (QueueService.job_time_limit, job_time_limit_max); a hub
group may set tighter ones in its `job_time_limit` property, as `max_session_lifetime` bounds
sessions: a duration ("2h", the group's default and maximum alike) or `{"default": "1h", "max":
"8h"}`. A member of several groups gets the tightest of each. The rest of a job is a session's:
the same queue, quotas and budgets admit and place it, except that a waiting job counts against
`jobs_waiting_per_user` and not the `pending` quota (which bounds waiting sessions), and that a
job may name its earliest start (`start_after`), within QueueService.job_start_after_max.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select

from fgpu_shared import units
from image_catalog.job_options import parse_job, start_after_of, time_limit_rule
from queue_service.core.errors import Refusal
from queue_service.core.status import Status
from queue_service.store.models import SessionRecord, utcnow

from .automatic_ends import describe

JOB_TIME_PROPERTY = "job_time_limit"
#: How many batch jobs one user may have waiting, unless the site says otherwise
#: (QueueService.jobs_waiting_per_user).
JOBS_WAITING_PER_USER = 5
#: How far in the past a `start_after` may be (a form filled in a minute ago): it then starts now.
START_AFTER_PAST_GRACE = 60.0


@dataclass(frozen=True)
class GroupJobTimes:
    """One group's `job_time_limit`: seconds, each None where the group sets none."""

    default: float | None = None
    maximum: float | None = None


def parse_job_time_limit(value, where: str) -> GroupJobTimes:
    """A group's `job_time_limit` property, or ValueError naming `where` and what is allowed."""
    if value is None:
        return GroupJobTimes()
    try:
        if isinstance(value, dict):
            unknown = set(value) - {"default", "max"}
            if unknown:
                raise ValueError(f"unknown key(s) {sorted(unknown)}; it takes default and max")
            return GroupJobTimes(_seconds(value.get("default")), _seconds(value.get("max")))
        seconds = units.parse_duration(value)
        return GroupJobTimes(seconds, seconds)
    except ValueError as e:
        raise ValueError(f"{where}: {JOB_TIME_PROPERTY} {e}") from None


def _seconds(value) -> float | None:
    return None if value is None else units.parse_duration(value)


def tightest(limits) -> GroupJobTimes:
    """The tightest default and maximum of several groups' (a member of each gets these)."""
    limits = list(limits)
    defaults = [t.default for t in limits if t.default is not None]
    maxima = [t.maximum for t in limits if t.maximum is not None]
    return GroupJobTimes(min(defaults, default=None), min(maxima, default=None))


@dataclass(frozen=True)
class JobRules:
    """QueueService.job_time_limit, job_time_limit_max and jobs_waiting_per_user."""

    time_limit: float = 3600.0
    time_limit_max: float = 86400.0
    waiting_per_user: int = JOBS_WAITING_PER_USER
    #: Seconds ahead a job's `start_after` may be (QueueService.job_start_after_max; 0: any).
    start_after_max: float = 7 * 86400.0
    #: The tightest `job_time_limit` of a user's groups (QuotaBook.job_times_of).
    group_times: Callable[[str], GroupJobTimes] = field(default=lambda user: GroupJobTimes())

    def bounds(self, user: str) -> tuple[float, float]:
        """(default, maximum) seconds of a job of `user`: the site's, tightened by the groups'."""
        group = self.group_times(user)
        maximum = min(self.time_limit_max, group.maximum or self.time_limit_max)
        return min(group.default or self.time_limit, maximum), maximum

    def limit_of(self, job: dict, user: str = "") -> float:
        """The seconds a job may run: its own limit, or the default, never over the maximum."""
        default, maximum = self.bounds(user)
        return min(job.get("time_limit") or default, maximum)

    def refusal(self, db, request: dict) -> Refusal | None:
        """Why a job may not join the queue (None: it may); an interactive request always may."""
        job = parse_job(request.get("job_json"))
        if job is None:
            return None
        asked = job.get("time_limit")
        _, maximum = self.bounds(request["user"])
        if asked and asked > maximum:
            return Refusal(f"time_limit {describe(asked)}: {time_limit_rule(maximum)}.")
        if why := self.start_after_refusal(start_after_of(job), utcnow()):
            return Refusal(why)
        if self.waiting_per_user and self._waiting(db, request["user"]) >= self.waiting_per_user:
            return Refusal(
                f"You have {self.waiting_per_user} jobs waiting already, this hub's limit of "
                "waiting jobs per user (jobs_waiting_per_user); submit more once one has "
                "started, or cancel one.",
                "quota",
            )
        return None

    def start_after_refusal(self, start_after: datetime | None, now: datetime) -> str | None:
        """Why a job's `start_after` is refused at its submission (None: it is not): more than a
        minute in the past, or further ahead than the site allows."""
        if start_after is None:
            return None
        ahead = (start_after - now).total_seconds()
        if ahead < -START_AFTER_PAST_GRACE:
            return (
                f"start_after {start_after.isoformat()} is {describe(-ahead)} in the past; "
                "leave it out to start as soon as possible."
            )
        if self.start_after_max and ahead > self.start_after_max:
            return (
                f"start_after {start_after.isoformat()} is {describe(ahead)} ahead; a job may "
                f"be deferred by at most {_span(self.start_after_max)} on this hub."
            )
        return None

    @staticmethod
    def _waiting(db, user: str) -> int:
        query = select(func.count()).where(
            SessionRecord.user == user,
            SessionRecord.status == Status.PENDING,
            SessionRecord.job_json.is_not(None),
        )
        return db.scalar(query) or 0


def _span(seconds: float) -> str:
    """7 days as "7 days", 3600 s as "1 h"."""
    days = seconds / 86400
    return f"{days:g} days" if days >= 2 and days == int(days) else describe(seconds)
