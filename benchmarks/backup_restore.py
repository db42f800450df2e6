"""`fgpu-hub backup` and `fgpu-hub restore`: time and size for a hub with 1,000 finished sessions
and 100 users.

The state is written straight into the databases through their own models (JupyterHub's ORM, the
queue service's records; tests/hub_state.py), on SQLite files in a state directory, or with
`--postgres URL` on two PostgreSQL databases made for the run (the URL names a role that may
CREATE DATABASE). Each round times the console scripts as an admin runs them: `fgpu-hub backup`
in the state directory, then `fgpu-hub restore --yes` of that archive into a fresh directory.

Baseline, in the same run: what an admin would otherwise do, a plain copy of the state directory
(state files, and the database files copied, or `pg_dump` of each database) packed with
`tar czf`.
"""

from __future__ import annotations

import argparse
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from queue_service.store import state_dir
from tests.hub_state import make_hub_state

VENV_BIN = Path(sys.executable).parent


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], cwd: Path, env: dict) -> tuple[float, float, str]:
    """Wall time and CPU time (less noisy on a shared machine) of one command, and its output."""
    start, cpu = time.perf_counter(), child_cpu()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr.strip()}")
    return elapsed, child_cpu() - cpu, done.stdout


def baseline(state: Path, work: Path, env: dict, urls: tuple[str, str]) -> tuple[float, float, int]:
    """cp (or pg_dump) + tar czf of the state: wall and CPU time, and the tarball's size."""
    copy = work / "copy"
    shutil.rmtree(copy, ignore_errors=True)
    start, cpu = time.perf_counter(), child_cpu()
    copy.mkdir()
    for path in state.iterdir():
        if path.is_file():
            shutil.copy2(path, copy / path.name)
    for what, url in zip(("hub", "queue"), urls, strict=True):
        if url.startswith("postgresql"):
            plain = url.replace("postgresql+psycopg://", "postgresql://")
            subprocess.run(
                ["pg_dump", "--file", str(copy / f"{what}.sql"), plain], env=env, check=True
            )
    tarball = work / "plain.tar.gz"
    subprocess.run(["tar", "czf", str(tarball), "-C", str(copy), "."], check=True)
    return time.perf_counter() - start, child_cpu() - cpu, tarball.stat().st_size


def postgres_dbs(admin_url: str) -> tuple[str, str, object]:
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    names = [f"fgpu_bench_{what}_{secrets.token_hex(4)}" for what in ("hub", "queue")]
    with admin.connect() as db:
        for name in names:
            db.execute(text(f'CREATE DATABASE "{name}"'))
    urls = [admin.url.set(database=n).render_as_string(hide_password=False) for n in names]
    return urls[0], urls[1], (admin, names)


def drop(admin, names) -> None:
    with admin.connect() as db:
        for name in names:
            db.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", metavar="URL", help="run on PostgreSQL (an admin URL)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="fgpu-bench-backup-") as tmp:
        work = Path(tmp)
        state = work / "hub"
        env = {**os.environ, "FGPU_BACKUP_DIR": str(work / "backups")}
        env.pop("FGPU_CATALOG_PATH", None)
        dropped = None
        if args.postgres:
            hub_url, queue_url, dropped = postgres_dbs(args.postgres)
        else:
            hub_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
            queue_url = f"sqlite:///{state / 'fgpu_queue.sqlite'}"
        env[state_dir.HUB_DB_ENV], env[state_dir.QUEUE_DB_ENV] = hub_url, queue_url
        if not args.postgres:  # the default: relative files in the state directory
            env.pop(state_dir.HUB_DB_ENV)
            env.pop(state_dir.QUEUE_DB_ENV)
        try:
            make_hub_state(state, hub_url, queue_url, users=args.users, finished=args.sessions)
            run_rounds(args, work, state, env, (hub_url, queue_url))
        finally:
            if dropped:
                drop(*dropped)


def run_rounds(args, work: Path, state: Path, env: dict, urls: tuple[str, str]) -> None:
    fgpu_hub = str(VENV_BIN / "fgpu-hub")
    kind = "PostgreSQL" if args.postgres else "SQLite"
    print(f"{args.users} users, {args.sessions} finished sessions, {kind}, {args.rounds} rounds")
    backups, restores, plains = [], [], []
    size = plain_size = 0
    for _ in range(args.rounds):
        *backup, out = timed([fgpu_hub, "backup"], state, env)
        archive = Path(out.strip().splitlines()[-1])
        backups.append(backup)
        size = archive.stat().st_size
        target = work / "restored"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        # Into a fresh directory; PostgreSQL databases are emptied and loaded in place.
        *restore, _ = timed([fgpu_hub, "restore", "--yes", str(archive)], target, env)
        restores.append(restore)
        archive.unlink()
        *plain, plain_size = baseline(state, work, env, urls)
        plains.append(plain)
    db_bytes = sum(p.stat().st_size for p in state.iterdir() if p.suffix == ".sqlite")
    print(
        f"state: {db_bytes / 1024:.0f} KiB of SQLite files" if db_bytes else "state: in PostgreSQL"
    )
    (backup_s, backup_cpu), (restore_s, restore_cpu), (plain_s, plain_cpu) = (
        (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
        for runs in (backups, restores, plains)
    )
    print(
        f"fgpu-hub backup   median {backup_s:.2f} s wall, {backup_cpu:.2f} s CPU; archive {size / 1024:.0f} KiB"
    )
    print(f"fgpu-hub restore  median {restore_s:.2f} s wall, {restore_cpu:.2f} s CPU")
    print(
        f"baseline cp+tar   median {plain_s:.2f} s wall, {plain_cpu:.2f} s CPU; tarball {plain_size / 1024:.0f} KiB"
    )
    print(
        f"ratio: backup {backup_cpu / plain_cpu:.1f}x the baseline's CPU time"
        f" ({backup_s / plain_s:.1f}x wall), restore {restore_cpu / plain_cpu:.1f}x,"
        f" archive {size / plain_size:.2f}x its size"
    )


if __name__ == "__main__":
    main()
