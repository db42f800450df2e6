"""`fgpu-hub install-service`, run for real: into a temporary root (`--root`), whose units
`systemd-analyze verify` then checks, and on this machine as it is, where systemd is not PID 1.

What cannot run here: `systemctl daemon-reload`, `enable --now` and a real start of the units
(no systemd as the init system on these machines)."""

from __future__ import annotations

import contextlib
import io
import os
import pwd
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from jupyterhub import orm

from fgpu_admin import cli, install_service, service_unit
from queue_service.store.db import open_database

FGPU_HUB = str(Path(sys.executable).parent / "fgpu-hub")
UNITS = (service_unit.HUB_UNIT, service_unit.BACKUP_UNIT, service_unit.BACKUP_TIMER)
#: A system account every Debian has (not `nobody`, whose use systemd warns about).
SYSTEM_USER = "daemon"


def install(*args: str) -> subprocess.CompletedProcess:
    """The command in this process (the console script's own `main`): a subprocess each time
    would import the hub's packages again for every case."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(["install-service", *args])
        except SystemExit as e:  # argparse's usage errors
            code = e.code
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def install_as_a_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [FGPU_HUB, "install-service", *args], capture_output=True, text=True, timeout=60
    )


def systemd_analyze_verify(unit_dir: Path) -> subprocess.CompletedProcess:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: scripts/up --setup-only installs Debian's systemd"
    paths = [str(unit_dir / name) for name in UNITS]
    return subprocess.run([analyze, "verify", *paths], capture_output=True, text=True, timeout=60)


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*")) if root.exists() else []


def test_the_units_are_written_under_the_root_and_systemd_finds_nothing_wrong(tmp_path):
    root = tmp_path / "root"
    done = install("--root", str(root), "--keep-days", "30", "--backup-every", "weekly")
    assert done.returncode == 0, done.stderr
    unit_dir = root / "etc" / "systemd" / "system"
    for name in UNITS:
        assert stat.S_IMODE((unit_dir / name).stat().st_mode) == 0o644
    hub = (unit_dir / service_unit.HUB_UNIT).read_text()
    assert f"ExecStart={install_service.REPO}/.venv/bin/jupyterhub -f" in hub
    assert "WorkingDirectory=/var/lib/fgpu-hub" in hub
    backup = (unit_dir / service_unit.BACKUP_UNIT).read_text()
    assert "backup --keep-days 30" in backup
    assert "OnCalendar=Sun *-*-* 03:00:00" in (unit_dir / service_unit.BACKUP_TIMER).read_text()
    env = root / "etc" / "fgpu-hub" / "env"
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    assert (root / "var" / "lib" / "fgpu-hub").is_dir()
    assert "systemctl was not run" in done.stdout

    verified = systemd_analyze_verify(unit_dir)
    # verify exits 0 on a key it ignores, and says so: any word from it is a fault.
    assert (verified.returncode, verified.stdout + verified.stderr) == (0, "")


def test_a_hub_user_owns_the_state_directory_and_the_units_still_verify(tmp_path):
    root = tmp_path / "root"
    done = install("--root", str(root), "--user", SYSTEM_USER, "--state-dir", "/srv/hub")
    assert done.returncode == 0, done.stderr
    state = root / "srv" / "hub"
    assert state.stat().st_uid == pwd.getpwnam(SYSTEM_USER).pw_uid
    hub = (root / "etc" / "systemd" / "system" / service_unit.HUB_UNIT).read_text()
    assert f"User={SYSTEM_USER}" in hub and "WorkingDirectory=/srv/hub" in hub
    verified = systemd_analyze_verify(root / "etc" / "systemd" / "system")
    assert (verified.returncode, verified.stdout + verified.stderr) == (0, "")


def test_installing_again_updates_the_units_and_never_the_sites_settings(tmp_path):
    root = tmp_path / "root"
    assert install("--root", str(root)).returncode == 0
    env = root / "etc" / "fgpu-hub" / "env"
    env.write_text("FGPU_HUB_PORT=9000\n")
    done = install("--root", str(root), "--keep-days", "3")
    assert done.returncode == 0, done.stderr
    assert env.read_text() == "FGPU_HUB_PORT=9000\n"
    assert "kept the site's settings" in done.stdout
    backup = root / "etc" / "systemd" / "system" / service_unit.BACKUP_UNIT
    assert "--keep-days 3" in backup.read_text()
    assert not [p for p in files_under(root) if p.name.endswith(".partial")]


def test_the_open_file_limit_follows_the_class_size_of_the_sites_settings(tmp_path):
    root = tmp_path / "root"
    env = root / "etc" / "fgpu-hub" / "env"
    env.parent.mkdir(parents=True)
    env.write_text("FGPU_CLASS_SIZE=1000\n")
    assert install("--root", str(root)).returncode == 0
    hub = (root / "etc" / "systemd" / "system" / service_unit.HUB_UNIT).read_text()
    needed = service_unit.open_files_for_class(1000, install_service.DEFAULT_PENDING_PER_USER)
    assert f"LimitNOFILE={needed}:" in hub
    # The option wins.
    assert install("--root", str(root), "--class-size", "10").returncode == 0
    hub = (root / "etc" / "systemd" / "system" / service_unit.HUB_UNIT).read_text()
    assert f"LimitNOFILE={service_unit.open_files_for_class(10, 2)}:" in hub
    env.write_text("FGPU_CLASS_SIZE=lots\n")
    done = install("--root", str(root))
    assert done.returncode == 1 and "FGPU_CLASS_SIZE" in done.stderr


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--state-dir", "var/lib/hub"], 2, "must be an absolute path"),
        (["--state-dir", "/srv/my hub"], 2, "escaped"),
        (["--keep-days", "0"], 2, "must be above 0"),
        (["--keep-days", "many"], 2, "whole number"),
        (["--backup-every", "monthly"], 2, "invalid choice"),
        (["--user", "no-such-user-fgpu"], 1, "no user named 'no-such-user-fgpu'"),
    ],
)
def test_bad_options_are_refused_with_a_message_and_write_nothing(tmp_path, args, code, message):
    root = tmp_path / "root"
    done = install("--root", str(root), *args)
    assert done.returncode == code, done.stdout
    assert message in done.stderr.strip().splitlines()[-1]
    assert files_under(root) == []


def test_a_dry_run_prints_the_units_and_writes_nothing(tmp_path):
    root = tmp_path / "root"
    done = install("--root", str(root), "--dry-run")
    assert done.returncode == 0, done.stderr
    for name in UNITS:
        assert f"# ---- /etc/systemd/system/{name} ----" in done.stdout
    assert "ExecStart=" in done.stdout and "[Timer]" in done.stdout
    assert files_under(root) == []


def test_without_systemd_it_says_so_writes_nothing_and_offers_the_foreground_way():
    # These machines (and containers) run without systemd as PID 1.
    assert not install_service.SYSTEMD_RUNTIME_DIR.exists(), (
        "this test is about a machine without systemd as PID 1; this one runs it"
    )
    units = [Path("/etc/systemd/system", name) for name in UNITS]
    before = {path: path.exists() for path in [*units, Path("/etc/fgpu-hub/env")]}
    done = install_as_a_command()
    assert done.returncode == 0, done.stderr
    assert "systemd is not running on this machine" in done.stdout
    assert "nothing was written" in done.stdout
    assert f"cd /var/lib/fgpu-hub && {install_service.REPO}/scripts/up" in done.stdout
    assert "0 3 * * * cd /var/lib/fgpu-hub" in done.stdout
    assert "backup --keep-days 14" in done.stdout
    assert {path: path.exists() for path in before} == before


def unit_value(text: str, key: str) -> str:
    (value,) = [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "=")]
    return value


def test_the_backup_units_command_writes_an_archive_in_the_state_directory(tmp_path):
    # What systemd would run for the timer: the unit's ExecStart in its WorkingDirectory.
    root, state = tmp_path / "root", tmp_path / "state"
    state.mkdir()
    orm.new_session_factory(f"sqlite:///{state / 'jupyterhub.sqlite'}").kw["bind"].dispose()
    open_database(f"sqlite:///{state / 'fgpu_queue.sqlite'}").kw["bind"].dispose()
    done = install("--root", str(root), "--state-dir", str(state), "--keep-days", "3")
    assert done.returncode == 0, done.stderr
    unit = (root / "etc" / "systemd" / "system" / service_unit.BACKUP_UNIT).read_text()
    assert unit_value(unit, "WorkingDirectory") == str(state)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FGPU_")}
    ran = subprocess.run(
        shlex.split(unit_value(unit, "ExecStart")),
        cwd=unit_value(unit, "WorkingDirectory"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    archive = Path(ran.stdout.strip().splitlines()[-1])
    assert archive.parent == state / "backups" and archive.is_file()
