"""How the hub's and the queue service's databases use SQLite, where a site keeps SQLite.

- **Write-ahead logging** (`journal_mode=WAL`): the pages read while the scheduler writes.
- **A sync at each checkpoint, not at each commit** (`synchronous=NORMAL`): in WAL mode a commit
  then costs no fsync. Each process has one event loop, and a commit that waits for the disk holds
  it: with a class starting at once the hub spent a fifth of its time in SQLite's fsync, and every
  other request waited behind it. A killed process loses nothing committed (the log is in the
  kernel's hands); a machine that loses power may lose the last commits, never the file's
  integrity. A site that needs more keeps PostgreSQL (the how-to on databases).
- **A busy timeout**: a short lock held by another process (a backup, `fgpu-hub`) is waited for.
"""

from __future__ import annotations

import sqlite3

from sqlalchemy import event
from sqlalchemy.engine import Engine

PRAGMAS = ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=5000")


def set_sqlite_pragmas(connection, _record=None) -> None:
    """The pragmas on one new DB-API connection (a SQLAlchemy `connect` listener)."""
    cursor = connection.cursor()
    for pragma in PRAGMAS:
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


def _on_sqlite_connect(connection, record) -> None:
    if isinstance(connection, sqlite3.Connection):
        set_sqlite_pragmas(connection, record)


def on_every_sqlite_engine() -> None:
    """The pragmas on every SQLite connection this process opens, through engines it does not
    make itself (JupyterHub's own). Idempotent."""
    if not event.contains(Engine, "connect", _on_sqlite_connect):
        event.listen(Engine, "connect", _on_sqlite_connect)
