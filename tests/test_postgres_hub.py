"""PostgreSQL in production (jupyterhub_config.py, state_dir.py, db_upgrade.py): one real hub with
the hub DB and the queue DB on the test PostgreSQL server, both found at an older release's schema
with its rows, upgraded at start after a pg_dump of each, then used by a login and a session."""

from __future__ import annotations

import contextlib
import secrets
import subprocess
from pathlib import Path

import pytest
from alembic import command
from jupyterhub import dbutil, orm
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from queue_service.store.db_upgrade import alembic_config

from .databases import drop_database
from .harness import VENV_BIN, QueueUser, logged_in, running_hub, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.hub]
SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "512M"}
#: JupyterHub 5's schema, one revision before JupyterHub 6's (f460b0348206).
HUB_REVISION_BEFORE = "ff1860e38070"
QUEUE_REVISION_BEFORE = "0006"


@pytest.fixture
def databases(postgres_admin):
    """Two fresh databases, as libpq-style postgresql:// URLs (a site's usual spelling), dropped
    after the test."""
    names = [f"fgpu_t_{what}_{secrets.token_hex(4)}" for what in ("hub", "queue")]
    with postgres_admin.connect() as connection:
        for name in names:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    urls = [
        postgres_admin.url.set(drivername="postgresql", database=name).render_as_string(
            hide_password=False
        )
        for name in names
    ]
    try:
        yield urls
    finally:
        for name in names:
            drop_database(postgres_admin, name)


def with_psycopg(url: str) -> str:
    return make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def old_hub_db(url: str) -> None:
    """The hub DB as JupyterHub 5 left it, with a user in it."""
    db = orm.new_session_factory(url)()
    db.add(orm.User(name="old-student"))
    db.commit()
    db.get_bind().dispose()
    db.close()
    with dbutil._temp_alembic_ini(url) as ini:
        subprocess.run(
            [str(VENV_BIN / "alembic"), "-c", ini, "downgrade", HUB_REVISION_BEFORE],
            check=True,
            capture_output=True,
        )


def old_queue_db(url: str) -> None:
    """The queue DB as the release at 0006 left it, with a finished session and its usage."""
    command.upgrade(alembic_config(url), QUEUE_REVISION_BEFORE)
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(
            text(
                'INSERT INTO sessions (id, seq, "user", server_name, status, image, cpu, mem,'
                " fgpu, reason, skips, created, started, ended, end_reason) VALUES ('old1', 1,"
                " 'old-student', '', 'TERMINATED', 'python-3.11', 1, 1073741824, 0, '', 0,"
                " '2026-11-01 09:00+00', '2026-11-01 09:00+00', '2026-11-01 10:00+00', 'user')"
            )
        )
    engine.dispose()


def rows(url: str, query: str) -> list[tuple]:
    engine = create_engine(url)
    with engine.connect() as connection:
        found = [tuple(row) for row in connection.execute(text(query))]
    engine.dispose()
    return found


def command_lines(parent: int) -> list[str]:
    """The command lines of `parent`'s children, as `ps` shows them to anyone."""
    lines = []
    for pid in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # ended meanwhile
            lines.append(Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " "))
    return lines


def test_a_hub_on_postgresql_upgrades_both_databases_after_a_dump_and_keeps_its_rows_there(
    databases, tmp_path, docker_engine, username
):
    hub_url, queue_url = databases
    old_hub_db(with_psycopg(hub_url))
    old_queue_db(with_psycopg(queue_url))
    hub_db, queue_db = (make_url(url).database for url in databases)
    env = {"FGPU_HUB_DB_URL": hub_url, "FGPU_QUEUE_DB_URL": queue_url}

    with running_hub(tmp_path / "hub", env=env) as hub:
        logged_in(hub, username)
        student = QueueUser(hub, username)
        response = hub.start_server(username, SESSION)
        assert response.status_code in (201, 202), response.text
        hub.wait_ready(username)
        # No password (and no database URL) on any of the hub's children's command lines.
        assert not [line for line in command_lines(hub.process.pid) if "postgresql" in line]
        hub.stop_server(username)
        student.wait_for(lambda sessions: not sessions)
        ended = wait_until(
            lambda: rows(
                with_psycopg(queue_url),
                f"SELECT status, end_reason FROM sessions WHERE \"user\" = '{username}'",
            ),
            30,
            "the session's record in the queue DB",
        )
        log = hub.log_text()

    # Both databases were upgraded at start, each after a dump of its own in the state directory.
    state = tmp_path / "hub"
    (hub_dump,) = state.glob(f"{hub_db}.before-{HUB_REVISION_BEFORE}-to-*.dump")
    (queue_dump,) = state.glob(f"{queue_db}.before-{QUEUE_REVISION_BEFORE}-to-*.dump")
    assert hub_dump.stat().st_size > 0 and queue_dump.stat().st_size > 0
    assert f"from schema revision {QUEUE_REVISION_BEFORE} to" in log and str(queue_dump) in log
    assert "fgpu:fgpu@" not in log  # the password is never logged
    # The old rows are there, and the new ones are in PostgreSQL, none in a SQLite file.
    hub_users = {name for (name,) in rows(with_psycopg(hub_url), "SELECT name FROM users")}
    assert {"old-student", username} <= hub_users
    old = rows(with_psycopg(queue_url), "SELECT id, end_reason FROM sessions WHERE id = 'old1'")
    assert old == [("old1", "user")]
    assert ended == [("TERMINATED", "user")]
    assert not list(state.glob("*.sqlite"))
