"""Schema upgrades (queue_service/store/db_upgrade.py): from an older release's schema with its rows, a
backup first, and a failed migration that leaves the database exactly as it was; on SQLite and on
a real PostgreSQL server."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from queue_service.store.db import make_engine
from queue_service.store.db_upgrade import (
    MIGRATIONS_DIR,
    BackupSettings,
    UpgradeRefused,
    alembic_config,
    backup_before_hub_upgrade,
    backup_name,
    libpq_dsn,
    pg_dump_command,
    take_backup,
    upgrade,
)
from queue_service.store.models import ImageRecord, SessionRecord, UsageDay

from .databases import drop_database

HEAD = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()

T0 = "2026-11-20 09:00:00+00:00"
T1 = "2026-11-20 10:00:00+00:00"
T2 = "2026-11-20 11:30:00+00:00"

#: Sessions as a release at 0004 left them: (id, status, reason, node, started, ended), and the
#: end reason 0005 codes for each.
SESSIONS_0004 = [
    ("pending", "PENDING", "", None, None, None),
    ("running", "RUNNING", "", "node-1", T1, None),
    ("by-user", "TERMINATED", "", "node-1", T1, T2),
    ("superseded", "TERMINATED", "superseded by a new start of the same server", "node-1", T1, T2),
    ("hub-stopped", "TERMINATED", "the hub had stopped its server", "node-1", T1, T2),
    ("lost", "TERMINATED", "the container stopped", "node-2", T1, T2),
    ("cancelled", "CANCELLED", "", None, None, T1),
    ("timed-out", "PENDING_TIMEOUT", "waited over 3600 s", None, None, T2),
    ("error", "ERROR", "no container started within 180 s", "node-1", None, T1),
]
END_REASONS_0005 = {
    "pending": None,
    "running": None,
    "by-user": "user",
    "superseded": "superseded",
    "hub-stopped": "hub_stopped",
    "lost": "lost",
    "cancelled": "cancelled",
    "timed-out": "pending_timeout",
    "error": "error",
}
IMAGES = [
    # (name, image, owner, owner_created, source, hidden, gpu)
    ("python-3.11", "fgpu/jupyter-base:py3.11", None, None, "catalog", False, False),
    ("ann-work", "fgpu-private/ann-work:1", "ann", T0, "commit", True, True),
]


def plant_0004(connection) -> None:
    for seq, (key, status, reason, node, started, ended) in enumerate(SESSIONS_0004, 1):
        connection.execute(
            text(
                'INSERT INTO sessions (id, seq, "user", server_name, status, image, cpu, mem, fgpu,'
                " resource_group, node, grant_json, reason, skips, created, scheduled_at, started,"
                " ended) VALUES (:id, :seq, :user, :server, :status, 'python-3.11', 0.5,"
                " 536870912, 0.5, 'default', :node, :grant, :reason, :seq, :created, :created,"
                " :started, :ended)"
            ),
            {
                "id": key,
                "seq": seq,
                "user": "ann" if seq % 2 else "bob",
                "server": f"s{seq}",
                "status": status,
                "node": node,
                "grant": json.dumps({"node": node, "gpus": [0]}) if node else None,
                "reason": reason,
                "created": T0,
                "started": started,
                "ended": ended,
            },
        )
    for name, image, owner, owner_created, source, hidden, gpu in IMAGES:
        connection.execute(
            text(
                "INSERT INTO images (name, display_name, image, framework, version, description,"
                " resources_json, gpu, groups_json, hidden, owner, owner_created, source,"
                " check_ok, check_message, checked_at, created, updated) VALUES (:name, :name,"
                " :image, 'python', '3.11', 'an image', '{\"cpu\": 1}', :gpu, '[]', :hidden,"
                " :owner, :owner_created, :source, true, 'ok', :t, :t, :t)"
            ),
            {
                "name": name,
                "image": image,
                "owner": owner,
                "owner_created": owner_created,
                "source": source,
                "hidden": hidden,
                "gpu": gpu,
                "t": T0,
            },
        )
    connection.execute(
        text("INSERT INTO image_seeds (name, entry_json) VALUES ('python-3.11', '{}')")
    )


def plant_0006(connection) -> None:
    """A 0006 release's rows: ended sessions with the codes it wrote, and their usage filed."""
    plant_0004(connection)
    for key, code in END_REASONS_0005.items():
        connection.execute(
            text("UPDATE sessions SET end_reason = :code WHERE id = :id"), {"code": code, "id": key}
        )
    connection.execute(
        text(
            'INSERT INTO usage_days (day, "user", resource_group, cpu_hours, mem_gib_hours,'
            " fgpu_hours) VALUES ('2026-11-20', 'bob', 'default', 0.75, 0.75, 0.75),"
            " ('2026-11-19', 'ann', 'default', 2, 4, 1)"
        )
    )
    connection.execute(text("INSERT INTO usage_recorded (session_id) VALUES ('by-user')"))


