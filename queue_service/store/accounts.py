"""Which hub account a session or a usage day belongs to, where a name is used again.

A user deleted and created again under the same name is a new account. As its home volume and
private images are (fgpu_spawner/storage.py, images.py), its finished sessions, usage days and
budget use are told apart from an earlier account's by the account's creation time: `sessions`
and `usage_days` carry it as `account` (`account_key`, the same text as a home volume's
`fgpu.account` label). Rows written before that column have `account = ''` and belong to the
account of that name that was there when they were written: a session made at or after the
account's creation, a usage day on or after its creation day.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import and_, false, or_

from queue_service.store.models import SessionRecord, UsageDay

#: `account` of rows written before accounts were told apart.
UNKNOWN = ""
_KEY_FORMAT = "%Y%m%dT%H%M%S%fZ"


def account_key(created: datetime | str | None) -> str:
    """A hub account's creation time (the hub's user model's ISO text, or a datetime; naive is
    UTC) as the `account` column holds it; '' when unknown."""
    if not created:
        return UNKNOWN
    moment = datetime.fromisoformat(created) if isinstance(created, str) else created
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return moment.strftime(_KEY_FORMAT)


@dataclass(frozen=True)
class Account:
    """One hub account: its name and `account_key`; a key of '' stands for every account that
    has had the name (an admin asking about a name)."""

    name: str
    key: str = UNKNOWN

    @classmethod
    def of(cls, model: dict) -> Account:
        """The account a hub user model (`name`, `created`) describes."""
        return cls(model["name"], account_key(model.get("created")))

    @property
    def created(self) -> datetime | None:
        if not self.key:
            return None
        return datetime.strptime(self.key, _KEY_FORMAT).replace(tzinfo=UTC)


def sessions_of(account: Account):
    """The SQL condition for this account's session records."""
    by_name = SessionRecord.user == account.name
    if not account.key:
        return by_name
    before_accounts = and_(
        SessionRecord.account == UNKNOWN, SessionRecord.created >= account.created
    )
    return and_(by_name, or_(SessionRecord.account == account.key, before_accounts))


def usage_days_of(account: Account):
    """The SQL condition for this account's usage days."""
    by_name = UsageDay.user == account.name
    if not account.key:
        return by_name
    before_accounts = and_(UsageDay.account == UNKNOWN, UsageDay.day >= account.created.date())
    return and_(by_name, or_(UsageDay.account == account.key, before_accounts))


def any_of(accounts: Iterable[Account], table) -> object:
    """The SQL condition for the rows (`table`: SessionRecord or UsageDay) of any of `accounts`:
    the names asked about as a whole in one IN, each account of its own beside it (a group of
    hundreds stays one IN, not hundreds of ORs)."""
    accounts = set(accounts)
    whole_names = sorted(a.name for a in accounts if not a.key)
    of_one = sessions_of if table is SessionRecord else usage_days_of
    conditions = [of_one(a) for a in sorted(accounts, key=str) if a.key]
    if whole_names:
        conditions.append(table.user.in_(whole_names))
    return or_(false(), *conditions)
