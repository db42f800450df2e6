"""Storage folders and their shares as the service keeps them: `FolderStore`, over `folders` and
`folder_shares`.

A folder belongs to its owner's hub account (`account`, accounts.py): a user deleted and created
again under the same name is another account and neither owns the old folders nor holds their
shares. A share names one user account or one hub group and a permission, "ro" or "rw"; where
several apply to a person, the widest wins. Removed folders keep their row (with `deleted` and
the directory's trash name) until the grace period ends, so an admin can still say what was there.

Writes are serialized by one lock, so two requests cannot both take a name (the check and the
insert are one step); the handlers run them off the event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, delete, false, func, or_, select
from sqlalchemy.orm import sessionmaker

from queue_service.core.errors import Refusal
from queue_service.core.folder_names import is_automount
from queue_service.store.accounts import Account
from queue_service.store.models import (
    FolderRecord,
    FolderShare,
    SessionMount,
    StorageProject,
    as_utc,
    utcnow,
)

RANK = {None: 0, "ro": 1, "rw": 2}


@dataclass(frozen=True)
class Reader:
    """Who asks: an account, its hub groups, and whether the request holds admin powers."""

    account: Account
    groups: frozenset[str] = frozenset()
    admin: bool = False

    @classmethod
    def of(cls, person: dict) -> Reader:
        """From the hub's user model as `BaseHandler.person` gives it."""
        return cls(Account.of(person), frozenset(person.get("groups", ())), person["admin"])


