"""Usage accounting in the service's DB: the daily figures of ended sessions, plus the live ones.

- **Filed when a session ends.** Every transaction of the service's sessionmaker that ends a
  session that held a slice (TERMINATED, ERROR, ... with a `scheduled_at`) adds that session's
  per-day figures to `usage_days` and its id to `usage_recorded`, in the same transaction: the
  figures then outlive the session records, should old ones ever be pruned. The queue needs no
  call for it (SQLAlchemy's `before_flush` sees the ending, `before_commit` files it).
- **Counted live until filed.** A session that holds a slice now, or ended a moment ago and is
  not filed yet (say, ended by an SQL edit outside the service), is counted from its record, up
  to the book's clock's `now`. Stored days + live sessions are the figures, whatever the moment.
- **Budgets** (budgets.py) are checked at admission on the queue's DB thread, inside its write
  (`QueueManager.admission_check`), so the check and the admission see the same state.

The clock (`UsageBook.clock`) can be set, so tests move time instead of sleeping through it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import date, datetime, timedelta

from sqlalchemy import event, or_, select
from sqlalchemy.orm import Session, sessionmaker

from queue_service.core import budgets as budget_rules
from queue_service.core import usage
from queue_service.core.errors import Refusal
from queue_service.core.status import FINAL
from queue_service.store.accounts import Account, any_of
from queue_service.store.db import DbThread
from queue_service.store.models import SessionRecord, UsageDay, UsageRecorded, as_utc, utcnow

_FINAL_VALUES = [status.value for status in FINAL]
_ENDED_KEY = "fgpu_usage_ended"


class UsageBook:
    def __init__(
        self,
        db: sessionmaker,
        group_of_node: Callable[[str | None], str | None] = lambda node: None,
        clock: Callable[[], datetime] = utcnow,
        quotas=None,
    ):
        self.db = db
        #: The resource group of a node, for records that did not name one.
        self.group_of_node = group_of_node
        self.clock = clock
        #: Where group budgets and members come from (quotas.QuotaBook); None: no budgets.
        self.quotas = quotas
        # Reads for the API and pages, apart from the queue's thread: a year of figures never
        # holds up a grant.
        self._thread = DbThread("fgpu-usage")
        event.listen(db, "before_flush", _collect_ended)
        event.listen(db, "before_commit", self._file_ended)

    # -- filing ended sessions ----------------------------------------------------------------

    def _file_ended(self, db: Session) -> None:
        db.flush()  # so that `_collect_ended` has seen every change of this transaction
        ended = db.info.pop(_ENDED_KEY, None)
        if ended:
            self.file(db, list(ended.values()))

    def file(self, db: Session, records: Iterable[SessionRecord]) -> None:
        """Add these ended sessions' figures to `usage_days`, each session once."""
        records = {r.id: r for r in records if r.scheduled_at is not None and r.ended is not None}
        if not records:
            return
        filed = set(
            db.scalars(
                select(UsageRecorded.session_id).where(UsageRecorded.session_id.in_(records))
            )
        )
        new = [r for r in records.values() if r.id not in filed]
        for account in {r.account or "" for r in new}:
            ended = (self._held(r) for r in new if (r.account or "") == account)
            for key, figures in usage.daily(ended).items():
                self._add_to_day(db, key, account, figures)
        for record in new:
            db.add(UsageRecorded(session_id=record.id))

    @staticmethod
    def _add_to_day(db: Session, key: usage.DayKey, account: str, figures: usage.Figures) -> None:
        day, user, group = key
        row = db.get(UsageDay, (day, user, account, group))
        if row is None:
            row = UsageDay(day=day, user=user, account=account, resource_group=group)
            row.cpu_hours = row.mem_gib_hours = row.fgpu_hours = 0.0
            db.add(row)
        for figure in usage.FIGURES:
            setattr(row, figure, getattr(row, figure) + figures.get(figure))

    async def file_unfiled(self) -> int:
        """File every ended session not filed yet (those that ended before this version of the
        service, or outside it); the service runs it once at start. Returns how many. On the
        book's own thread: years of history to file must not stall the event loop."""
        return await self._thread.run(self._file_unfiled)

    def _file_unfiled(self) -> int:
        with self.db.begin() as db:
            query = select(SessionRecord).where(
                SessionRecord.status.in_(_FINAL_VALUES),
                SessionRecord.scheduled_at.is_not(None),
                SessionRecord.ended.is_not(None),
                SessionRecord.id.not_in(select(UsageRecorded.session_id)),
            )
            records = list(db.scalars(query))
            self.file(db, records)
        return len(records)

    def _held(self, record: SessionRecord, now: datetime | None = None) -> usage.Held:
        end = as_utc(record.ended) if record.ended is not None else now
        return usage.Held(
            user=record.user,
            resource_group=record.resource_group or self.group_of_node(record.node) or "",
            start=as_utc(record.scheduled_at),
            end=end,
            cpu=record.cpu,
            mem=record.mem,
            fgpu=record.fgpu,
        )

    # -- reading the figures --------------------------------------------------------------------

    def table(
        self,
        db: Session,
        first: date,
        last: date,
        users: Iterable[str | Account] | None = None,
        now: datetime | None = None,
    ) -> dict[usage.DayKey, usage.Figures]:
        """The figures of the UTC days `first`..`last` (inclusive), of `users` (None: everyone;
        a name: every account it has had; an Account: that one), the stored days and the live
        sessions together, live ones counted up to `now`."""
        now = now or self.clock()
        start, end = usage.start_of_day(first), usage.start_of_day(last + timedelta(days=1))
        stored = select(UsageDay).where(UsageDay.day >= first, UsageDay.day <= last)
        live = select(SessionRecord).where(
            SessionRecord.scheduled_at.is_not(None),
            SessionRecord.scheduled_at < end,
            or_(SessionRecord.ended.is_(None), SessionRecord.ended > start),
            SessionRecord.id.not_in(select(UsageRecorded.session_id)),
        )
        if users is not None:
            accounts = [u if isinstance(u, Account) else Account(u) for u in set(users)]
            stored = stored.where(any_of(accounts, UsageDay))
            live = live.where(any_of(accounts, SessionRecord))
        # A name's accounts share a row of the answer (a person reads the figures by name).
        table = usage.merge(
            *(
                {
                    (row.day, row.user, row.resource_group): usage.Figures(
                        row.cpu_hours, row.mem_gib_hours, row.fgpu_hours
                    )
                }
                for row in db.scalars(stored)
            )
        )
        held = [usage.clip(self._held(r, now), start, min(end, now)) for r in db.scalars(live)]
        return usage.merge(table, usage.daily(held))

    async def report(
        self, first: date, last: date, users: Iterable[str | Account] | None = None
    ) -> dict[usage.DayKey, usage.Figures]:
        """`table`, read on the usage thread in one snapshot (PostgreSQL's REPEATABLE READ:
        a session filed between the two queries is counted once, not twice or never)."""

        def read():
            with self.db() as db:
                if db.get_bind().dialect.name == "postgresql":
                    db.connection(execution_options={"isolation_level": "REPEATABLE READ"})
                return self.table(db, first, last, users)

        return await self._thread.run(read)

    # -- budgets ----------------------------------------------------------------------------------

    def _budgets(self, groups: Iterable[str]) -> list[budget_rules.Budget]:
        if self.quotas is None:
            return []
        return [b for group in groups for b in self.quotas.budgets_of(group)]

    def budget_use(
        self, db: Session, user: str | Account, groups: Iterable[str], now: datetime
    ) -> dict[budget_rules.Budget, float]:
        """Each budget of `groups`: what its group's members used in its current window; the
        asking user's own account only (an earlier account of the name used nothing of it)."""
        user = user if isinstance(user, Account) else Account(user)
        use = {}
        for budget in self._budgets(groups):
            start, _ = budget_rules.window(budget.period, now)
            others = set(self.quotas.members_of(budget.group)) - {user.name}
            members = {user, *others}
            table = self.table(db, start.date(), now.date(), members, now)
            use[budget] = usage.total(table.values()).get(budget.figure)
        return use

    def admission_check(self, db: Session, request: dict, groups) -> Refusal | None:
        """The queue's admission hook: a refusal when a used-up budget of the user's groups
        counts what `request` asks for."""
        now = self.clock()
        account = Account(request["user"], request.get("account") or "")
        use = self.budget_use(db, account, groups, now)
        message = budget_rules.first_refusal(list(use), use, request, now)
        return Refusal(message, "quota") if message else None

    async def budget_status(self, user: str | Account, groups: Iterable[str]) -> list[dict]:
        """The budgets of `user`'s groups with their use this window, for the indicator."""
        groups = tuple(groups)

        def read():
            now = self.clock()
            with self.db() as db:
                use = self.budget_use(db, user, groups, now)
            return [budget_rules.status(b, used, now) for b, used in use.items()]

        if not self._budgets(groups):
            return []
        return await self._thread.run(read)


def _collect_ended(db: Session, _flush_context, _instances) -> None:
    """Note each session this flush ends (kept until the transaction files it)."""
    for obj in list(db.new) + list(db.dirty):
        if (
            isinstance(obj, SessionRecord)
            and obj.status in _FINAL_VALUES
            and obj.scheduled_at is not None
        ):
            db.info.setdefault(_ENDED_KEY, {})[obj.id] = obj
