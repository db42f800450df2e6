"""Check the hub's parts and say what is wrong and how to fix it (exit 1 on a failure).

Run it in the hub's state directory, with the hub's environment (`set -a; . /etc/fgpu-hub/env`).
It checks: the Docker engine (and, with FGPU_ENGINE=swarm, the Swarm's nodes, and, given an admin's
token in FGPU_ADMIN_TOKEN, that every node's engine keeps sessions apart); the hub's and the
queue's databases (FGPU_HUB_DB_URL, FGPU_QUEUE_DB_URL; the queue's schema against this version's);
free space on the engine's data root and in the backup folder; that the catalog's images are on
the engine; the GPUs (NVML) and HAMi-core's library; the clock against the engine's; and, when
the hub runs, the queue service's own health (`api/health`). It changes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import requests
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import sessionmaker

from fgpu_shared.engine_client import api_client_from_env
from fgpu_shared.units import format_size, parse_size
from fgpu_spawner.gpu_sharing import GpuPaths
from image_catalog import load_catalog
from queue_service.engine import inventory
from queue_service.engine.frozen_containers import CGROUP_ROOT, freezer_file, read_frozen
from queue_service.engine.node_reports import DAEMON_FIX
from queue_service.engine.session_containers import SESSION_LABEL
from queue_service.store import state_dir
from queue_service.store.db import alembic_config, make_engine
from queue_service.store.images import ImageStore

from .backup import BACKUP_DIR_ENV, DEFAULT_BACKUP_DIR

OK, WARN, FAIL = "ok", "warn", "fail"
_RANK = {OK: 0, WARN: 1, FAIL: 2}
#: Where the hub's spawner looks for HAMi-core by default (c.FGPUSpawner.hami_library_path).
DEFAULT_HAMI_LIBRARY = GpuPaths.hami_library_path
#: ... and its shrreg-tool, which starts every hami session (c.FGPUSpawner.hami_shrreg_tool_path).
DEFAULT_HAMI_SHRREG_TOOL = GpuPaths.hami_shrreg_tool_path
NO_ENGINE = "not checked: the Docker engine does not answer"
#: An admin's hub API token, for what only admins may read (the nodes' reports). From the
#: environment, not an argument: a command line is visible to every user of the host.
ADMIN_TOKEN_ENV = "FGPU_ADMIN_TOKEN"


@dataclass(frozen=True)
class Result:
    name: str
    status: str
    message: str
    #: What to do about it (empty when all is well).
    fix: str = ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--min-free-docker",
        type=_size,
        metavar="SIZE",
        default="10G",
        help="least free space on the engine's data root (default: %(default)s)",
    )
    parser.add_argument(
        "--min-free-backup",
        type=_size,
        metavar="SIZE",
        default="5G",
        help="least free space in the backup folder (default: %(default)s)",
    )
    parser.add_argument(
        "--max-clock-skew",
        type=_seconds,
        metavar="SECONDS",
        default=5.0,
        help="seconds this clock may differ from the engine's (default: %(default)s)",
    )
    parser.add_argument(
        "--gpu-sharing",
        choices=("hami", "mig", "mps", "none", "simulated"),
        default=None,
        help="the spawner's gpu_sharing (default: simulated with FGPU_SIMULATED_GPUS, else hami,"
        " as the shipped config has it)",
    )
    parser.add_argument(
        "--hami-library",
        metavar="PATH",
        default=DEFAULT_HAMI_LIBRARY,
        help="HAMi-core's libvgpu.so on this host (default: %(default)s)",
    )
    parser.add_argument(
        "--hami-shrreg-tool",
        metavar="PATH",
        default=DEFAULT_HAMI_SHRREG_TOOL,
        help="HAMi-core's shrreg-tool on this host, which starts every hami session"
        " (default: %(default)s)",
    )
    parser.add_argument(
        "--hub-url",
        metavar="URL",
        default=None,
        help="the hub, to ask the queue service's health (default: http://$FGPU_HUB_IP:"
        "$FGPU_HUB_PORT, or 127.0.0.1:8000)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        metavar="SECONDS",
        default=10.0,
        help="seconds to wait for each answer (default: %(default)s)",
    )


def _size(value: str) -> int:
    try:
        return parse_size(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of seconds is needed, not {value!r}") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {value}")
    return seconds


def run(args: argparse.Namespace) -> int:
    results = run_checks(args, os.environ)
    if args.json:
        print(json.dumps(as_json(results), indent=2))
    else:
        print(format_report(results), end="")
    return exit_code(results)


def run_checks(args: argparse.Namespace, environ: Mapping[str, str]) -> list[Result]:
    engine = EngineFacts.read(args.timeout)
    swarm = environ.get("FGPU_ENGINE", "docker") == "swarm"
    sharing = args.gpu_sharing or ("simulated" if environ.get("FGPU_SIMULATED_GPUS") else "hami")
    results = [check_engine(engine, environ)]
    if swarm:
        results.append(check_swarm_nodes(engine))
        hub = args.hub_url or default_hub_url(environ)
        results.append(check_node_daemons(hub, environ.get(ADMIN_TOKEN_ENV, ""), args.timeout))
    hub_url, queue_url = state_dir.hub_db_url(environ), state_dir.queue_db_url(environ)
    results += [
        check_hub_db(hub_url, args.timeout),
        check_queue_db(queue_url, args.timeout),
        check_docker_disk(engine, args.min_free_docker, environ.get("DOCKER_HOST")),
        check_frozen_sessions(engine, environ.get("DOCKER_HOST")),
        check_backup_disk(backup_dir(environ), args.min_free_backup),
        check_images(engine, catalog_images(queue_url, environ), swarm),
        check_gpus(environ, swarm),
        check_hami(sharing, args.hami_library, args.hami_shrreg_tool),
        check_clock(engine, args.max_clock_skew),
        check_service_health(args.hub_url or default_hub_url(environ), args.timeout),
    ]
    return results


# -- the report (pure) --------------------------------------------------------------------------


def overall(results: Iterable[Result]) -> str:
    return max((r.status for r in results), key=_RANK.__getitem__, default=OK)


def exit_code(results: Iterable[Result]) -> int:
    return 1 if overall(results) == FAIL else 0


def format_report(results: list[Result]) -> str:
    """One line per check (its fix on the next line), then a summary."""
    width = max((len(r.name) for r in results), default=0)
    lines = []
    for result in results:
        label = {OK: "ok", WARN: "WARN", FAIL: "FAIL"}[result.status]
        lines.append(f"{label:<4}  {result.name:<{width}}  {result.message}")
        if result.fix and result.status != OK:
            lines.append(f"{'':<4}  {'':<{width}}  fix: {result.fix}")
    counts = {s: sum(r.status == s for r in results) for s in (OK, WARN, FAIL)}
    lines.append(
        f"{len(results)} checks: {counts[OK]} ok, {counts[WARN]} warnings, {counts[FAIL]} failed"
    )
    return "\n".join(lines) + "\n"


def as_json(results: list[Result]) -> dict:
    return {"status": overall(results), "checks": [asdict(r) for r in results]}


# -- the engine ---------------------------------------------------------------------------------


@dataclass
class EngineFacts:
    """What the engine said, read once: `docker version` and `docker info`, or why not."""

    client: object | None
    version: Mapping | None
    info: Mapping | None
    error: str | None
    #: This machine's clock halfway through the `info` call.
    local_time: float = 0.0

    @classmethod
    def read(cls, timeout: float) -> EngineFacts:
        try:
            client = api_client_from_env(timeout=int(max(timeout, 1)))
            version = client.version()
            before = time.time()
            info = client.info()
            after = time.time()
        except Exception as e:
            return cls(None, None, None, _first_line(e))
        return cls(client, version, info, None, (before + after) / 2)


def engine_address(environ: Mapping[str, str]) -> str:
    return environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def check_engine(engine: EngineFacts, environ: Mapping[str, str]) -> Result:
    where = engine_address(environ)
    if engine.error is not None:
        return Result(
            "engine",
            FAIL,
            f"no Docker engine answers at {where}: {engine.error}",
            "start it (systemctl start docker, or dockerd), or point DOCKER_HOST at the engine"
            " in /etc/fgpu-hub/env",
        )
    version = engine.version or {}
    return Result(
        "engine",
        OK,
        f"Docker {version.get('Version', '?')} (API {version.get('ApiVersion', '?')}) at {where}",
    )


def check_swarm_nodes(engine: EngineFacts) -> Result:
    if engine.client is None:
        return Result("swarm nodes", WARN, NO_ENGINE)
    try:
        nodes = engine.client.nodes()
    except Exception as e:
        return Result(
            "swarm nodes",
            FAIL,
            f"the engine lists no Swarm nodes: {_first_line(e)}",
            "with FGPU_ENGINE=swarm, DOCKER_HOST must name a Swarm manager",
        )
    return swarm_nodes_result(nodes)


def swarm_nodes_result(nodes: list[Mapping]) -> Result:
    """Ready, down and drained nodes (managers that run no sessions apart); a bad fgpu.* label
    that the queue service would refuse is a failure too."""
    workers = [n for n in nodes if _labels(n).get(inventory.LABEL_ROLE) != inventory.ROLE_MANAGER]
    down = [_hostname(n) for n in workers if (n.get("Status") or {}).get("State") != "ready"]
    drained = [
        _hostname(n)
        for n in workers
        if (n.get("Status") or {}).get("State") == "ready"
        and (n.get("Spec") or {}).get("Availability") != "active"
    ]
    ready = len(workers) - len(down) - len(drained)
    try:
        inventory.swarm_nodes(nodes)
    except ValueError as e:
        return Result("swarm nodes", FAIL, str(e), "fix the node's label (docker node update)")
    summary = f"{len(workers)} node(s): {ready} ready"
    if down:
        summary += f", {len(down)} down ({', '.join(down)})"
    if drained:
        summary += f", {len(drained)} drained or paused ({', '.join(drained)})"
    if not ready:
        return Result("swarm nodes", FAIL, summary + "; no node takes sessions", _SWARM_FIX)
    if down or drained:
        return Result("swarm nodes", WARN, summary, _SWARM_FIX)
    return Result("swarm nodes", OK, summary)


_SWARM_FIX = (
    "start the node's engine, or `docker node update --availability active NODE` once it is fit;"
    " a node that is gone for good: docker node rm NODE"
)


def _labels(node: Mapping) -> Mapping:
    return (node.get("Spec") or {}).get("Labels") or {}


def _hostname(node: Mapping) -> str:
    return (node.get("Description") or {}).get("Hostname") or node.get("ID", "?")


# -- the databases ------------------------------------------------------------------------------


def safe_url(url: str) -> str:
    """The URL without its password, for a report."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "(unreadable URL)"


