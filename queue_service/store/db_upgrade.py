"""Schema upgrades of a database: a backup first, every revision in one transaction.

Before alembic upgrades a database that holds data and is not at the newest revision, a backup is
taken: SQLite's online backup into ``<db file>.before-<from>-to-<head>-<UTC time>.sqlite`` beside
the file, or ``pg_dump -Fc`` into ``<database>.before-<from>-to-<head>-<UTC time>.dump`` in the
backup folder. Only the newest few are kept. Without ``pg_dump`` a PostgreSQL database is not
upgraded at all, unless the site allows it. The upgrade then runs in a single transaction (see
migrations/env.py), so a revision that fails leaves the schema, the revision and the rows as they
were, on SQLite as on PostgreSQL.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import URL, make_url

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
#: Upgrade backups of one database kept by default; older ones are deleted after a new one.
DEFAULT_KEPT = 3

default_log = logging.getLogger(__name__)


class UpgradeRefused(Exception):
    """The database was left as it was: why, and what to do, in one line."""


@dataclass(frozen=True)
class BackupSettings:
    #: Where PostgreSQL dumps go (and SQLite copies, if set); None: beside a SQLite file, and the
    #: current directory (the hub's state directory) for a PostgreSQL dump.
    folder: Path | None = None
    kept: int = DEFAULT_KEPT
    #: Upgrade even when no backup can be taken (pg_dump missing or failing, a full disk).
    allow_without_backup: bool = False
    #: What the admin may do instead, in a refusal.
    instead: str = (
        "or allow the upgrade without a backup (QueueService.upgrade_without_backup) once you"
        " have taken one"
    )


def alembic_config(db_url: str, script_location: str | Path = MIGRATIONS_DIR) -> Config:
    config = Config()
    config.set_main_option("script_location", str(script_location))
    config.set_main_option("sqlalchemy.url", db_url.replace("%", "%%"))
    return config


def safe_url(db_url: str) -> str:
    """The URL for a log line: the password hidden."""
    return make_url(db_url).render_as_string(hide_password=True)


def backup_name(database: str, current: str | None, head: str, now: datetime) -> str:
    """``<database>.before-<from>-to-<head>-<UTC time>``; a database without a revision (tables
    from before alembic) is `base`."""
    return f"{database}.before-{current or 'base'}-to-{head}-{now.strftime('%Y%m%dT%H%M%SZ')}"


def revisions(db_url: str, config: Config) -> tuple[str | None, str, bool]:
    """(the database's revision, the newest revision, whether it holds any table)."""
    head = ScriptDirectory.from_config(config).get_current_head()
    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            current = MigrationContext.configure(connection).get_current_revision()
            has_tables = bool(inspect(connection).get_table_names())
    finally:
        engine.dispose()
    return current, head, has_tables


def upgrade(
    db_url: str,
    settings: BackupSettings | None = None,
    *,
    log: logging.Logger | None = None,
    script_location: str | Path = MIGRATIONS_DIR,
    what: str = "queue DB",
) -> Path | None:
    """Bring the database at `db_url` to the newest revision; returns the backup taken, if any.
    Raises UpgradeRefused, with the database unchanged, when it cannot be done safely."""
    settings, log = settings or BackupSettings(), log or default_log
    config = alembic_config(db_url, script_location)
    current, head, has_tables = revisions(db_url, config)
    if current == head:
        return None
    if current is not None and _unknown(config, current):
        raise UpgradeRefused(
            f"the {what} is at schema revision {current}, which this fGPU hub does not know (its"
            f" newest is {head}): a newer release wrote it. Run that release, or restore a backup"
            " taken before its upgrade"
        )
    backup = take_backup(db_url, current, head, settings, what, log) if has_tables else None
    if has_tables:
        # A warning, so that it shows at the services' default log level: an admin looks for it.
        log.warning(
            "Upgrading the %s %s from schema revision %s to %s; backup: %s%s",
            what,
            safe_url(db_url),
            current or "base",
            head,
            backup or "none (allowed by the settings)",
            f" (the last {settings.kept} upgrade backups are kept)" if backup else "",
        )
    try:
        command.upgrade(config, "head")
    except Exception as e:
        raise UpgradeRefused(
            f"the {what}'s upgrade from revision {current or 'base'} to {head} failed and was"
            f" rolled back, so it is as it was{_where(backup)}: {type(e).__name__}: {e}"
        ) from e
    if has_tables:
        log.warning("The %s is at schema revision %s", what, head)
    return backup


def _unknown(config: Config, revision: str) -> bool:
    try:
        return ScriptDirectory.from_config(config).get_revision(revision) is None
    except CommandError:
        return True


def _where(backup: Path | None) -> str:
    return f" (backup: {backup})" if backup else ""


def take_backup(
    db_url: str,
    current: str | None,
    head: str,
    settings: BackupSettings,
    what: str,
    log: logging.Logger = default_log,
) -> Path | None:
    """The backup before an upgrade from `current` to `head`, the older ones pruned; None when
    none could be taken and the settings allow that, else UpgradeRefused saying why."""
    url = make_url(db_url)
    backend = url.get_backend_name()
    try:
        if backend == "sqlite":
            source = Path(url.database)
            database, folder, suffix = source.name, settings.folder or source.parent, ".sqlite"
        elif backend == "postgresql":
            database, folder, suffix = url.database, settings.folder or Path.cwd(), ".dump"
        else:
            raise UpgradeRefused(f"no backup of a {backend} database")
        name = backup_name(database, current, head, datetime.now(UTC))
        target = folder / f"{name}{suffix}"
        if backend == "sqlite":
            backup_sqlite(source, target)
        else:
            dump_postgres(url, target)
    except UpgradeRefused as e:
        if not settings.allow_without_backup:
            raise UpgradeRefused(
                f"the {what} {safe_url(db_url)} needs an upgrade from schema revision"
                f" {current or 'base'} to {head}, and no backup could be taken first: {e}."
                f" Fix that, {settings.instead}"
            ) from None
        log.warning("Upgrading the %s without a backup (allowed): %s", what, e)
        return None
    prune(folder, f"{database}.before-*{suffix}", settings.kept, what, log)
    return target


def _private_file(target: Path) -> None:
    """An empty file readable by its owner alone, in a folder made if missing: a backup holds
    what the database holds. Refused if it cannot be made."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as e:
        raise UpgradeRefused(f"cannot write {target}: {e.strerror}") from None


def backup_sqlite(source: Path, target: Path) -> None:
    """SQLite's online backup: a consistent copy even while another connection writes."""
    _private_file(target)
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    except sqlite3.Error as e:
        target.unlink(missing_ok=True)
        raise UpgradeRefused(f"the backup to {target} failed: {e}") from None
    finally:
        dst.close()
        src.close()


def pg_dump_command(url: URL, target: Path) -> tuple[list[str], dict[str, str]]:
    """pg_dump's arguments and environment for `url`: the password goes in the environment, where
    `ps` does not show it."""
    env = {"PGPASSWORD": str(url.password)} if url.password is not None else {}
    return ["pg_dump", "--format=custom", f"--file={target}", f"--dbname={libpq_dsn(url)}"], env


def libpq_dsn(url: URL) -> str:
    """`url` as libpq's tools read it, without the password (URL.set cannot remove one)."""
    return URL.create(
        "postgresql",
        username=url.username,
        host=url.host,
        port=url.port,
        database=url.database,
        query=url.query,
    ).render_as_string(hide_password=False)


def dump_postgres(url: URL, target: Path) -> None:
    if shutil.which("pg_dump") is None:
        raise UpgradeRefused("pg_dump is not installed (Debian: postgresql-client)")
    _private_file(target)
    args, env = pg_dump_command(url, target)
    done = subprocess.run(args, env={**os.environ, **env}, capture_output=True, text=True)
    if done.returncode != 0:
        target.unlink(missing_ok=True)
        message = done.stderr.strip().splitlines()
        raise UpgradeRefused(f"pg_dump failed: {message[-1] if message else done.returncode}")


def prune(
    folder: Path, pattern: str, kept: int, what: str, log: logging.Logger = default_log
) -> None:
    """Delete all but the newest `kept` upgrade backups matching `pattern`."""
    backups = sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in backups[max(kept, 1) :]:
        old.unlink(missing_ok=True)
        log.warning("Deleted an old upgrade backup of the %s (%d kept): %s", what, kept, old)


def backup_before_hub_upgrade(
    db_url: str, settings: BackupSettings | None = None, log: logging.Logger | None = None
) -> Path | None:
    """The hub's own database: JupyterHub upgrades it at start (JupyterHub.upgrade_db), with a
    file copy of SQLite only. The same backup as the queue DB's is taken first when it is behind
    JupyterHub's newest revision, PostgreSQL included; refused (UpgradeRefused) without one."""
    import jupyterhub

    settings = settings or BackupSettings(
        instead="or take a backup yourself and run `jupyterhub upgrade-db -f jupyterhub_config.py`"
    )
    config = alembic_config(db_url, Path(jupyterhub.__file__).with_name("alembic"))
    current, head, has_tables = revisions(db_url, config)
    if current == head or not has_tables:
        return None
    backup = take_backup(db_url, current, head, settings, "hub DB", log or default_log)
    (log or default_log).warning(
        "JupyterHub upgrades the hub DB from schema revision %s to %s; backup: %s (the last %d"
        " upgrade backups are kept)",
        current,
        head,
        backup,
        settings.kept,
    )
    return backup
