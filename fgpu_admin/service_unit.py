"""The systemd units that run the hub as a service, and the foreground way where systemd is not
running: pure text builders (no I/O), which `install_service` writes and tests read.

- `fgpu-hub.service` runs `jupyterhub -f jupyterhub_config.py` in the state directory, with the
  site's settings from `/etc/fgpu-hub/env`. It starts after the Docker engine and the network,
  restarts on failure, and stops with `KillMode=mixed`: SIGTERM goes to the hub alone, which
  stops its managed services (the queue service, the idle culler) and its proxy in order, and
  anything of the unit still running after the hub ended is killed, so no service outlives its
  hub. Sessions are not in the unit: their containers belong to dockerd, and with the shipped
  `cleanup_servers = False` they run on across a restart, which the queue service adopts.
- `fgpu-hub-backup.service` (oneshot, `fgpu-hub backup --keep-days N`) and
  `fgpu-hub-backup.timer`, which runs it hourly, daily or weekly, and on the next boot when a
  run was missed.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from fgpu_spawner.queue_client import open_files_needed, spawn_slots

HUB_UNIT = "fgpu-hub.service"
BACKUP_UNIT = "fgpu-hub-backup.service"
BACKUP_TIMER = "fgpu-hub-backup.timer"
UNIT_DIR = PurePosixPath("/etc/systemd/system")
ENV_FILE = PurePosixPath("/etc/fgpu-hub/env")
DEFAULT_STATE_DIR = PurePosixPath("/var/lib/fgpu-hub")
#: systemd's own default hard limit of open files (since v240): a site that raises
#: FGPU_CLASS_SIZE later still has room, since the hub raises its soft limit up to it.
SYSTEMD_HARD_NOFILE = 524288

#: --backup-every → (the timer's OnCalendar, the same schedule as a crontab's five fields).
#: At 03:00 local time, when a class is least likely to be using the hub.
BACKUP_SCHEDULES = {
    "hourly": ("hourly", "0 * * * *"),
    "daily": ("*-*-* 03:00:00", "0 3 * * *"),
    "weekly": ("Sun *-*-* 03:00:00", "0 3 * * 0"),
}

# Unit files give `%` and whitespace meanings of their own; a path made of these needs no quoting
# anywhere (systemd, a shell, a crontab).
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9._+@/-]*")


@dataclass(frozen=True)
class ServiceSettings:
    #: The repository: its `.venv/` and `jupyterhub_config.py`.
    repo: PurePosixPath
    state_dir: PurePosixPath = DEFAULT_STATE_DIR
    env_file: PurePosixPath = ENV_FILE
    #: The account the hub runs as; None: root, as The Littlest JupyterHub runs it.
    user: str | None = None
    #: Its further groups: `docker`, whose members may use the engine's socket.
    groups: tuple[str, ...] = ()
    keep_days: int = 14
    backup_every: str = "daily"
    #: The soft open-file limit (`open_files_for_class`).
    open_files: int = 4096

    @property
    def jupyterhub(self) -> PurePosixPath:
        return self.repo / ".venv" / "bin" / "jupyterhub"

    @property
    def fgpu_hub(self) -> PurePosixPath:
        return self.repo / ".venv" / "bin" / "fgpu-hub"

    @property
    def config(self) -> PurePosixPath:
        return self.repo / "jupyterhub_config.py"


def plain_path_problem(path: PurePosixPath | str, what: str) -> str | None:
    """Why `path` cannot go into a unit as it is (None: it can)."""
    text = str(path)
    if not text.startswith("/"):
        return f"{what} must be an absolute path, not {text!r}"
    if not _PLAIN_PATH.fullmatch(text):
        return (
            f"{what} {text!r} has characters a unit file would need escaped (spaces, %, quotes);"
            " use a path of letters, digits and ._+@-"
        )
    return None


def open_files_for_class(class_size: int, pending_per_user: int) -> int:
    """The open files the hub needs for a class of `class_size` (jupyterhub_config.py's
    `raise_open_file_limit` asks for the same), so the unit gives them from the start."""
    return open_files_needed(spawn_slots(class_size, pending_per_user))


def limit_nofile(open_files: int) -> str:
    """`LimitNOFILE=soft:hard`: the hub's need now, and room to raise it later."""
    return f"{open_files}:{max(open_files, SYSTEMD_HARD_NOFILE)}"


def _account_lines(settings: ServiceSettings) -> list[str]:
    if settings.user is None:
        return []
    lines = [f"User={settings.user}"]
    if settings.groups:
        lines.append("SupplementaryGroups=" + " ".join(settings.groups))
    return lines


def _path_line(settings: ServiceSettings) -> str:
    # The venv first: the hub starts its services with its own Python, and the proxy from PATH.
    path = f"{settings.repo}/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return f"Environment=PATH={path}"


