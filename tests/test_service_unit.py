"""The unit-file builders (fgpu_admin/service_unit.py): what each unit says, and the cron line
of machines without systemd, run for real by a shell."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path, PurePosixPath

import pytest

from fgpu_admin import service_unit
from fgpu_admin.service_unit import ServiceSettings
from fgpu_spawner.queue_client import open_files_needed

REPO = PurePosixPath("/opt/fgpu-hub")


def lines_of(text: str) -> list[str]:
    return text.splitlines()


def test_the_hub_unit_runs_the_hub_in_its_state_directory_with_the_sites_settings():
    unit = lines_of(service_unit.hub_unit(ServiceSettings(REPO, PurePosixPath("/srv/hub"))))
    assert (
        "ExecStart=/opt/fgpu-hub/.venv/bin/jupyterhub -f /opt/fgpu-hub/jupyterhub_config.py" in unit
    )
    assert "WorkingDirectory=/srv/hub" in unit
    assert "EnvironmentFile=-/etc/fgpu-hub/env" in unit
    assert "Restart=on-failure" in unit
    assert "After=docker.service network-online.target" in unit
    assert "Wants=docker.service network-online.target" in unit
    assert "WantedBy=multi-user.target" in unit
    assert not any(line.startswith("User=") for line in unit)  # root by default


def test_the_hub_alone_gets_the_stop_signal_and_nothing_of_the_unit_outlives_it():
    unit = lines_of(service_unit.hub_unit(ServiceSettings(REPO)))
    # Not `process`: an idle culler left behind by a crashed hub would run on, unowned.
    assert "KillMode=mixed" in unit


def test_the_open_file_limit_is_what_the_config_raises_it_to_for_the_class():
    needed = service_unit.open_files_for_class(class_size=200, pending_per_user=2)
    assert needed == open_files_needed(2 * 200 + 100)
    unit = service_unit.hub_unit(ServiceSettings(REPO, open_files=needed))
    assert f"LimitNOFILE={needed}:{service_unit.SYSTEMD_HARD_NOFILE}" in lines_of(unit)
    # A class past systemd's usual hard limit gets it whole.
    assert service_unit.limit_nofile(600_000) == "600000:600000"


def test_a_hub_user_runs_both_units_with_the_engines_group():
    settings = ServiceSettings(REPO, user="fgpu", groups=("docker",))
    for text in (service_unit.hub_unit(settings), service_unit.backup_service_unit(settings)):
        assert "User=fgpu" in lines_of(text)
        assert "SupplementaryGroups=docker" in lines_of(text)


def test_the_backup_runs_in_the_state_directory_and_keeps_n_days():
    settings = ServiceSettings(REPO, PurePosixPath("/srv/hub"), keep_days=30)
    unit = lines_of(service_unit.backup_service_unit(settings))
    assert "Type=oneshot" in unit
    assert "ExecStart=/opt/fgpu-hub/.venv/bin/fgpu-hub backup --keep-days 30" in unit
    assert "WorkingDirectory=/srv/hub" in unit
    assert "EnvironmentFile=-/etc/fgpu-hub/env" in unit


@pytest.mark.parametrize(
    "every, calendar",
    [("daily", "*-*-* 03:00:00"), ("hourly", "hourly"), ("weekly", "Sun *-*-* 03:00:00")],
)
def test_the_timer_runs_the_backup_as_often_as_asked(every, calendar):
    timer = lines_of(service_unit.backup_timer_unit(ServiceSettings(REPO, backup_every=every)))
    assert f"OnCalendar={calendar}" in timer
    assert "Persistent=true" in timer
    assert f"Unit={service_unit.BACKUP_UNIT}" in timer


def test_the_example_settings_change_nothing_until_edited():
    text = service_unit.example_env_file(ServiceSettings(REPO))
    settings = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert settings == []
    assert "#FGPU_QUEUE_DB_URL=" in text and "#FGPU_HUB_DB_URL=" in text


@pytest.mark.parametrize(
    "path, problem",
    [("var/lib/x", "absolute"), ("/srv/my hub", "escaped"), ("/srv/100%", "escaped")],
)
def test_paths_a_unit_would_misread_are_refused(path, problem):
    assert problem in service_unit.plain_path_problem(path, "the state directory")
    assert service_unit.plain_path_problem("/var/lib/fgpu-hub", "x") is None


def test_the_cron_line_backs_up_in_the_state_directory_with_the_sites_settings(tmp_path: Path):
    # A stand-in for the venv's fgpu-hub that says where and with what it ran: the line itself
    # (cd, the settings file, the arguments) is run by a real shell, as cron would.
    repo, state = tmp_path / "repo", tmp_path / "state"
    (repo / ".venv" / "bin").mkdir(parents=True)
    state.mkdir()
    seen = tmp_path / "seen"
    stand_in = repo / ".venv" / "bin" / "fgpu-hub"
    stand_in.write_text(f'#!/bin/sh\necho "$PWD $FGPU_BACKUP_DIR $*" > {seen}\n')
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IXUSR)
    env_file = tmp_path / "env"
    env_file.write_text("# a comment\nFGPU_BACKUP_DIR=/srv/backups\n")
    settings = ServiceSettings(
        PurePosixPath(repo), PurePosixPath(state), env_file=PurePosixPath(env_file), keep_days=7
    )
    line = service_unit.cron_line(settings)
    assert line.startswith("0 3 * * * ")
    command = service_unit.cron_command(settings)
    clean = {"PATH": os.environ["PATH"]}
    subprocess.run(["sh", "-c", command], check=True, env=clean)
    assert seen.read_text().split() == [str(state), "/srv/backups", "backup", "--keep-days", "7"]
    # Without a settings file, the backup still runs.
    env_file.unlink()
    subprocess.run(["sh", "-c", command], check=True, env=clean)
    assert seen.read_text().split() == [str(state), "backup", "--keep-days", "7"]


def test_the_foreground_way_names_the_state_directory_and_the_cron_line():
    settings = ServiceSettings(REPO, PurePosixPath("/srv/hub"))
    text = service_unit.foreground_instructions(settings)
    assert "cd /srv/hub && /opt/fgpu-hub/scripts/up" in text
    assert "/opt/fgpu-hub/.venv/bin/jupyterhub -f /opt/fgpu-hub/jupyterhub_config.py" in text
    assert service_unit.cron_line(settings) in text


def test_the_units_take_effect_and_start_now_and_at_every_boot():
    # Run only where systemd runs (not on these machines).
    assert service_unit.systemctl_commands() == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "--now", "fgpu-hub.service", "fgpu-hub-backup.timer"],
    ]


def test_the_sites_settings_file_is_read_as_systemd_reads_it():
    text = "# comment\n\n; also a comment\nFGPU_CLASS_SIZE=50\nFGPU_HUB_IP = \"0.0.0.0\"\nX='a b'\n"
    assert service_unit.read_env_file(text) == {
        "FGPU_CLASS_SIZE": "50",
        "FGPU_HUB_IP": "0.0.0.0",
        "X": "a b",
    }