PLANTS = {"0004": plant_0004, "0006": plant_0006}


def database_at(db_url: str, revision: str) -> None:
    """A database as the release at `revision` left it, with its rows (written through the
    service's engine: a SQLite file is in WAL mode)."""
    command.upgrade(alembic_config(db_url), revision)
    engine = make_engine(db_url)
    with engine.begin() as connection:
        PLANTS[revision](connection)
    engine.dispose()


def snapshot(db_url: str) -> dict:
    """Everything a migration could change: tables, columns, indexes, revision and rows."""
    engine = create_engine(db_url)
    found = {}
    with engine.connect() as connection:
        schema = inspect(connection)
        for table in sorted(schema.get_table_names()):
            columns = [
                (c["name"], str(c["type"]), c["nullable"]) for c in schema.get_columns(table)
            ]
            indexes = sorted(index["name"] for index in schema.get_indexes(table))
            rows = sorted(map(tuple, connection.execute(text(f'SELECT * FROM "{table}"')).all()))
            found[table] = (columns, indexes, rows)
    engine.dispose()
    return found


def rows_of(db_url: str, table: str) -> list[dict]:
    engine = create_engine(db_url)
    with engine.connect() as connection:
        rows = [dict(row._mapping) for row in connection.execute(text(f'SELECT * FROM "{table}"'))]
    engine.dispose()
    return rows


@contextmanager
def restored(backup: Path, db_url: str, request):
    """The database a backup holds: the SQLite file itself, or the dump restored with pg_restore
    into a database of its own (dropped afterwards)."""
    if make_url(db_url).get_backend_name() == "sqlite":
        yield f"sqlite:///{backup}"
        return
    admin = request.getfixturevalue("postgres_admin")
    url = make_url(db_url).set(database=f"{make_url(db_url).database}_restored")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{url.database}"'))
    try:
        subprocess.run(
            ["pg_restore", "--no-owner", f"--dbname={libpq_dsn(url)}", str(backup)],
            env={**os.environ, "PGPASSWORD": str(url.password)},
            check=True,
        )
        yield url.render_as_string(hide_password=False)
    finally:
        drop_database(admin, url.database)


def backup_settings(db_url: str, tmp_path: Path) -> BackupSettings:
    """SQLite: the default, beside the file. PostgreSQL: a folder of the test's own (the default
    is the current directory, the hub's state directory)."""
    if make_url(db_url).get_backend_name() == "sqlite":
        return BackupSettings()
    return BackupSettings(folder=tmp_path / "dumps")


def backups_in(db_url: str, tmp_path: Path) -> list[Path]:
    folder = backup_settings(db_url, tmp_path).folder or tmp_path
    return sorted(folder.glob("*.before-*")) if folder.exists() else []


