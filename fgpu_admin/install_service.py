"""Install the hub as a systemd service, with a scheduled backup.

Writes /etc/systemd/system/fgpu-hub.service (the hub, in the state directory, with the site's
settings from /etc/fgpu-hub/env), fgpu-hub-backup.service and fgpu-hub-backup.timer (`fgpu-hub
backup --keep-days N`, daily by default), an example /etc/fgpu-hub/env when there is none (an
existing one is never touched), then runs `systemctl daemon-reload` and `systemctl enable --now`.
Where systemd is not running (a container, a machine booted without it) nothing is written,
unless --write-only asks for the files alone, and the foreground way is printed instead.
"""

from __future__ import annotations

import argparse
import grp
import os
import pwd
import subprocess
from pathlib import Path, PurePosixPath

from . import service_unit
from .cli import AdminError
from .service_unit import ServiceSettings

#: Exists only while systemd runs as the init system (sd_booted(3) checks the same).
SYSTEMD_RUNTIME_DIR = Path("/run/systemd/system")
REPO = Path(__file__).resolve().parent.parent
DEFAULT_CLASS_SIZE = 200
DEFAULT_PENDING_PER_USER = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        type=_absolute_path,
        metavar="DIR",
        default=service_unit.DEFAULT_STATE_DIR,
        help="the hub's state directory, made when missing (default: %(default)s)",
    )
    parser.add_argument(
        "--user",
        metavar="NAME",
        help="run the hub as this account, a member of `docker` (default: root)",
    )
    parser.add_argument(
        "--keep-days",
        type=_positive_int,
        metavar="N",
        default=14,
        help="delete backups older than this many days (default: %(default)s)",
    )
    parser.add_argument(
        "--backup-every",
        choices=sorted(service_unit.BACKUP_SCHEDULES),
        default="daily",
        help="how often the timer backs up (default: %(default)s, at 03:00)",
    )
    parser.add_argument(
        "--class-size",
        type=_positive_int,
        metavar="N",
        default=None,
        help="students expected at once, to size the open-file limit (default: FGPU_CLASS_SIZE"
        " from /etc/fgpu-hub/env or the environment, or 200)",
    )
    parser.add_argument(
        "--root",
        type=_absolute_path,
        metavar="DIR",
        default=None,
        help="write under this directory instead of / (a package's staging root, a test);"
        " implies --write-only",
    )
    parser.add_argument(
        "--write-only",
        action="store_true",
        help="write the files but run no systemctl (also where systemd is not running)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the units and write nothing")


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args, os.environ)
    if args.dry_run:
        print(dry_run_text(settings), end="")
        return 0
    write_only = args.write_only or args.root is not None
    if not write_only and not systemd_running():
        print(not_running_text(settings), end="")
        return 0
    root = Path(args.root or "/")
    for line in write_files(root, settings):
        print(line)
    if write_only:
        print("systemctl was not run (--write-only or --root): the units take effect after")
        print("  " + "; ".join(" ".join(c) for c in service_unit.systemctl_commands()))
        return 0
    for command in service_unit.systemctl_commands():
        run_systemctl(command)
    print(started_text(settings), end="")
    return 0


# -- the options ------------------------------------------------------------------------------