class FolderStore:
    def __init__(self, db: sessionmaker):
        self.db = db
        self._writing = threading.Lock()
        self._projects: dict[Account, int] = {}

    # -- reads ------------------------------------------------------------------------------

    def visible(self, reader: Reader, everyone: bool = False) -> list[dict]:
        """The reader's own folders and those shared with them; with `everyone` (admins), all."""
        query = select(FolderRecord).where(FolderRecord.deleted.is_(None))
        if not everyone:  # only the reader's: a class's thousands of folders are not read
            query = query.where(
                or_(_owned_by(reader.account), FolderRecord.id.in_(_shared_with(reader)))
            )
        with self.db() as db:
            records = db.scalars(query.order_by(FolderRecord.owner, FolderRecord.name)).all()
            shares = _shares_by_folder(db, [r.id for r in records])
        return [_view(r, shares.get(r.id, []), reader) for r in records]

    def get(self, folder_id: str, reader: Reader) -> dict:
        """The folder, if the reader may see it; else 404 (never 403: that would say it exists)."""
        with self.db() as db:
            record = db.get(FolderRecord, folder_id)
            if record is None or record.deleted is not None:
                raise Refusal("No such folder.", "not_found")
            view = _view(record, _shares_by_folder(db, [folder_id]).get(folder_id, []), reader)
        if not view["permission"] and not reader.admin:
            raise Refusal("No such folder.", "not_found")
        return view

    def named(self, names: Iterable[str], reader: Reader) -> list[dict]:
        """The folders the reader may see, by id or name (own names first, then shared ones)."""
        return pick_named(self.visible(reader), names)

    def used_by(self, account: Account | None = None, owners=()) -> int:
        """Bytes the live folders hold, as last measured: one account's, or all of `owners`'
        (every account of those names: a group's members)."""
        query = select(func.coalesce(func.sum(FolderRecord.size_bytes), 0)).where(
            FolderRecord.deleted.is_(None)
        )
        if account is not None:
            query = query.where(_owned_by(account))
        else:
            query = query.where(FolderRecord.owner.in_(list(owners)))
        with self.db() as db:
            return int(db.scalar(query))

    def owner_account(self, folder_id: str) -> Account:
        with self.db() as db:
            record = db.get(FolderRecord, folder_id)
            return Account(record.owner, record.account)

    def account_of(self, folder_id: str) -> str:
        with self.db() as db:
            return db.get(FolderRecord, folder_id).account

    def project_of(self, account: Account) -> int:
        """The kernel project id of the account's folders (project_quotas.py), given at first.
        Kept in memory once read: an id never changes, and the quotas read it on every page."""
        known = self._projects.get(account)
        if known is not None:
            return known
        with self._writing, self.db.begin() as db:
            owned = and_(
                StorageProject.owner == account.name, StorageProject.account == account.key
            )
            project = db.scalars(select(StorageProject).where(owned)).first()
            if project is None:
                project = StorageProject(owner=account.name, account=account.key)
                db.add(project)
                db.flush()
            self._projects[account] = project.id
            return project.id

    def all_ids(self) -> list[str]:
        with self.db() as db:
            return list(db.scalars(select(FolderRecord.id).where(FolderRecord.deleted.is_(None))))

    def session_mounts(self, session_ids) -> dict[str, list[dict]]:
        """The folders each of these sessions mounts, as recorded at its spawn."""
        ids = list(session_ids)
        if not ids:
            return {}
        found: dict[str, list[dict]] = {}
        with self.db() as db:
            query = select(SessionMount).where(SessionMount.session_id.in_(ids))
            for row in db.scalars(query.order_by(SessionMount.path)):
                found.setdefault(row.session_id, []).append(
                    {
                        "id": row.folder_id,
                        "name": row.name,
                        "owner": row.owner,
                        "path": row.path,
                        "read_only": row.read_only,
                        "note": row.note or None,
                    }
                )
        return found

    def record_session_mounts(self, session_id: str, mounts: list[dict]) -> None:
        """What a session mounts (its spawn asking again replaces it)."""
        with self._writing, self.db.begin() as db:
            db.execute(delete(SessionMount).where(SessionMount.session_id == session_id))
            for mount in mounts:
                db.add(
                    SessionMount(
                        session_id=session_id,
                        path=mount["path"],
                        folder_id=mount["id"],
                        name=mount["name"],
                        owner=mount["owner"],
                        read_only=mount["read_only"],
                        note=mount.get("note") or "",
                    )
                )

    # -- writes -----------------------------------------------------------------------------

    def create(self, account: Account, name: str, folder_id: str) -> dict:
        with self._writing, self.db.begin() as db:
            self._refuse_taken(db, account, name)
            record = FolderRecord(id=folder_id, name=name, owner=account.name, account=account.key)
            record.modified = utcnow()
            db.add(record)
            db.flush()
            return _view(record, [], Reader(account))

    def rename(self, folder_id: str, name: str, reader: Reader) -> dict:
        with self._writing, self.db.begin() as db:
            record = self._changeable(db, folder_id, reader)
            if record.name != name:
                self._refuse_taken(db, Account(record.owner, record.account), name)
                record.name = name
            return _view(record, _shares_by_folder(db, [folder_id]).get(folder_id, []), reader)

    def remove(self, folder_id: str, reader: Reader, trash_name: str) -> dict:
        """Mark it removed, its shares ended; its directory is kept as `trash_name`."""
        with self._writing, self.db.begin() as db:
            record = self._changeable(db, folder_id, reader)
            record.deleted, record.trash_name = utcnow(), trash_name
            db.execute(delete(FolderShare).where(FolderShare.folder_id == folder_id))
            return _view(record, [], reader)

    def share(
        self, folder_id: str, reader: Reader, target: dict, permission: str
    ) -> tuple[dict, bool]:
        """Share with `target` ({"user", "account"} or {"group"}); sharing again with the same
        target changes its permission. The share, and whether it is new."""
        with self._writing, self.db.begin() as db:
            record = self._changeable(db, folder_id, reader)
            if target.get("user") == record.owner and target.get("account") == record.account:
                raise Refusal("The owner has the folder already; share it with others.", "invalid")
            existing = db.scalars(
                select(FolderShare).where(FolderShare.folder_id == folder_id, _same(target))
            ).first()
            share = existing or FolderShare(folder_id=folder_id, **target)
            share.permission = permission
            db.add(share)
            db.flush()
            return _share_view(share), existing is None

    def unshare(self, folder_id: str, share_id: int, reader: Reader) -> None:
        """End a share: the owner (or an admin) ends any; whoever it names may leave it."""
        with self._writing, self.db.begin() as db:
            share = db.get(FolderShare, share_id)
            if share is None or share.folder_id != folder_id:
                raise Refusal("No such share of this folder.", "not_found")
            record = db.get(FolderRecord, folder_id)
            names_reader = share.user == reader.account.name and share.account == reader.account.key
            if not (names_reader or _owns(record, reader) or reader.admin):
                self._changeable(db, folder_id, reader)  # 404 or 403, as for any change
            db.delete(share)

    def give(self, folder_id: str, account: Account) -> dict:
        """Hand a folder to another account (admins); a share the new owner held ends. An
        automount folder (`.ipython`) arrives without its leading dots (`ipython`): what runs
        at the start of every session of the new owner is only what they made or renamed so
        themselves."""
        with self._writing, self.db.begin() as db:
            record = db.get(FolderRecord, folder_id)
            if record is None or record.deleted is not None:
                raise Refusal("No such folder.", "not_found")
            name = record.name.lstrip(".") if is_automount(record.name) else record.name
            self._refuse_taken(db, account, name)
            record.owner, record.account, record.name = account.name, account.key, name
            db.execute(
                delete(FolderShare).where(
                    FolderShare.folder_id == folder_id,
                    FolderShare.user == account.name,
                    FolderShare.account == account.key,
                )
            )
            reader = Reader(account)
            return _view(record, _shares_by_folder(db, [folder_id]).get(folder_id, []), reader)

    def record_measure(self, folder_id: str, size: int, files: int, modified: datetime) -> None:
        with self._writing, self.db.begin() as db:
            record = db.get(FolderRecord, folder_id)
            if record is not None:
                record.size_bytes, record.files, record.modified = size, files, modified

    def end_shares_of(self, account: Account) -> int:
        """A deleted account's shares end with it; how many ended."""
        with self._writing, self.db.begin() as db:
            result = db.execute(
                delete(FolderShare).where(
                    FolderShare.user == account.name, FolderShare.account == account.key
                )
            )
            return result.rowcount

    def _changeable(self, db, folder_id: str, reader: Reader) -> FolderRecord:
        """The folder, if the reader owns it or is an admin: 404 when they cannot see it, 403
        when they see it through a share."""
        record = db.get(FolderRecord, folder_id)
        if record is None or record.deleted is not None:
            raise Refusal("No such folder.", "not_found")
        if _owns(record, reader) or reader.admin:
            return record
        shares = _shares_by_folder(db, [folder_id]).get(folder_id, [])
        if _permission(record, shares, reader):
            raise Refusal("Only the folder's owner changes, shares or deletes it.", "forbidden")
        raise Refusal("No such folder.", "not_found")

    def _refuse_taken(self, db, account: Account, name: str) -> None:
        taken = db.scalars(
            select(FolderRecord.id).where(
                FolderRecord.owner == account.name,
                FolderRecord.account == account.key,
                FolderRecord.name == name,
                FolderRecord.deleted.is_(None),
            )
        ).first()
        if taken:
            raise Refusal(f"{account.name} has a folder named {name!r} already.", "conflict")