@pytest.mark.parametrize("revision", ["0004", "0006"])
def test_an_upgrade_from_an_older_release_keeps_every_row(db_url, revision, tmp_path, request):
    database_at(db_url, revision)
    before = snapshot(db_url)

    backup = upgrade(db_url, backup_settings(db_url, tmp_path))

    after = snapshot(db_url)
    # Every table of the old release keeps its rows, column for column.
    for table, (columns, _, rows) in before.items():
        if table == "alembic_version":
            continue
        names = [name for name, _, _ in columns]
        kept = sorted(tuple(row[name] for name in names) for row in rows_of(db_url, table))
        assert kept == rows, table
    assert after["alembic_version"][2] == [(HEAD,)]
    assert "utilization_samples" in after
    engine = create_engine(db_url)
    with Session(engine) as db:
        # Read back through today's models, as the service reads them.
        records = {r.id: r for r in db.scalars(select(SessionRecord))}
        images = {i.name: i for i in db.scalars(select(ImageRecord))}
        usage = db.scalars(select(UsageDay)).all()
    engine.dispose()
    assert {key: r.end_reason for key, r in records.items()} == END_REASONS_0005
    assert all(r.server_removed is None for r in records.values())
    # Every record from before batch jobs (0011) is an interactive session.
    assert all(
        (r.job_json, r.exit_code, r.log_tail) == (None, None, None) for r in records.values()
    )
    ended = records["lost"].ended
    assert (ended if ended.tzinfo else ended.replace(tzinfo=UTC)) == datetime(
        2026, 11, 20, 11, 30, tzinfo=UTC
    )
    assert images["ann-work"].owner == "ann" and images["ann-work"].hidden
    assert len(usage) == (2 if revision == "0006" else 0)
    # Rows from before accounts were told apart are kept as the name's (queue_service/store/accounts.py).
    assert {r.account for r in records.values()} == {""}
    assert {(u.user, u.account, u.fgpu_hours) for u in usage} == (
        {("bob", "", 0.75), ("ann", "", 1)} if revision == "0006" else set()
    )

    # The backup was taken before, and is the old database, revision and rows.
    assert backups_in(db_url, tmp_path) == [backup]
    assert re.fullmatch(
        rf".+\.before-{revision}-to-{HEAD}-\d{{8}}T\d{{6}}Z\.(sqlite|dump)", backup.name
    )
    assert oct(backup.stat().st_mode & 0o777) == "0o600"
    with restored(backup, db_url, request) as old:
        assert snapshot(old) == before


def failing_migrations(tmp_path: Path) -> Path:
    """The shipped migrations plus one that fails for real, after changing the schema and rows."""
    location = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, location, ignore=shutil.ignore_patterns("__pycache__"))
    (location / "versions" / "0099_fails.py").write_text(
        f'''"""A revision that fails half-way."""
import sqlalchemy as sa
from alembic import op

revision = "0099"
down_revision = "{HEAD}"
branch_labels = None
depends_on = None


def upgrade():
    op.create_table("leftover", sa.Column("id", sa.Integer, primary_key=True))
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("leftover", sa.Integer, nullable=True))
    op.execute("UPDATE sessions SET reason = 'overwritten'")
    op.execute("DELETE FROM images")
    raise RuntimeError("this revision fails on purpose")


def downgrade():
    pass
'''
    )
    return location


def test_a_failed_migration_leaves_the_database_as_it_was(db_url, tmp_path):
    database_at(db_url, "0004")
    before = snapshot(db_url)

    with pytest.raises(UpgradeRefused) as refused:
        upgrade(
            db_url,
            backup_settings(db_url, tmp_path),
            script_location=failing_migrations(tmp_path),
        )

    # Revisions 0005 to HEAD ran first, in the same transaction: all of it is rolled back.
    assert snapshot(db_url) == before
    (backup,) = backups_in(db_url, tmp_path)
    message = str(refused.value)
    assert "from revision 0004 to 0099 failed and was rolled back" in message
    assert str(backup) in message and "this revision fails on purpose" in message


