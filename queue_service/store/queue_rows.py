"""The queue's SQL: the rows a pass reads and what a DB session holds for it (queue_pass.py).

- `pending_query`, `allocated_query`: the active records, waiting ones in request order;
- `load_active`: read every active record into a session;
- `attach`: a session's own copy of a record the queue published, to change, or `StaleRecord`
  when the DB holds it otherwise (changed outside the service);
- `record_row`, `normal_row`: every column of a record, and of a row read by a query, as plain
  tuples that compare equal when the two hold the same;
- `watch_flushes`: makes a sessionmaker's sessions hold every record they load or flush until
  their transaction ends, so that a pass finds each one it changed; `flushed_and_deleted` reads
  what they flushed.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import event, select
from sqlalchemy.orm import sessionmaker

from queue_service.core.status import ALLOCATED, Status
from queue_service.store.models import SessionRecord, as_utc

_COLUMNS = tuple(column.key for column in SessionRecord.__table__.columns)
_FLUSHED, _DELETED, _LOADED = "fgpu_flushed", "fgpu_deleted", "fgpu_loaded"
_WATCHED = "_fgpu_watched"


class StaleRecord(Exception):
    """The DB holds a record otherwise than this process published it (changed outside)."""


def pending_query():
    return (
        select(SessionRecord)
        .where(SessionRecord.status == Status.PENDING)
        .order_by(SessionRecord.seq)
    )


def allocated_query():
    return select(SessionRecord).where(SessionRecord.status.in_([s.value for s in ALLOCATED]))


def record_row(record: SessionRecord) -> tuple:
    """Every column, in the table's order (times as UTC: SQLite reads them back naive)."""
    return normal_row(getattr(record, column) for column in _COLUMNS)


def normal_row(values) -> tuple:
    return tuple(as_utc(v) if isinstance(v, datetime) else v for v in values)


def attach(db, record: SessionRecord) -> SessionRecord:
    """The session's own copy of a published record, to change; StaleRecord if the DB's differs."""
    attached = db.get(SessionRecord, record.id)
    if attached is record:
        return record
    if attached is None or record_row(attached) != record_row(record):
        raise StaleRecord(record.id)
    return attached


def load_active(db) -> None:
    """Read every active record into the session, held there until the transaction ends
    (`_hold_loaded`)."""
    db.scalars(allocated_query()).all()
    db.scalars(pending_query()).all()


def _keep_flushed(session, _context) -> None:
    """Hold every record a flush writes until the transaction ends: the session keeps a record
    it no longer sees as changed only weakly, and the pass must find each one it changed."""
    flushed = session.info.setdefault(_FLUSHED, {})
    for record in (*session.new, *session.dirty):
        if isinstance(record, SessionRecord):
            flushed[record.id] = record
    deleted = session.info.setdefault(_DELETED, set())
    deleted.update(r.id for r in session.deleted if isinstance(r, SessionRecord))


def _hold_loaded(session, record) -> None:
    """Hold every record the session loads until the transaction ends: which unchanged records a
    pass finds in the session must not depend on when the garbage collector runs."""
    if isinstance(record, SessionRecord):
        session.info.setdefault(_LOADED, []).append(record)


def _forget_flushed(session, *_args) -> None:
    for key in (_FLUSHED, _DELETED, _LOADED):
        session.info.pop(key, None)


def flushed_and_deleted(db) -> tuple[dict, set]:
    return db.info.get(_FLUSHED, {}), db.info.get(_DELETED, set())


def watch_flushes(sessions: sessionmaker) -> None:
    """Make the sessions of `sessions` hold what they load and flush (`_hold_loaded`,
    `_keep_flushed`) until they end."""
    # A mark on the sessionmaker itself, not `event.contains`: SQLAlchemy keys its registry by
    # `id(target)`, and a dead sessionmaker's entry outlives it until a garbage collection, so a
    # new one at its address would look registered and get no listeners.
    if getattr(sessions, _WATCHED, False):
        return
    setattr(sessions, _WATCHED, True)
    event.listen(sessions, "after_flush", _keep_flushed)
    event.listen(sessions, "loaded_as_persistent", _hold_loaded)
    event.listen(sessions, "after_commit", _forget_flushed)
    event.listen(sessions, "after_rollback", _forget_flushed)