def sqlite_file(url: str) -> Path | None:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _connect_problem(name: str, url: str, env: str, error: Exception) -> Result:
    return Result(
        name,
        FAIL,
        f"cannot read {safe_url(url)}: {_first_line(error)}",
        f"check that the database server runs and that {env} names it (in /etc/fgpu-hub/env);"
        " a damaged SQLite file: fgpu-hub restore from the last backup",
    )


def _missing_sqlite(name: str, path: Path, who: str) -> Result:
    return Result(
        name,
        WARN,
        f"no database at {path.resolve()} yet",
        f"run this in the hub's state directory; {who} makes it at its first start",
    )


def read_revision(url: str, timeout: float) -> str | None:
    """The alembic revision the database is at (None: no schema yet). Raises on an unreadable
    database; never creates one (SQLite files are checked to exist first)."""
    engine = create_engine(url, connect_args=_connect_args(url, timeout))
    try:
        with engine.connect() as connection:
            # SQLite reads its file only when asked for the schema: a file that is not a
            # database fails here, not at connect.
            probe = "SELECT count(*) FROM sqlite_master" if sqlite_file(url) else "SELECT 1"
            connection.execute(text(probe))
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def _connect_args(url: str, timeout: float) -> dict:
    backend = make_url(url).get_backend_name()
    if backend == "postgresql":
        return {"connect_timeout": int(max(timeout, 1))}
    if backend == "sqlite":
        return {"timeout": timeout}
    return {}


