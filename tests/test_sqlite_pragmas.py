"""fgpu_shared/sqlite_pragmas.py: both databases, on SQLite, log ahead and commit without an fsync;
a PostgreSQL connection is left as it is."""

from __future__ import annotations

import contextlib
import sqlite3

from sqlalchemy import create_engine, text

from fgpu_shared.sqlite_pragmas import on_every_sqlite_engine
from queue_service.store.db import make_engine

NORMAL = 1  # PRAGMA synchronous's answer for NORMAL (FULL is 2)


def pragmas(engine) -> tuple[str, int]:
    with engine.connect() as connection:
        mode = connection.execute(text("PRAGMA journal_mode")).scalar()
        synchronous = connection.execute(text("PRAGMA synchronous")).scalar()
    return mode, synchronous


def test_the_queue_services_engine_logs_ahead_and_syncs_at_checkpoints(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'queue.sqlite'}")
    assert pragmas(engine) == ("wal", NORMAL)


def test_an_engine_made_elsewhere_gets_them_and_postgresql_is_untouched(db_url):
    on_every_sqlite_engine()
    on_every_sqlite_engine()  # twice: one listener
    engine = create_engine(db_url)
    if engine.dialect.name == "sqlite":
        assert pragmas(engine) == ("wal", NORMAL)
    else:
        with engine.connect() as connection:
            assert connection.execute(text("SHOW synchronous_commit")).scalar() == "on"
    engine.dispose()


def test_the_hubs_own_database_is_in_wal_mode(hub):
    """The shipped config sets it on JupyterHub's engine: the mode stays in the file."""
    path = hub.workdir / "jupyterhub.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
