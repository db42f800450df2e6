"""What the automatic backup adds to a schema upgrade of the queue DB (queue_service/store/db_upgrade.py).

A queue DB at revision 0004 with N ended sessions is upgraded to head with its backup (SQLite's
online backup, or pg_dump -Fc), against the baseline measured in the same run: the same database
upgraded by alembic alone (the former upgrade: no backup, a transaction per revision on
PostgreSQL). On SQLite and on the test PostgreSQL server (FGPU_TEST_POSTGRES_URL, as the tests).

    .venv/bin/python -m benchmarks.db_upgrade --sessions 20000
"""

from __future__ import annotations

import argparse
import os
import secrets
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from queue_service.store.db import make_engine
from queue_service.store.db_upgrade import BackupSettings, alembic_config, upgrade

POSTGRES_URL = os.environ.get(
    "FGPU_TEST_POSTGRES_URL", "postgresql+psycopg://fgpu:fgpu@127.0.0.1:5432/fgpu_test"
)
STATUSES = ["TERMINATED", "CANCELLED", "PENDING_TIMEOUT", "ERROR"]


def old_database(db_url: str, sessions: int) -> None:
    command.upgrade(alembic_config(db_url), "0004")
    engine = make_engine(db_url)
    rows = [
        {
            "id": f"s{n:031d}",
            "seq": n,
            "user": f"student-{n % 100}",
            "status": STATUSES[n % len(STATUSES)],
            "reason": "the container stopped" if n % 7 == 0 else "",
        }
        for n in range(1, sessions + 1)
    ]
    with engine.begin() as connection:
        connection.execute(
            text(
                'INSERT INTO sessions (id, seq, "user", server_name, status, image, cpu, mem,'
                " fgpu, resource_group, node, reason, skips, created, started, ended) VALUES"
                " (:id, :seq, :user, '', :status, 'python-3.11', 0.5, 536870912, 0.5, 'default',"
                " 'node-1', :reason, 0, '2026-11-01 09:00:00+00:00', '2026-11-01 09:00:00+00:00',"
                " '2026-11-01 10:00:00+00:00')"
            ),
            rows,
        )
    engine.dispose()


@contextmanager
def databases(kind: str, folder: Path):
    """Two empty databases of `kind`: one for the upgrade with a backup, one for the baseline."""
    if kind == "sqlite":
        yield [f"sqlite:///{folder / name}.sqlite" for name in ("with_backup", "baseline")]
        return
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    names = [f"fgpu_b_{secrets.token_hex(4)}" for _ in range(2)]
    with admin.connect() as connection:
        for name in names:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield [
            make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
            for name in names
        ]
    finally:
        with admin.connect() as connection:
            for name in names:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def measure(kind: str, sessions: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, databases(kind, Path(tmp)) as (ours, baseline):
        for url in (ours, baseline):
            old_database(url, sessions)
        start = time.perf_counter()
        command.upgrade(alembic_config(baseline), "head")
        alembic_alone = time.perf_counter() - start
        start = time.perf_counter()
        backup = upgrade(ours, BackupSettings(folder=Path(tmp) / "backups"))
        with_backup = time.perf_counter() - start
        print(
            f"{kind:10} {sessions:>7} sessions: upgrade 0004→head with backup {with_backup:6.2f} s"
            f" (backup {backup.stat().st_size / 2**20:.1f} MiB), alembic alone"
            f" {alembic_alone:6.2f} s, ratio {with_backup / alembic_alone:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20_000)
    args = parser.parse_args()
    for kind in ("sqlite", "postgresql"):
        measure(kind, args.sessions)


if __name__ == "__main__":
    main()