def _revision_or_problem(name: str, url: str, env: str, owner: str, timeout: float):
    """The database's alembic revision (None: no schema yet), or the Result saying why it
    cannot be read: a missing SQLite file, or a database that does not answer."""
    path = sqlite_file(url)
    if path is not None and not path.exists():
        return _missing_sqlite(name, path, owner)
    try:
        return read_revision(url, timeout)
    except Exception as e:
        return _connect_problem(name, url, env, e)


def check_hub_db(url: str, timeout: float) -> Result:
    revision = _revision_or_problem("hub db", url, state_dir.HUB_DB_ENV, "the hub", timeout)
    if isinstance(revision, Result):
        return revision
    return Result("hub db", OK, f"{safe_url(url)} answers (schema {revision or 'not made yet'})")


def _migrations() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config("sqlite://"))


def queue_head() -> str:
    """The queue schema this version of the service runs on."""
    return _migrations().get_current_head()


def known_revisions() -> set[str]:
    return {revision.revision for revision in _migrations().walk_revisions()}


def check_queue_db(url: str, timeout: float) -> Result:
    revision = _revision_or_problem(
        "queue db", url, state_dir.QUEUE_DB_ENV, "the queue service", timeout
    )
    if isinstance(revision, Result):
        return revision
    return revision_result(safe_url(url), revision, queue_head(), known_revisions())