def test_a_database_of_a_newer_release_is_refused_and_left_alone(db_url, tmp_path):
    upgrade(db_url)
    engine = create_engine(db_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '0999'"))
    engine.dispose()
    before = snapshot(db_url)

    with pytest.raises(UpgradeRefused, match=r"revision 0999, which this fGPU hub does not know"):
        upgrade(db_url, backup_settings(db_url, tmp_path))

    assert snapshot(db_url) == before
    assert backups_in(db_url, tmp_path) == []


def test_an_empty_database_is_created_without_a_backup(db_url, tmp_path):
    assert upgrade(db_url, backup_settings(db_url, tmp_path)) is None
    assert snapshot(db_url)["alembic_version"][2] == [(HEAD,)]
    assert backups_in(db_url, tmp_path) == []
    assert upgrade(db_url, backup_settings(db_url, tmp_path)) is None  # at head: nothing to do


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_without_pg_dump_postgresql_is_not_upgraded_unless_allowed(db_url, tmp_path, monkeypatch):
    database_at(db_url, "0004")
    before = snapshot(db_url)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    settings = BackupSettings(folder=tmp_path / "dumps")

    with pytest.raises(UpgradeRefused) as refused:
        upgrade(db_url, settings)

    message = str(refused.value)
    assert "from schema revision 0004 to" in message and "pg_dump is not installed" in message
    assert "QueueService.upgrade_without_backup" in message
    assert "fgpu:fgpu@" not in message  # the password is not in the message
    assert snapshot(db_url) == before
    assert not (tmp_path / "dumps").exists() or not any((tmp_path / "dumps").iterdir())

    allowed = BackupSettings(folder=tmp_path / "dumps", allow_without_backup=True)
    assert upgrade(db_url, allowed) is None
    assert snapshot(db_url)["alembic_version"][2] == [(HEAD,)]


def test_a_backup_that_cannot_be_written_stops_the_upgrade(db_url, tmp_path):
    database_at(db_url, "0004")
    before = snapshot(db_url)
    (tmp_path / "not-a-folder").write_text("")

    with pytest.raises(UpgradeRefused) as refused:
        upgrade(db_url, BackupSettings(folder=tmp_path / "not-a-folder"))

    assert "no backup could be taken first: cannot write" in str(refused.value)
    assert snapshot(db_url) == before


def test_only_the_newest_upgrade_backups_are_kept(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'queue.sqlite'}"
    database_at(db_url, "0004")
    settings = BackupSettings(kept=2)
    taken = [
        take_backup(db_url, old, HEAD, settings, "queue DB") for old in ("0002", "0003", "0004")
    ]
    assert sorted(tmp_path.glob("queue.sqlite.before-*.sqlite")) == sorted(taken[1:])


def test_pg_dump_gets_the_password_in_its_environment_not_its_arguments(tmp_path):
    url = make_url("postgresql+psycopg://fgpu:s3cret@db.example:5433/fgpu_queue?sslmode=require")
    args, env = pg_dump_command(url, tmp_path / "x.dump")
    assert not any("s3cret" in arg for arg in args)
    assert env == {"PGPASSWORD": "s3cret"}
    assert "--format=custom" in args
    assert f"--file={tmp_path / 'x.dump'}" in args
    assert "--dbname=postgresql://fgpu@db.example:5433/fgpu_queue?sslmode=require" in args


def test_backup_names_say_from_which_revision_to_which_and_when():
    now = datetime(2026, 11, 26, 4, 5, 6, tzinfo=UTC)
    assert (
        backup_name("fgpu_queue.sqlite", "0004", "0007", now)
        == "fgpu_queue.sqlite.before-0004-to-0007-20261126T040506Z"
    )
    assert backup_name("q", None, "0007", now).startswith("q.before-base-to-0007-")


def hub_db_one_revision_behind(db_url: str) -> tuple[str, str]:
    """A hub DB made by the installed JupyterHub, marked as one revision older: (its revision,
    JupyterHub's newest)."""
    from jupyterhub import orm

    orm.new_session_factory(db_url).kw["bind"].dispose()
    scripts = ScriptDirectory.from_config(
        alembic_config(db_url, Path(orm.__file__).with_name("alembic"))
    )
    head = scripts.get_current_head()
    assert backup_before_hub_upgrade(db_url) is None  # at JupyterHub's head: nothing to do
    previous = scripts.get_revision(head).down_revision
    engine = create_engine(db_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": previous})
    engine.dispose()
    return previous, head


def test_the_hub_db_is_backed_up_before_jupyterhub_upgrades_it(db_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a PostgreSQL dump goes to the state directory
    if make_url(db_url).get_backend_name() == "sqlite":
        db_url = f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"
    previous, head = hub_db_one_revision_behind(db_url)

    backup = backup_before_hub_upgrade(db_url)

    assert backup.parent == tmp_path
    assert backup.name.startswith(
        f"{make_url(db_url).database.split('/')[-1]}.before-{previous}-to-{head}-"
    )
    assert backup.stat().st_size > 0


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_without_pg_dump_the_hub_db_is_not_left_to_jupyterhub_to_upgrade(
    db_url, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    hub_db_one_revision_behind(db_url)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))

    with pytest.raises(UpgradeRefused) as refused:
        backup_before_hub_upgrade(db_url)

    message = str(refused.value)
    assert f"the hub DB {make_url(db_url).render_as_string()} needs an upgrade" in message
    assert "pg_dump is not installed" in message and "jupyterhub upgrade-db" in message
    assert list(tmp_path.glob("*.dump")) == []
