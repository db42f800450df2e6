"""Ended sessions, read from the DB (docs/source/explanation/contracts.md, contract 4: `GET sessions?finished=1`).

The history grows without end, so it is never held in memory: each page of it is one indexed
query (`ix_sessions_ended`, `ix_sessions_user_ended`), newest end first, on a thread of its own
so that it neither waits for nor holds up the queue's passes.

- `parse_filters`: the query string → a `HistoryFilter`, or a Refusal (400) saying what is wrong;
- `finished_query`: the filter → one SELECT (pure);
- `finished_view`: one ended record → what the API answers (pure);
- `History`: runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from . import end_reasons, query_args
from .accounts import Account, sessions_of
from .db import DbThread
from .errors import Refusal
from .models import FINAL, SessionRecord, as_utc, request_view

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
_FINAL_VALUES = [status.value for status in FINAL]


@dataclass(frozen=True)
class HistoryFilter:
    """Which ended sessions, and which page of them: `user` None is everyone's; `account` (an
    `accounts.account_key`) narrows `user` to one of the accounts of that name; `since` and
    `until` bound the end time ([since, until))."""

    user: str | None = None
    end_reason: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = DEFAULT_LIMIT
    offset: int = 0
    account: str = ""


def parse_filters(
    args: dict[str, str], caller: str, admin: bool, caller_account: str = ""
) -> HistoryFilter:
    """The filter a caller asked for with `user=`, `reason=`, `from=`, `to=`, `limit=`,
    `offset=`. Admins see everyone's unless they name a user (every account of that name);
    others only their own account's (`caller_account`), and naming anyone else is refused (403)
    rather than silently narrowed."""
    user = args.get("user") or None
    if user is not None and user != caller and not admin:
        raise Refusal("Only admins may read other people's session history.", "forbidden")
    if not admin:
        user = caller
    code = args.get("reason") or None
    if code is not None and not end_reasons.is_code(code):
        known = ", ".join(end_reasons.LABELS)
        raise Refusal(f"Unknown reason {code!r}; use one of: {known}.")
    since = _moment(args.get("from"), "from", end_of_day=False)
    until = _moment(args.get("to"), "to", end_of_day=True)
    if since and until and since >= until:
        raise Refusal("`from` must come before `to`.")
    limit = query_args.whole(args.get("limit"), "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    offset = query_args.whole(args.get("offset"), "offset", 0, 0)
    account = "" if admin else caller_account
    return HistoryFilter(user, code, since, until, limit, offset, account)


def _moment(text: str | None, name: str, end_of_day: bool) -> datetime | None:
    """An ISO date (the whole day counts: `to=2026-11-24` takes in all of the 24th) or an ISO
    date and time (naive ones are UTC), in UTC: SQLite compares the stored text, which carries no
    offset."""
    if text and len(text) == 10:
        day = query_args.day(text, name)
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        return start + timedelta(days=1) if end_of_day else start
    return query_args.moment(text, name)


def finished_query(wanted: HistoryFilter):
    """The page `wanted` asks for, newest end first, one row more than the page (so the answer
    can say whether there is a next page without counting the whole history)."""
    query = select(SessionRecord).where(
        SessionRecord.status.in_(_FINAL_VALUES), SessionRecord.ended.is_not(None)
    )
    if wanted.user is not None:
        query = query.where(sessions_of(Account(wanted.user, wanted.account)))
    if wanted.end_reason is not None:
        query = query.where(SessionRecord.end_reason == wanted.end_reason)
    if wanted.since is not None:
        query = query.where(SessionRecord.ended >= wanted.since)
    if wanted.until is not None:
        query = query.where(SessionRecord.ended < wanted.until)
    return (
        query.order_by(SessionRecord.ended.desc(), SessionRecord.seq.desc())
        .offset(wanted.offset)
        .limit(wanted.limit + 1)
    )


def finished_view(record: SessionRecord) -> dict:
    """An ended session as the history shows it: what it asked for and got, when it started and
    ended, for how long it ran (None if it never did), and why it ended (code and words)."""
    started = as_utc(record.started) if record.started else None
    ended = as_utc(record.ended)
    return {
        **request_view(record),
        "account": record.account,
        "node": record.node,
        "created": as_utc(record.created).isoformat(),
        "started": started.isoformat() if started else None,
        "ended": ended.isoformat(),
        "duration": round((ended - started).total_seconds(), 3) if started else None,
        "end_reason": record.end_reason,
        "end_reason_label": end_reasons.label(record.end_reason),
        "reason": record.reason,
    }


class History:
    """Reads of the ended sessions, on a thread of their own."""

    def __init__(self, db: sessionmaker):
        self.db = db
        self._thread = DbThread("fgpu-history")

    async def finished(self, wanted: HistoryFilter) -> dict:
        """One page: `sessions`, and `next_offset` (None on the last page)."""

        def read() -> list[dict]:
            with self.db() as db:
                return [finished_view(r) for r in db.scalars(finished_query(wanted))]

        views = await self._thread.run(read)
        more = len(views) > wanted.limit
        return {
            "sessions": views[: wanted.limit],
            "limit": wanted.limit,
            "offset": wanted.offset,
            "next_offset": wanted.offset + wanted.limit if more else None,
            "reasons": end_reasons.LABELS,
        }