def revision_result(where: str, revision: str | None, head: str, known: set[str]) -> Result:
    if revision == head:
        return Result("queue db", OK, f"{where} answers, schema {revision} (this version's)")
    if revision is None:
        return Result(
            "queue db",
            WARN,
            f"{where} answers but holds no schema yet",
            "the queue service makes it at its first start",
        )
    if revision in known:
        return Result(
            "queue db",
            WARN,
            f"{where} is at schema {revision}, this version's is {head}",
            "start the hub: the queue service upgrades it (after a backup)",
        )
    return Result(
        "queue db",
        FAIL,
        f"{where} is at schema {revision}, which this version does not know (a newer one?)",
        "run the version of the hub that wrote it, or restore a backup made by this one",
    )


# -- disk space ---------------------------------------------------------------------------------


def backup_dir(environ: Mapping[str, str]) -> Path:
    """Where `fgpu-hub backup` writes, from the state directory."""
    return Path(environ.get(BACKUP_DIR_ENV) or DEFAULT_BACKUP_DIR)


def disk_result(name: str, path: Path, free: int, minimum: int, fix: str) -> Result:
    message = f"{format_size(free)} free on {path} (at least {format_size(minimum)} wanted)"
    if free < minimum:
        return Result(name, FAIL, message, fix)
    return Result(name, OK, message)


def free_bytes(path: Path) -> tuple[Path, int]:
    """Free space for `path`, or for its nearest existing parent while it is not made yet."""
    path = path.resolve()
    while not path.exists():
        path = path.parent
    return path, shutil.disk_usage(path).free


def engine_is_local(docker_host: str | None) -> bool:
    """Whether the engine runs on this machine: its socket, or a TCP address of this machine's
    own (which only then can a socket bind to). Its data root's path means nothing elsewhere."""
    if not docker_host or docker_host.startswith("unix://"):
        return True
    host = urlsplit(docker_host).hostname
    try:
        for family, _, _, _, address in socket.getaddrinfo(host, None):
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((address[0], 0))
    except OSError:
        return False
    return True


