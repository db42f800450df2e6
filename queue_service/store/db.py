"""Database set-up: an engine for `db_url`, and the schema brought up to date by alembic.

The schema is only ever changed through migrations (as JupyterHub does), so an upgraded service
finds its old queue intact; db_upgrade.py takes a backup before and runs them in one transaction.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import sessionmaker

from fgpu_shared.sqlite_pragmas import set_sqlite_pragmas
from queue_service.store.db_upgrade import MIGRATIONS_DIR, BackupSettings, alembic_config, upgrade

__all__ = [
    "MIGRATIONS_DIR",
    "DbThread",
    "alembic_config",
    "make_engine",
    "open_database",
    "upgrade",
]


def make_engine(db_url: str) -> Engine:
    engine = create_engine(db_url, future=True)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", set_sqlite_pragmas)
    return engine


def open_database(
    db_url: str, backups: BackupSettings | None = None, log: logging.Logger | None = None
) -> sessionmaker:
    upgrade(db_url, backups, log=log)
    return sessionmaker(make_engine(db_url), expire_on_commit=False)


class DbThread:
    """A thread of its own for one part's DB work, off the event loop and apart from the queue's:
    a year of history or usage never holds up a grant, nor a grant them."""

    def __init__(self, name: str):
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name)

    async def run(self, work: Callable, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, work, *args)
