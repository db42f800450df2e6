"""accounts.py against real databases (SQLite and PostgreSQL): rows of one account, those from
before accounts were told apart given to the account that had the name when they were written."""

from __future__ import annotations

from datetime import UTC, date, datetime

from sqlalchemy import select

from queue_service.store.accounts import Account, account_key, any_of, sessions_of, usage_days_of
from queue_service.store.db import open_database
from queue_service.store.models import SessionRecord, UsageDay

OLD = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
NEW = datetime(2026, 11, 24, 15, 30, 0, 250000, tzinfo=UTC)


def test_an_account_key_is_the_creation_time_as_the_home_volumes_label_writes_it():
    assert account_key("2026-11-24T15:30:00.250000Z") == "20261124T153000250000Z"
    assert account_key(NEW.replace(tzinfo=None)) == "20261124T153000250000Z"
    assert account_key(None) == "" and Account("ann").created is None
    assert Account.of({"name": "ann", "created": NEW.isoformat()}).created == NEW


def session(seq: int, account: str, created: datetime) -> SessionRecord:
    return SessionRecord(
        id=f"s{seq}", seq=seq, user="ann", account=account, status="TERMINATED",
        image="python-3.11", cpu=1.0, mem=1, created=created,
    )  # fmt: skip


def test_each_account_has_its_own_rows_and_older_rows_go_by_when_they_were_written(db_url):
    db = open_database(db_url)
    old, new = account_key(OLD), account_key(NEW)
    with db.begin() as s:
        s.add_all([session(1, "", OLD), session(2, old, OLD), session(3, new, NEW)])
        s.add(session(4, "", NEW))  # written before the column, after the new account was made
        for day, account in ((date(2026, 11, 21), ""), (date(2026, 11, 25), ""), (NEW, new)):
            day = day.date() if isinstance(day, datetime) else day
            s.add(UsageDay(day=day, user="ann", account=account, resource_group="g",
                           cpu_hours=1, mem_gib_hours=1, fgpu_hours=1))  # fmt: skip
    with db() as s:

        def ids(account: Account) -> list[str]:
            return sorted(s.scalars(select(SessionRecord.id).where(sessions_of(account))))

        def days(account: Account) -> list[date]:
            return sorted(s.scalars(select(UsageDay.day).where(usage_days_of(account))))

        assert ids(Account("ann", new)) == ["s3", "s4"]
        assert ids(Account("ann", old)) == ["s1", "s2", "s4"]
        assert ids(Account("ann")) == ["s1", "s2", "s3", "s4"]  # an admin asking by name
        assert ids(Account("bob", new)) == []
        assert days(Account("ann", new)) == [date(2026, 11, 24), date(2026, 11, 25)]
        s.add(session(5, "", OLD))
        s.get(SessionRecord, "s5").user = "bob"
        s.flush()
        # A budget's group: the asking account, and the other members by name.
        group = any_of([Account("ann", new), Account("bob")], SessionRecord)
        assert sorted(s.scalars(select(SessionRecord.id).where(group))) == ["s3", "s4", "s5"]
        assert sorted(s.scalars(select(SessionRecord.id).where(any_of([], SessionRecord)))) == []
    db.kw["bind"].dispose()