def check_frozen_sessions(
    engine: EngineFacts, docker_host: str | None = None, cgroup_root: Path = CGROUP_ROOT
) -> Result:
    """Session containers that are paused, or whose cgroup freezer reads frozen on this machine:
    such a session answers nothing, and the engine's calls about it hang (the queue service
    thaws one after a minute; see queue_service/engine/frozen_containers.py)."""
    if engine.client is None:
        return Result("frozen sessions", WARN, NO_ENGINE)
    try:
        found = engine.client.containers(
            filters={"label": SESSION_LABEL, "status": ["running", "paused"]}
        )
    except Exception as e:
        return Result("frozen sessions", WARN, f"the engine did not list the sessions: {e}")
    local = engine_is_local(docker_host)
    frozen = []
    for container in found:
        path = freezer_file(container["Id"], cgroup_root) if local else None
        if container.get("State") == "paused" or (path is not None and read_frozen(path)):
            session = (container.get("Labels") or {}).get(SESSION_LABEL, "?")
            frozen.append(f"session {session} (container {container['Id'][:12]})")
    if not frozen:
        return Result("frozen sessions", OK, f"none of {len(found)} session container(s)")
    return Result(
        "frozen sessions",
        WARN,
        "frozen: " + ", ".join(frozen),
        "the queue service thaws a session frozen for a minute; if one stays frozen, run"
        " `docker unpause ID`, or write THAWED into its freezer.state under"
        f" {cgroup_root}/freezer/docker/ID/",
    )


def check_docker_disk(engine: EngineFacts, minimum: int, docker_host: str | None = None) -> Result:
    if engine.info is None:
        return Result("docker disk", WARN, NO_ENGINE)
    root = Path(engine.info.get("DockerRootDir") or "/var/lib/docker")
    if not engine_is_local(docker_host) or not root.exists():
        return Result(
            "docker disk",
            WARN,
            f"the engine's data root {root} is not on this machine: not checked",
            "run fgpu-hub doctor on the engine's machine",
        )
    where, free = free_bytes(root)
    return disk_result(
        "docker disk",
        where,
        free,
        minimum,
        "remove unused images (docker image prune) and stopped containers, or grow the disk",
    )


def check_backup_disk(folder: Path, minimum: int) -> Result:
    where, free = free_bytes(folder)
    return disk_result(
        "backup disk",
        where,
        free,
        minimum,
        "delete old backups (fgpu-hub backup --keep-days N), or set FGPU_BACKUP_DIR to a"
        " larger disk",
    )


# -- images -------------------------------------------------------------------------------------


def catalog_images(queue_url: str, environ: Mapping[str, str]) -> dict[str, str]:
    """Catalog name → image reference of every image students may be offered: the service's
    catalog (instructors' edits included) when its database is at this version's schema, else
    the catalog file that seeds it."""
    try:
        path = sqlite_file(queue_url)
        if (path is None or path.exists()) and read_revision(queue_url, 5) == queue_head():
            return _stored_catalog(queue_url)
    except Exception:
        pass  # the queue db check says what is wrong with it
    catalog = load_catalog(environ.get("FGPU_CATALOG_PATH") or None)
    return {image.name: image.image for image in catalog.images if not image.hidden}


def _stored_catalog(url: str) -> dict[str, str]:
    engine = make_engine(url)
    try:
        views = ImageStore(sessionmaker(engine)).all()
    finally:
        engine.dispose()
    return {view["name"]: view["image"] for view in views if not view.get("hidden")}


def _with_tag(reference: str) -> str:
    last = reference.rsplit("/", 1)[-1]
    return reference if ":" in last or "@" in last else reference + ":latest"


def images_result(wanted: Mapping[str, str], present: set[str], swarm: bool) -> Result:
    missing = {name: ref for name, ref in wanted.items() if _with_tag(ref) not in present}
    if not missing:
        return Result("images", OK, f"all {len(wanted)} catalog images are on the engine")
    listed = ", ".join(f"{name} ({ref})" for name, ref in sorted(missing.items()))
    message = f"{len(missing)} of {len(wanted)} catalog images are not on the engine: {listed}"
    if swarm:
        return Result(
            "images",
            WARN,
            message + " (in Swarm mode the nodes pull them from FGPU_SWARM_REGISTRY)",
            "check that the registry holds them",
        )
    return Result(
        "images",
        FAIL,
        message,
        "build them (scripts/up --setup-only builds the shipped ones; fgpu-image build), or"
        " hide them on the Images page",
    )