def _absolute_path(text: str) -> PurePosixPath:
    problem = service_unit.plain_path_problem(text, "the path")
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return PurePosixPath(os.path.normpath(text))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number is needed, not {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {value}")
    return value


def settings_from(args: argparse.Namespace, environ) -> ServiceSettings:
    """The units' settings from the options; a problem the admin must fix raises AdminError
    before anything is written."""
    problem = service_unit.plain_path_problem(REPO, "the repository")
    if problem:
        raise AdminError(problem)
    for needed in (REPO / ".venv" / "bin" / "jupyterhub", REPO / "jupyterhub_config.py"):
        if not needed.exists():
            raise AdminError(f"{needed} is missing: run {REPO}/scripts/up --setup-only first")
    groups: tuple[str, ...] = ()
    if args.user is not None:
        try:
            pwd.getpwnam(args.user)
        except KeyError:
            raise AdminError(
                f"no user named {args.user!r} on this machine: create it (adduser --system"
                f" {args.user}; adduser {args.user} docker), or leave --user out to run as root"
            ) from None
        groups = ("docker",) if _group_exists("docker") else ()
    return ServiceSettings(
        repo=PurePosixPath(REPO),
        state_dir=args.state_dir,
        user=args.user,
        groups=groups,
        keep_days=args.keep_days,
        backup_every=args.backup_every,
        open_files=service_unit.open_files_for_class(
            args.class_size or _class_size_from(_site_settings(args), environ),
            DEFAULT_PENDING_PER_USER,
        ),
    )


def _site_settings(args: argparse.Namespace) -> dict[str, str]:
    """The settings in the site's environment file, if it has one already."""
    path = under(Path(args.root or "/"), service_unit.ENV_FILE)
    try:
        return service_unit.read_env_file(path.read_text())
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise AdminError(f"cannot read {path}: {e.strerror}") from None


def _class_size_from(site: dict[str, str], environ) -> int:
    """FGPU_CLASS_SIZE as the hub will see it: the site's file first, then this environment."""
    text = site.get("FGPU_CLASS_SIZE") or environ.get("FGPU_CLASS_SIZE") or str(DEFAULT_CLASS_SIZE)
    try:
        return _positive_int(text)
    except argparse.ArgumentTypeError as e:
        raise AdminError(f"FGPU_CLASS_SIZE: {e}") from None


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def systemd_running() -> bool:
    return SYSTEMD_RUNTIME_DIR.is_dir()


# -- writing ----------------------------------------------------------------------------------


def under(root: Path, path: PurePosixPath) -> Path:
    """`path` inside `root` (the file system's prefix)."""
    return root / str(path).lstrip("/")


def write_files(root: Path, settings: ServiceSettings) -> list[str]:
    """Write the units, the example settings file (only where there is none) and the state
    directory; a line for each, saying what was done."""
    done = []
    unit_dir = under(root, service_unit.UNIT_DIR)
    unit_dir.mkdir(parents=True, exist_ok=True)
    for name, text in service_unit.units(settings).items():
        path = unit_dir / name
        verb = "updated" if path.exists() else "wrote"
        _write_atomically(path, text, 0o644)
        done.append(f"{verb} {path}")
    done.append(_write_env_example(under(root, settings.env_file), settings))
    state = under(root, settings.state_dir)
    if not state.exists():
        state.mkdir(parents=True, mode=0o750)
        done.append(f"made the state directory {state}")
    if settings.user is not None:
        account = pwd.getpwnam(settings.user)
        os.chown(state, account.pw_uid, account.pw_gid)
    return done


def _write_atomically(path: Path, text: str, mode: int) -> None:
    partial = path.with_name(f".{path.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    os.chmod(partial, mode)
    os.replace(partial, path)


def _write_env_example(path: Path, settings: ServiceSettings) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # Root's alone: database URLs in it may hold passwords.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return f"kept the site's settings in {path}"
    with os.fdopen(fd, "w") as file:
        file.write(service_unit.example_env_file(settings))
    return f"wrote an example {path} (every line commented out: edit it)"


def run_systemctl(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise AdminError(f"{' '.join(command)} failed: {done.stderr.strip() or done.stdout}")


# -- what is said -----------------------------------------------------------------------------


def dry_run_text(settings: ServiceSettings) -> str:
    parts = [
        f"# ---- {service_unit.UNIT_DIR / name} ----\n{text}"
        for name, text in service_unit.units(settings).items()
    ]
    parts.append(
        f"# ---- {settings.env_file} (written only where there is none) ----\n"
        + service_unit.example_env_file(settings)
    )
    return "\n".join(parts)


def not_running_text(settings: ServiceSettings) -> str:
    return (
        f"systemd is not running on this machine ({SYSTEMD_RUNTIME_DIR} does not exist: a"
        " container, or a machine booted without systemd), so no service was installed and"
        " nothing was written. (--write-only writes the units anyway, for a machine that boots"
        " with systemd.)\n" + service_unit.foreground_instructions(settings)
    )


def started_text(settings: ServiceSettings) -> str:
    return f"""\
The hub runs as {service_unit.HUB_UNIT}, and starts at every boot:
  systemctl status|start|stop|restart fgpu-hub
  journalctl -u fgpu-hub -f
Backups: {settings.backup_every}, kept {settings.keep_days} days
  (systemctl list-timers fgpu-hub-backup; journalctl -u fgpu-hub-backup).
Settings: {settings.env_file}, then systemctl restart fgpu-hub.
"""
