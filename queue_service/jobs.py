"""Batch jobs' site rules: the time limit a job runs under, the longest it may ask for, and how
many one user may have waiting (docs/source/howto/batch-jobs.md).

The rest of a job is a session's: the same queue, quotas and budgets admit and place it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select

from image_catalog.job_options import parse_job
from queue_service.core.errors import Refusal
from queue_service.core.status import Status
from queue_service.store.models import SessionRecord

from .automatic_ends import describe


@dataclass(frozen=True)
class JobRules:
    """QueueService.job_time_limit, job_time_limit_max and jobs_waiting_per_user."""

    time_limit: float = 3600.0
    time_limit_max: float = 86400.0
    waiting_per_user: int = 5

    def limit_of(self, job: dict) -> float:
        """The seconds a job may run: its own limit, or the site's, never over the maximum."""
        return min(job.get("time_limit") or self.time_limit, self.time_limit_max)

    def refusal(self, db, request: dict) -> Refusal | None:
        """Why a job may not join the queue (None: it may); an interactive request always may."""
        job = parse_job(request.get("job_json"))
        if job is None:
            return None
        asked = job.get("time_limit")
        if asked and asked > self.time_limit_max:
            return Refusal(
                f"time_limit {describe(asked)} is over this hub's maximum for a job, "
                f"{describe(self.time_limit_max)}."
            )
        if self.waiting_per_user and self._waiting(db, request["user"]) >= self.waiting_per_user:
            return Refusal(
                f"You have {self.waiting_per_user} jobs waiting already, this hub's limit; "
                "submit more once one has started, or cancel one.",
                "quota",
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