def check_images(engine: EngineFacts, wanted: Mapping[str, str], swarm: bool) -> Result:
    if engine.client is None:
        return Result("images", WARN, NO_ENGINE)
    images = engine.client.images()
    present = {
        name
        for image in images
        for name in (*(image.get("RepoTags") or ()), *(image.get("RepoDigests") or ()))
    }
    return images_result(wanted, present, swarm)


# -- GPUs ---------------------------------------------------------------------------------------


def check_gpus(environ: Mapping[str, str], swarm: bool, read: Callable | None = None) -> Result:
    if swarm:
        return Result("gpus", OK, "Swarm mode: each node's GPUs come from its labels and agent")
    simulated = environ.get("FGPU_SIMULATED_GPUS")
    try:
        gpus = (read or inventory.read_nvml_gpus)()
    except Exception as e:
        return Result(
            "gpus",
            FAIL,
            f"NVML cannot read this host's GPUs: {_first_line(e)}",
            "check the NVIDIA driver (nvidia-smi); a reboot after a driver upgrade often helps",
        )
    if gpus:
        names = ", ".join(sorted({gpu.name for gpu in gpus}))
        return Result("gpus", OK, f"{len(gpus)} GPU(s) through NVML: {names}")
    if simulated:
        return Result(
            "gpus",
            WARN,
            f"no NVIDIA GPU here (NVML not found); the hub simulates {simulated}",
            "fine for a demo or tests; a GPU host needs the NVIDIA driver",
        )
    return Result(
        "gpus",
        FAIL,
        "no NVIDIA GPU here (NVML not found) and FGPU_SIMULATED_GPUS is not set",
        "install the NVIDIA driver (see the GPU node guide), or set FGPU_SIMULATED_GPUS (e.g."
        " 1x8GiB) in /etc/fgpu-hub/env for a host without GPUs",
    )


def check_hami(sharing: str, library: str, tool: str = DEFAULT_HAMI_SHRREG_TOOL) -> Result:
    """HAMi-core's library and its shrreg-tool: without either, the engine refuses every `hami`
    session (both are read-only bind mounts)."""
    if sharing != "hami":
        return Result("hami-core", OK, f"not needed: gpu_sharing is {sharing}")
    fix = (
        "build and install HAMi-core on this host (scripts/gpu-node, the GPU node guide), or set"
        " c.FGPUSpawner.hami_library_path and hami_shrreg_tool_path (and --hami-library,"
        " --hami-shrreg-tool here) to where they are"
    )
    for what, path, kind in (
        ("library", Path(library), "a shared library"),
        ("shrreg-tool", Path(tool), "a program"),
    ):
        problem = _library_problem(path, kind)
        if not problem and what == "shrreg-tool" and not os.access(path, os.X_OK):
            problem = "is not executable"
        if problem:
            message = f"HAMi-core's {what} {path} {problem}, and gpu_sharing is hami"
            return Result("hami-core", FAIL, message, fix)
    return Result("hami-core", OK, f"HAMi-core's library is at {library}, its tool at {tool}")


def _library_problem(path: Path, kind: str = "a shared library") -> str | None:
    if not path.is_file():
        return "does not exist"
    try:
        with path.open("rb") as file:
            if file.read(4) != b"\x7fELF":
                return f"is not {kind}"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    return None


# -- the clock ----------------------------------------------------------------------------------