def _same(target: dict):
    if target.get("group") is not None:
        return FolderShare.group == target["group"]
    return and_(FolderShare.user == target["user"], FolderShare.account == target["account"])


def pick_named(visible: list[dict], names: Iterable[str]) -> list[dict]:
    """Among `visible` folders, each named by id or name (own names first, then shared ones)."""
    found = []
    for key in names:
        match = [f for f in visible if f["id"] == key] or sorted(
            (f for f in visible if f["name"] == key), key=lambda f: not f["own"]
        )
        if not match:
            raise Refusal(f"No folder {key!r} of yours or shared with you.", "not_found")
        found.append(match[0])
    return found


def _owned_by(account: Account):
    return and_(FolderRecord.owner == account.name, FolderRecord.account == account.key)


def _shared_with(reader: Reader):
    """The ids of the folders shared with the reader's account or one of their groups."""
    to_user = and_(
        FolderShare.user == reader.account.name, FolderShare.account == reader.account.key
    )
    to_groups = FolderShare.group.in_(list(reader.groups)) if reader.groups else false()
    return select(FolderShare.folder_id).where(or_(to_user, to_groups))


def _shares_by_folder(db, folder_ids: list[str]) -> dict[str, list[FolderShare]]:
    if not folder_ids:
        return {}
    shares: dict[str, list[FolderShare]] = {}
    query = select(FolderShare).where(FolderShare.folder_id.in_(folder_ids))
    for share in db.scalars(query.order_by(FolderShare.id)):
        shares.setdefault(share.folder_id, []).append(share)
    return shares


def _owns(record: FolderRecord, reader: Reader) -> bool:
    return record.owner == reader.account.name and record.account == reader.account.key


def _permission(record: FolderRecord, shares: list[FolderShare], reader: Reader) -> str | None:
    """What the reader may do in the folder by ownership or share: "rw", "ro" or None."""
    if _owns(record, reader):
        return "rw"
    best = None
    for share in shares:
        by_user = share.user == reader.account.name and share.account == reader.account.key
        if (by_user or share.group in reader.groups) and RANK[share.permission] > RANK[best]:
            best = share.permission
    return best


def _share_view(share: FolderShare) -> dict:
    return {
        "id": share.id,
        "user": share.user,
        "group": share.group,
        "permission": share.permission,
        "created": _iso(share.created),
    }


def _view(record: FolderRecord, shares: list[FolderShare], reader: Reader) -> dict:
    own = _owns(record, reader)
    permission = _permission(record, shares, reader)
    writers = [s.user or f"group {s.group}" for s in shares if s.permission == "rw"]
    return {
        "id": record.id,
        "name": record.name,
        "owner": record.owner,
        "own": own,
        # Mounted at ~/NAME in the reader's sessions without asking: their own dot-named folders
        # alone. Someone else's `.cache` shared with them is an ordinary shared folder, chosen
        # at launch and mounted at ~/folders/.cache, never over their own.
        "automount": own and is_automount(record.name),
        "permission": permission,
        # Who may write: the owner and the read-write shares (what a reader of a rw share sees).
        "writers": [record.owner, *writers],
        # The list of shares is the owner's (and admins') to see.
        "shares": [_share_view(s) for s in shares] if own or reader.admin else None,
        "size_bytes": record.size_bytes,
        "files": record.files,
        "modified": _iso(record.modified),
        "created": _iso(record.created),
    }


def _iso(moment: datetime | None) -> str | None:
    return as_utc(moment).isoformat() if moment else None
