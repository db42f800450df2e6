"""The tests' own PostgreSQL databases: made for one test or hub, and dropped after."""

from __future__ import annotations

import time

from psycopg.errors import InsufficientPrivilege
from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError

#: How long a drop waits for a backend it may not end (below) to leave.
DROP_WAIT_SECONDS = 30.0


def drop_database(admin, name: str) -> None:
    """Drop database `name`, ending the connections a test left open. A backend the test's role
    may not end (an autovacuum worker, the server's own, on a database just migrated) makes the
    drop fail: it leaves within moments, and the drop is tried again."""
    deadline = time.monotonic() + DROP_WAIT_SECONDS
    while True:
        try:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            return
        except ProgrammingError as e:
            if not isinstance(e.orig, InsufficientPrivilege) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