def hub_unit(settings: ServiceSettings) -> str:
    """`fgpu-hub.service`."""
    lines = [
        "# Installed by `fgpu-hub install-service`; run it again to change this file.",
        "[Unit]",
        "Description=fGPU hub (JupyterHub with the fGPU queue service)",
        "Documentation=file://" + str(settings.repo / "docs/source/howto/install.md"),
        "After=docker.service network-online.target",
        "Wants=docker.service network-online.target",
        "",
        "[Service]",
        "Type=simple",
        *_account_lines(settings),
        f"WorkingDirectory={settings.state_dir}",
        # `-`: the hub starts with the shipped defaults when the site has no settings file.
        f"EnvironmentFile=-{settings.env_file}",
        _path_line(settings),
        f"ExecStart={settings.jupyterhub} -f {settings.config}",
        "Restart=on-failure",
        "RestartSec=5s",
        # SIGTERM to the hub alone: it stops its services (SIGINT, then SIGTERM 10 s later) and
        # its proxy itself; what is left of the unit afterwards is killed. Session containers
        # are dockerd's, outside this unit: they run on.
        "KillMode=mixed",
        "TimeoutStopSec=60s",
        f"LimitNOFILE={limit_nofile(settings.open_files)}",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


def backup_command(settings: ServiceSettings) -> str:
    return f"{settings.fgpu_hub} backup --keep-days {settings.keep_days}"


def backup_service_unit(settings: ServiceSettings) -> str:
    """`fgpu-hub-backup.service`: one backup, in the state directory, with the hub's settings."""
    lines = [
        "# Installed by `fgpu-hub install-service`; run it again to change this file.",
        "[Unit]",
        "Description=Back up the fGPU hub (databases, catalog, configuration, secrets)",
        f"After={HUB_UNIT}",
        "",
        "[Service]",
        "Type=oneshot",
        *_account_lines(settings),
        f"WorkingDirectory={settings.state_dir}",
        f"EnvironmentFile=-{settings.env_file}",
        _path_line(settings),
        f"ExecStart={backup_command(settings)}",
        # A backup must never slow the hub down.
        "Nice=10",
        "IOSchedulingClass=idle",
    ]
    return "\n".join(lines) + "\n"


def backup_timer_unit(settings: ServiceSettings) -> str:
    """`fgpu-hub-backup.timer`."""
    calendar, _ = BACKUP_SCHEDULES[settings.backup_every]
    lines = [
        "# Installed by `fgpu-hub install-service`; run it again to change this file.",
        "[Unit]",
        f"Description=Back up the fGPU hub {settings.backup_every}",
        "",
        "[Timer]",
        f"OnCalendar={calendar}",
        # A run missed while the machine was off happens at the next boot.
        "Persistent=true",
        "RandomizedDelaySec=10min",
        f"Unit={BACKUP_UNIT}",
        "",
        "[Install]",
        "WantedBy=timers.target",
    ]
    return "\n".join(lines) + "\n"


def units(settings: ServiceSettings) -> dict[str, str]:
    """Every unit file by name."""
    return {
        HUB_UNIT: hub_unit(settings),
        BACKUP_UNIT: backup_service_unit(settings),
        BACKUP_TIMER: backup_timer_unit(settings),
    }


def example_env_file(settings: ServiceSettings) -> str:
    """The site's settings file, every line commented out: the shipped defaults until edited."""
    return f"""\
# fGPU hub settings, read by {HUB_UNIT} and {BACKUP_UNIT} (systemd's EnvironmentFile: one
# NAME=value a line, no `export`). Uncomment and edit, then: systemctl restart fgpu-hub
# Readable by root alone: database URLs may hold passwords. See jupyterhub_config.py for all.

# Where students reach the hub.
#FGPU_HUB_IP=0.0.0.0
#FGPU_HUB_PORT=8000

# The two databases (default: SQLite files in {settings.state_dir}).
#FGPU_HUB_DB_URL=postgresql+psycopg://fgpu:PASSWORD@127.0.0.1:5432/jupyterhub
#FGPU_QUEUE_DB_URL=postgresql+psycopg://fgpu:PASSWORD@127.0.0.1:5432/fgpu_queue

# GPUs: fGPU units per GPU; simulated GPUs on a host without any (e.g. 1x8GiB).
#FGPU_UNITS_PER_GPU=2
#FGPU_SIMULATED_GPUS=

# Students expected at once (sizes the hub's spawn slots); idle sessions end after (seconds).
#FGPU_CLASS_SIZE=200
#FGPU_IDLE_TIMEOUT=3600

# Backups (default: backups/ in the state directory).
#FGPU_BACKUP_DIR=/srv/fgpu-backups

# Swarm mode: the manager's engine (scripts/swarm-lab up prints a lab's values).
#FGPU_ENGINE=swarm
#DOCKER_HOST=tcp://manager.example.org:2376
#DOCKER_TLS_VERIFY=1
#DOCKER_CERT_PATH=/etc/fgpu-hub/docker-tls
"""


def read_env_file(text: str) -> dict[str, str]:
    """The NAME=value lines of an environment file (comments and blank lines skipped, one level
    of quotes taken off), as systemd reads the simple ones."""
    found = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        name, value = (part.strip() for part in line.split("=", 1))
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        found[name] = value
    return found


def systemctl_commands() -> list[list[str]]:
    """What makes the units take effect: read them, then start the hub and the timer now and at
    every boot."""
    return [
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "--now", HUB_UNIT, BACKUP_TIMER],
    ]


def cron_command(settings: ServiceSettings) -> str:
    """The backup as a shell command for cron (which has no EnvironmentFile): the site's
    settings file is read first, when there is one."""
    env = shlex.quote(str(settings.env_file))
    return (
        f"cd {settings.state_dir} && set -a && {{ [ ! -r {env} ] || . {env}; }} && set +a"
        f" && {backup_command(settings)}"
    )


def cron_line(settings: ServiceSettings) -> str:
    _, schedule = BACKUP_SCHEDULES[settings.backup_every]
    return f"{schedule} {cron_command(settings)}"


def foreground_instructions(settings: ServiceSettings) -> str:
    """What to run where systemd does not run: the hub in the foreground, and the backups from
    cron."""
    state = settings.state_dir
    return f"""\
Run the hub in the foreground instead (state in {state}):
  mkdir -p {state} && cd {state} && {settings.repo}/scripts/up
or, once set up, the hub alone:
  cd {state} && {settings.jupyterhub} -f {settings.config}
(with the site's settings: set -a; . {settings.env_file}; set +a first).
Back it up {settings.backup_every} from cron (crontab -e as the hub's user):
  {cron_line(settings)}
"""