def parse_engine_time(value: str) -> float:
    """`docker info`'s SystemTime (RFC 3339 with nanoseconds) as a Unix time."""
    head, _, rest = value.partition(".")
    if rest:
        zone = rest.lstrip("0123456789")
        digits = rest[: len(rest) - len(zone)]
        value = f"{head}.{digits[:6]}{zone}"
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def clock_result(engine_time: float, local_time: float, max_skew: float) -> Result:
    skew = local_time - engine_time
    message = f"this clock is {abs(skew):.1f} s {'ahead of' if skew > 0 else 'behind'} the engine's"
    if abs(skew) > max_skew:
        return Result(
            "clock",
            WARN,
            message + f" (more than {max_skew:g} s)",
            "keep both clocks in time (systemd-timesyncd or chrony): sessions' ages, idle ends"
            " and tokens depend on it",
        )
    return Result("clock", OK, message)


def check_clock(engine: EngineFacts, max_skew: float) -> Result:
    if engine.info is None or not engine.info.get("SystemTime"):
        return Result("clock", WARN, NO_ENGINE)
    try:
        engine_time = parse_engine_time(engine.info["SystemTime"])
    except ValueError:
        return Result("clock", WARN, f"unreadable engine time {engine.info['SystemTime']!r}")
    return clock_result(engine_time, engine.local_time, max_skew)


# -- the running service ------------------------------------------------------------------------


def default_hub_url(environ: Mapping[str, str]) -> str:
    """The hub where the shipped config makes it listen (FGPU_HUB_IP, FGPU_HUB_PORT)."""
    host = environ.get("FGPU_HUB_IP") or "127.0.0.1"
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{environ.get('FGPU_HUB_PORT') or '8000'}"


def check_service_health(hub_url: str, timeout: float) -> Result:
    """The queue service's own `api/health`, when the hub runs (it answers anyone the status)."""
    url = hub_url.rstrip("/") + "/services/queue/api/health"
    try:
        response = requests.get(url, timeout=timeout)
        status = response.json().get("status")
    except requests.RequestException:
        return Result(
            "queue service",
            WARN,
            f"no hub answers at {hub_url}: not checked",
            "start the hub (systemctl start fgpu-hub), or give --hub-url",
        )
    except ValueError:
        return Result("queue service", WARN, f"{url} answered {response.status_code}, not JSON")
    if status == "ok":
        return Result("queue service", OK, f"healthy ({url})")
    details = "; ask it with an admin's token for the checks"
    if status == "degraded":
        return Result("queue service", WARN, f"degraded ({url}){details}", _SERVICE_FIX)
    return Result("queue service", FAIL, f"{status or 'no status'} ({url}){details}", _SERVICE_FIX)


def check_node_daemons(hub_url: str, token: str, timeout: float) -> Result:
    """Whether every Swarm node's engine keeps sessions apart, as its agent reports it."""
    if not token:
        return Result(
            "node daemons",
            WARN,
            "not checked: the nodes' reports are for admins",
            f"set {ADMIN_TOKEN_ENV} to an admin's API token (the hub's Token page)",
        )
    url = hub_url.rstrip("/") + "/services/queue/api/nodes"
    try:
        response = requests.get(url, headers={"Authorization": f"token {token}"}, timeout=timeout)
        response.raise_for_status()
        nodes = response.json()["nodes"]
    except (requests.RequestException, ValueError, KeyError) as e:
        return Result("node daemons", WARN, f"not checked: {url}: {_first_line(e)}")
    return node_daemons_result(nodes)


def node_daemons_result(nodes: list[Mapping]) -> Result:
    """The nodes' reports (`api/nodes`): a fresh one with an isolation problem fails."""
    fresh = [node for node in nodes if not node.get("stale")]
    # A service older than the field: every node is unknown.
    problems = {n["node"]: n.get("isolation_problems", ["isolation not reported"]) for n in fresh}
    bad = [f"{node}: {', '.join(found)}" for node, found in problems.items() if found]
    if bad:
        return Result("node daemons", FAIL, "; ".join(bad), DAEMON_FIX)
    if not fresh:
        return Result("node daemons", WARN, "no node agent has reported lately: not checked")
    return Result(
        "node daemons", OK, f"{len(fresh)} nodes keep sessions apart (icc off, no-new-privileges)"
    )


_SERVICE_FIX = "read the hub's log (journalctl -u fgpu-hub) for the queue service's messages"


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
