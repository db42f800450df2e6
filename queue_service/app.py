"""`python -m queue_service`: the hub-managed `queue` service (docs/source/explanation/contracts.md, contract 4).

JupyterHub starts it with JUPYTERHUB_SERVICE_URL, _PREFIX, _API_URL and _API_TOKEN in its
environment. Everything else is configured as `c.QueueService.<trait> = <value>` in the hub's
jupyterhub_config.py, which the hub hands over in FGPU_SITE_CONFIG as it starts the service
(fgpu_shared/site_config.py; loaded in `initialize`), and `--QueueService.<trait>=<value>` on its
command line wins over it.

`QueueService.build` makes the service in named steps (`init_db`, `init_engine`, `init_queue`...;
docs/source/explanation/architecture.md, "Start-up"); what differs between one engine and a Swarm
is asked of the engine backend it picks once (engine/backend.py).
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import functools
import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

from sqlalchemy.exc import OperationalError
from tornado import web
from traitlets import (
    Bool,
    CaselessStrEnum,
    Dict,
    Float,
    Integer,
    List,
    TraitError,
    Unicode,
    default,
    validate,
)
from traitlets.config import Application

from fgpu_shared import site_config
from fgpu_shared.registry_auth import RegistryAuthError, read_registry_auth
from fgpu_shared.units import parse_amount, parse_size
from image_catalog import load_catalog
from image_catalog.build import heavy_names
from image_catalog.launch_options import SESSION_LIMITS
from queue_service import handlers
from queue_service.core import resource_model
from queue_service.core.presets import parse_presets
from queue_service.engine import inventory
from queue_service.engine.backend import (
    ENTRY_POINTS,
    SHIPPED,
    EngineBackend,
    EngineClass,
    ServiceHooks,
)
from queue_service.engine.client import Engine
from queue_service.engine.container_calls import ContainerCalls, ContainerLocks
from queue_service.engine.node_credentials import CREDENTIALS_FILE, NodeCredentials
from queue_service.engine.node_identity import NodeIdentity
from queue_service.engine.node_reports import NodeReports
from queue_service.folders import Folders
from queue_service.store.db import open_database
from queue_service.store.db_upgrade import DEFAULT_KEPT, BackupSettings, UpgradeRefused, safe_url
from queue_service.store.deployment import deployment_id
from queue_service.store.folder_files import FolderFiles
from queue_service.store.folders import FolderStore
from queue_service.store.history import History
from queue_service.store.images import ImageStore
from queue_service.store.mount_flags import missing_flags
from queue_service.store.project_quotas import ProjectQuotas
from queue_service.store.ssh_keys import SSHKeyStore
from queue_service.store.state_dir import queue_db_url, with_driver
from queue_service.store.usage import UsageBook
from queue_service.store.utilization import UtilizationLog, cluster_figures

from .automatic_ends import AutomaticEnds
from .handlers.base import STREAM_PIECE_BYTES
from .handlers.folders import CHUNK_BYTES
from .health import HealthMonitor, containers_check, node_daemons_check, select_one
from .hub_client import HubClient
from .image_builds import BackgroundBuilds
from .instructor_visits import VisitCloser
from .job_ends import JobEnds
from .job_files import HomeSettings, JobFiles
from .jobs import JOBS_WAITING_PER_USER, JobRules
from .launches import Launcher
from .queue import QueueManager
from .queue_pass import SchedulerSettings
from .quotas import DEFAULT_USER_QUOTA, QuotaBook
from .reconciler import Reconciler
from .server_removal import ServerRemover
from .session_end_notice import EndNotice, end_notice_key
from .ssh.file_areas import FileAreas
from .ssh.host_key import HOST_KEY_FILE
from .ssh.hub_logins import TokenLogins
from .ssh.login_throttle import LoginThrottle
from .ssh.server import SSHService, cipher_names
from .ssh.shell import Shells

#: Largest body the server reads at all: an upload's chunk and a little more (each handler
#: refuses more than its own cap with a message: 64 KiB, or the chunk for uploads).
MAX_BODY_BACKSTOP = CHUNK_BYTES + (1 << 20)
#: What a spawn hears before the engine has answered once since the service started.
ENGINE_NOT_YET = (
    "The Docker engine has not answered yet, so no session can start now. Try again in a "
    "minute; the hub recovers by itself once the engine is back."
)
#: How long a new service waits for the port its predecessor (ending with its hub) still holds.
BIND_RETRY_SECONDS = 15.0
#: Seconds between checks that the hub which started the service is still there.
PARENT_CHECK_SECONDS = 1.0
_PR_SET_PDEATHSIG = 1


def scheduler_node(node: inventory.NodeInfo) -> resource_model.Node:
    """The scheduler's view of a node; GPUs in NVML order, the order the container sees them in."""
    gpus = sorted(node.gpus, key=lambda gpu: gpu.index)
    return resource_model.Node(
        node.name,
        node.resource_group,
        node.cpu,
        node.mem,
        tuple(resource_model.Gpu(gpu.uuid, gpu.memory_bytes, gpu.sm_count) for gpu in gpus),
    )


def settings_of(configurable, names) -> dict:
    """The settings `names` as `configurable` holds them, as JSON (a class as its name)."""
    return json.loads(json.dumps({n: getattr(configurable, n) for n in sorted(names)}, default=str))


def _session_limit(key: str, value):
    if key == "default_image_name":
        return str(value or "")
    if key.startswith("mem_"):
        return parse_size(value)
    return parse_amount(value, zero_ok=True)


def read_or_create_secret(path: str) -> bytes:
    """The secret in `path`, made (32 random bytes, readable by the service's user alone) if
    the file does not exist; a file others may read is refused rather than trusted."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if os.stat(path).st_mode & 0o077:
            raise SystemExit(f"{path} is readable by others: chmod 600 {path}") from None
        with open(path, "rb") as file:
            return bytes.fromhex(file.read().decode().strip())
    secret = os.urandom(32)
    with os.fdopen(fd, "w") as file:
        file.write(secret.hex())
    return secret


class QueueService(Application):
    name = "fgpu-queue"
    description = "The fGPU hub's queue: grants, accounting and quotas."

    db_url = Unicode(
        config=True,
        help="""
        SQLAlchemy URL of the service's own database (SQLite or PostgreSQL). Default:
        FGPU_QUEUE_DB_URL from the environment (where `ps` does not show a password), else
        `sqlite:///fgpu_queue.sqlite` in the state directory. A `postgresql://` URL is read with
        psycopg 3.

        Example::

            c.QueueService.db_url = "postgresql://fgpu@db.example.org/fgpu_queue"
        """,
    )
    upgrade_backup_dir = Unicode(
        "",
        config=True,
        help="""
        Where the backup taken before a schema upgrade of the database goes. Empty: beside a
        SQLite file, and in the state directory for a PostgreSQL dump (`pg_dump -Fc`).

        Example::

            c.QueueService.upgrade_backup_dir = "/var/backups/fgpu-queue"
        """,
    )
    upgrade_backups_kept = Integer(
        DEFAULT_KEPT,
        config=True,
        help="""
        Upgrade backups of the database kept; older ones are deleted after a new one.

        Example::

            c.QueueService.upgrade_backups_kept = 5
        """,
    )
    upgrade_without_backup = Bool(
        False,
        config=True,
        help="""
        Upgrade the database even when no backup can be taken first (`pg_dump` missing or
        failing, a backup folder it cannot write). Off: the service refuses to start, and says
        why, rather than migrate a database it could not restore.

        Example::

            c.QueueService.upgrade_without_backup = True
        """,
    )
    units_per_gpu = Integer(
        1,
        config=True,
        help="""
        fGPU units in one physical GPU. The hub hands the service the spawner's
        `FGPUSpawner.units_per_gpu`: set it there, once, for both.

        Example::

            c.FGPUSpawner.units_per_gpu = 4
        """,
    )
    engine_class = EngineClass(
        SHIPPED["docker"],
        klass=EngineBackend,
        entry_point_group=ENTRY_POINTS,
        config=True,
        help="""
        Where sessions run, as the engine backend that handles them: `docker`, the one engine
        DOCKER_HOST names (single host; `c.DockerEngine.…` configures it); `swarm`, the Docker
        Swarm whose manager DOCKER_HOST names (`c.SwarmEngine.…`). In Swarm mode the nodes, their
        resource groups and GPUs come from the Swarm's node labels, read again every reconciler
        round, so a node that joins, drains or goes down changes what the queue places. Another
        backend is a class (or its import name, or the name of an entry point of the
        `fgpu_hub.engines` group): docs/source/reference/engines.md.

        Example::

            c.QueueService.engine_class = "swarm"
        """,
    )
    policy = CaselessStrEnum(
        ["fifo", "drf"],
        default_value="fifo",
        config=True,
        help="""
        Queue order: `fifo` (with bounded backfill) or `drf` (dominant resource fairness).

        Example::

            c.QueueService.policy = "drf"
        """,
    )
    placement = CaselessStrEnum(
        ["best_fit", "fill", "spread"],
        default_value="best_fit",
        config=True,
        help="""
        Where a session goes: `best_fit` keeps GPUs whole; `fill` and `spread` as in Backend.AI.

        Example::

            c.QueueService.placement = "spread"
        """,
    )
    max_skips = Integer(
        10,
        config=True,
        help="""
        How often later, smaller requests may overtake a waiting one before it is served first.

        Example::

            c.QueueService.max_skips = 5
        """,
    )
    pending_timeout = Float(
        3600.0,
        config=True,
        help="""
        Seconds a request may wait before it ends as PENDING_TIMEOUT; 0 waits forever.

        Example::

            c.QueueService.pending_timeout = 7200
        """,
    )
    job_pending_timeout = Float(
        86400.0,
        config=True,
        help="""
        Seconds a batch job may wait for its turn before it ends as PENDING_TIMEOUT; 0 waits
        forever. Longer than an interactive request's (`pending_timeout`): nobody sits in front
        of a job. The hub must wait as long (FGPUSpawner.job_start_timeout).

        Example::

            c.QueueService.job_pending_timeout = 2 * 86400
        """,
    )
    job_time_limit = Float(
        3600.0,
        config=True,
        help="""
        Seconds a batch job may run when it names no `time_limit` of its own; past it, the job is
        stopped and ends `timeout`.

        Example::

            c.QueueService.job_time_limit = 2 * 3600
        """,
    )
    job_time_limit_max = Float(
        86400.0,
        config=True,
        help="""
        The longest `time_limit` a batch job may ask for, in seconds; a longer one is refused
        when it is submitted, with this limit in the message.

        Example::

            c.QueueService.job_time_limit_max = 3 * 86400
        """,
    )
    job_start_after_max = Float(
        7 * 86400.0,
        config=True,
        help="""
        How far ahead, in seconds, a batch job's `start_after` may be: a later one is refused
        when the job is submitted (400, with this limit in the message). A deferred job waits out
        of the line until then, and the hub's spawn waits with it, holding one of its spawn
        slots. 0: no limit.

        Example::

            c.QueueService.job_start_after_max = 14 * 86400
        """,
    )
    jobs_waiting_per_user = Integer(
        JOBS_WAITING_PER_USER,
        config=True,
        help="""
        How many batch jobs one user may have waiting at once (those waiting for their
        `start_after` included); another is refused (403) until one of them starts or is
        cancelled, so that nobody floods the line. Waiting jobs count here, not against the
        `pending` quota, which bounds waiting interactive sessions. 0: no limit.

        Example::

            c.QueueService.jobs_waiting_per_user = 3
        """,
    )
    user_quota = Dict(
        DEFAULT_USER_QUOTA,
        config=True,
        help=f"""
        Quota of every user (keys as in a group's `fgpu_quota`): by default {DEFAULT_USER_QUOTA},
        that is 3 sessions running, 2 more waiting and 4 fGPU in all, so that one student
        cannot fill the queue or hold the cluster. A request past `pending` is refused at once
        (403, with a message); past `sessions` or `fgpu` it waits. A key set to None lifts that
        limit; {{}} lifts them all. Group quotas (the hub's group property `fgpu_quota`, edited in
        the admin panel) apply as well. Waiting batch jobs do not count against `pending`: they
        have their own limit, `jobs_waiting_per_user`. Keep the hub's
        `named_server_limit_per_user` at sessions + pending + jobs_waiting_per_user (the shipped
        jupyterhub_config.py derives them from FGPU_USER_QUOTA and FGPU_JOBS_WAITING_PER_USER).

        Example::

            c.QueueService.user_quota = {{"sessions": 2, "pending": 1, "fgpu": None}}
        """,
    )
    presets = List(
        Dict(),
        [],
        config=True,
        help="""
        Resource presets offered to everyone, beside the custom sliders of the launch dialog
        and the spawn form: each a name and its slots (cpu in cores, mem as bytes or a size,
        fgpu in units, 0 when left out). A hub group adds its own in its properties, as
        `fgpu_presets` (queue_service/core/presets.py). A preset above a user's quota or the session
        limits is listed to them as unavailable, with the reason. The shipped
        jupyterhub_config.py reads FGPU_PRESETS (JSON).

        Example::

            c.QueueService.presets = [
                {"name": "CPU small", "cpu": 1, "mem": "2G"},
                {"name": "half GPU", "cpu": 2, "mem": "4G", "fgpu": 1},
            ]
        """,
    )
    session_limits = Dict(
        SESSION_LIMITS,
        config=True,
        help=f"""
        What one session may ask for and gets by default: the Sessions page's sliders and the
        presets' checks use them. The hub hands the service the spawner's own settings of the
        same names (`FGPUSpawner.cpu_min`, `cpu_max`, `cpu_default`, `mem_min`, `mem_max`,
        `mem_default`, `fgpu_max`, `fgpu_default`, `default_image_name`), which judge every
        start: set them there, once, for both. Keys and defaults: {SESSION_LIMITS} (mem in
        bytes).

        Example::

            c.FGPUSpawner.fgpu_max = 2
        """,
    )
    spawner_service = Unicode(
        "fgpu-spawner",
        config=True,
        help="""
        Name of the hub service whose token the spawner presents; only it may ask for grants.

        Example::

            c.QueueService.spawner_service = "cs101-spawner"
        """,
    )
    folders_root = Unicode(
        "fgpu-folders",
        config=True,
        help="""
        Directory that holds every storage folder's files, one directory per folder, named by
        its id (relative paths are in the state directory). Sessions bind folders from it, so in
        Swarm mode it must be on the shared storage, mounted at this same path on every node and
        on the hub's host.

        Example::

            c.QueueService.folders_root = "/srv/fgpu/folders"
        """,
    )
    project_quotas = Bool(
        True,
        config=True,
        help="""
        Hold each user's own storage quota with the kernel's project quotas where the folders
        root is on XFS or ext4 mounted with `prjquota` (and xfs_quota is installed): a write past
        the quota then fails at once, in sessions too. Elsewhere, and with False, the quotas are
        measured every `folder_measure_interval` seconds (uploads and new folders past them are
        refused, and a full folder is mounted read-only at the next launch). A hub group's quota
        is always measured. The service's log says at start which one the site has, and why.

        Example::

            c.QueueService.project_quotas = False
        """,
    )
    home_volume = Unicode(
        "fgpu-home-{username}",
        config=True,
        help="""
        The name of each user's home volume, as the spawner names it: the hub hands the service
        the spawner's `FGPUSpawner.home_volume`; set it there, once, for both. On one host the service finds a batch job's notebook in that volume
        (its directory on this host, from the engine) and refuses a job whose notebook is not
        there, before it is queued. `{username}` is the user name, escaped for Docker. Empty: no
        persistent homes, and notebooks outside storage folders are not looked for.

        Example::

            c.FGPUSpawner.home_volume = "cs101-home-{username}"
        """,
    )
    ssh_port = Integer(
        0,
        config=True,
        help="""
        Port of the SSH and SFTP service (docs/source/explanation/contracts.md, contract 9): `ssh -p <port> user@hub` opens
        a shell in the user's running session (`user-server@hub`: a named server's), and `sftp`
        reaches their home and storage folders, session or not; the password is a hub API token
        of that user. 0: no SSH service. The shipped config sets it from FGPU_SSH_PORT (default
        8022).

        Example::

            c.QueueService.ssh_port = 2222
        """,
    )
    ssh_host = Unicode(
        "",
        config=True,
        help="""
        Address the SSH service listens on; empty: every address of the host.

        Example::

            c.QueueService.ssh_host = "10.0.0.5"
        """,
    )
    ssh_host_key_file = Unicode(
        HOST_KEY_FILE,
        config=True,
        help="""
        File holding the SSH service's host key, made (Ed25519, mode 0600) when missing. Relative
        paths are in the state directory (where the hub starts), so that clients see the same
        host after a restart.

        Example::

            c.QueueService.ssh_host_key_file = "/var/lib/fgpu-hub/fgpu_ssh_host_key"
        """,
    )
    ssh_ciphers = List(
        Unicode(),
        [],
        config=True,
        help="""
        The ciphers the SSH service offers, in its order; empty: asyncssh's (chacha20-poly1305
        first, which OpenSSH's client picks). A client takes the first of its own list that the
        service offers, so offering only AES-GCM makes OpenSSH's client use it: the service then
        spends about half the CPU on a transfer (asyncssh's AES-GCM is the processor's, its
        chacha20 is not), and SFTP goes up to twice as fast (benchmarks/README.md). Clients
        without AES-GCM (paramiko, PuTTY before 0.76) can then not connect.

        Example::

            c.QueueService.ssh_ciphers = ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com"]
        """,
    )
    ssh_failed_logins_allowed = Integer(
        10,
        config=True,
        help="""
        Failed SSH logins (a wrong or refused token) one source address may make before its
        logins are held back: refused unchecked, its new connections closed, for 1 s, then twice
        as long after each further failure, up to `ssh_login_hold_max`. A login that succeeds, or
        `ssh_login_hold_max` without a failure, clears the count. A class behind one NAT address
        shares it: keep it well above a typo or two per student.

        Example::

            c.QueueService.ssh_failed_logins_allowed = 30
        """,
    )
    ssh_login_hold_max = Float(
        300.0,
        config=True,
        help="""
        Seconds at most that a source address which keeps failing to log in over SSH is held
        back (see `ssh_failed_logins_allowed`).

        Example::

            c.QueueService.ssh_login_hold_max = 60.0
        """,
    )
    home_root = Unicode(
        "",
        config=True,
        help="""
        Swarm mode: the shared home root, mounted at this path on the hub's host. The hub hands
        the service the spawner's `FGPUSwarmSpawner.home_root` (the shipped config's
        FGPU_SWARM_HOME_ROOT): set it there, once, for both. The service finds a
        batch job's notebook in the account's folder there, and refuses a job whose notebook is
        not there, before it is queued. Empty (a Swarm whose homes are the nodes' volumes): the
        service cannot see homes, and a missing notebook is found when the job runs.

        Example::

            c.FGPUSwarmSpawner.home_root = "/mnt/nfs/fgpu-homes"
        """,
    )
    folder_grace_days = Float(
        7.0,
        config=True,
        help="""
        Days a removed storage folder's files are kept (in `<folders_root>/.trash`) before they
        are purged: time for an admin to bring back one removed by mistake.

        Example::

            c.QueueService.folder_grace_days = 30
        """,
    )
    folder_measure_interval = Float(
        300.0,
        config=True,
        help="""
        Seconds between two measures of every storage folder's size (what sessions wrote
        directly), which the Storage page shows and the storage quotas count; 0 measures only
        what goes through the service's API.

        Example::

            c.QueueService.folder_measure_interval = 900
        """,
    )
    catalog_path = Unicode(
        "",
        config=True,
        help="""
        catalog.yaml that seeds the image catalog at every start (empty: the shipped one). Seeding
        adds new entries and follows the file's changes, but never undoes an instructor's edit.

        Example::

            c.QueueService.catalog_path = "/etc/fgpu-hub/catalog.yaml"
        """,
    )
    build_in_background = Bool(
        False,
        config=True,
        help="""
        Build the catalog's heavy images (entries with a recipe, `prebuild: false` and not
        hidden: TensorFlow, PyTorch) behind the hub, one at a time, with the project's build tool.
        The Images page shows each build; the launcher offers an image once it is on the engine.
        A start re-checks them all: an up-to-date image is skipped in a second or two. The
        shipped jupyterhub_config.py turns this on unless FGPU_BUILD_IMAGES=0. Single-host mode
        only (in Swarm mode the images go to the nodes through the lab's registry).

        Example::

            c.QueueService.build_in_background = True
        """,
    )
    engine_images_interval = Float(
        30.0,
        config=True,
        help="""
        Seconds between two looks at which catalog images the engine holds (one `docker images`
        call); an image missing from it is not offered. Also looked at after each background
        build and on every "Check". 0 turns the looks off (every image is offered).

        Example::

            c.QueueService.engine_images_interval = 60
        """,
    )
    reconcile_interval = Float(
        5.0,
        config=True,
        help="""
        Seconds between full reconciliations of records and containers.

        Example::

            c.QueueService.reconcile_interval = 10
        """,
    )
    remove_ended_servers = Bool(
        True,
        config=True,
        help="""
        Remove an ended session's named server from the hub once the hub has stopped it, so that
        the hub's home page does not list every stopped server forever (the Sessions page's
        Finished tab keeps the history). Failures are logged and tried again.

        Example::

            c.QueueService.remove_ended_servers = False
        """,
    )
    server_removal_interval = Float(
        5.0,
        config=True,
        help="""
        Seconds between two rounds that remove ended sessions' named servers from the hub.

        Example::

            c.QueueService.server_removal_interval = 30
        """,
    )
    visit_check_interval = Float(
        60.0,
        config=True,
        help="""
        Seconds between two rounds that end instructors' visits of students' sessions: a
        session an instructor opened from the Course page is shared with them (JupyterHub's
        shares) until it ends or they stop teaching its owner; the round revokes what is left
        (instructor_visits.py). 0 turns the round off.

        Example::

            c.QueueService.visit_check_interval = 30
        """,
    )
    start_grace = Float(
        180.0,
        config=True,
        help="""
        Seconds a grant may wait for its container to appear before the reconciler reclaims it
        (the spawn died with the hub, say). Keep it above the time the largest image takes to
        start, or slow starts lose their grant.

        Example::

            c.QueueService.start_grace = 600
        """,
    )
    respawn_grace = Float(
        120.0,
        config=True,
        help="""
        Seconds a waiting request must be seen with no spawn waiting on it before the reconciler
        issues its spawn again, when a spawn of this service's life has dealt with it. Keep it
        above the time a cancelled spawn's release may take to arrive (a release is made again
        after a timeout, 3 × 30 s), or a cancel under a storm of stops is undone. A request no
        spawn of this life has dealt with (its spawn died with a killed hub, and the service
        with it) is issued again at once, if the hub runs no spawn of that server.

        Example::

            c.QueueService.respawn_grace = 300
        """,
    )
    ghost_grace = Float(
        60.0,
        config=True,
        help="""
        Seconds the hub must list a server as running, with no session of this service and no
        container behind it, before the reconciler stops that server through the hub's API, so
        that its student can start it again. A server the hub is still spawning or stopping is
        never touched; keep this above the time a start takes from the hub's record to the
        queue's.

        Example::

            c.QueueService.ghost_grace = 120
        """,
    )
    utilization_interval = Float(
        60.0,
        config=True,
        help="""
        Seconds between two samples of the cluster's utilization (capacity, allocated and used
        CPU, memory and fGPU), kept in the service's DB for the Cluster page's charts and
        `api/utilization`. 0 takes no samples.

        Example::

            c.QueueService.utilization_interval = 300
        """,
    )
    utilization_retention_days = Float(
        30.0,
        config=True,
        help="""
        Days the utilization samples are kept; older ones are deleted.

        Example::

            c.QueueService.utilization_retention_days = 90
        """,
    )
    utilization_detail_hours = Float(
        24.0,
        config=True,
        help="""
        Hours each utilization sample is kept as it was taken; older ones are averaged into
        buckets of `utilization_bucket_seconds`, so a long-running hub keeps about
        detail / interval + retention / bucket rows (1440 + 4320 by default), not more.

        Example::

            c.QueueService.utilization_detail_hours = 72
        """,
    )
    utilization_bucket_seconds = Float(
        600.0,
        config=True,
        help="""
        Seconds of the buckets older utilization samples are averaged into.

        Example::

            c.QueueService.utilization_bucket_seconds = 3600
        """,
    )
    cookie_secret_file = Unicode(
        "fgpu_queue_cookie_secret",
        config=True,
        help="""
        File holding the secret that signs the service's login and XSRF cookies, created (mode
        0600) when missing. Relative paths are in the state directory (where the hub starts), so
        that open pages stay logged in across a service restart.

        Example::

            c.QueueService.cookie_secret_file = "/var/lib/fgpu-hub/fgpu_queue_cookie_secret"
        """,
    )
    deployment_id = Unicode(
        config=True,
        help="""
        Id of this hub's deployment: only session containers labelled with it (`fgpu.deployment`)
        are adopted or stopped, so hubs sharing an engine never touch each other's sessions.
        Default: read from `fgpu_deployment_id` in the working directory (the hub's state
        directory), made there on first start. The hub hands the service the spawner's
        `FGPUSpawner.deployment_id`: set it there, once, for both.

        Example::

            c.FGPUSpawner.deployment_id = "cs101-hub"
        """,
    )
    agent_service = Unicode(
        "fgpu-node-agent",
        config=True,
        help="""
        Name of the hub service whose token the node agents present; only it may report nodes.

        Example::

            c.QueueService.agent_service = "cs101-node-agent"
        """,
    )
    node_report_stale = Float(
        20.0,
        config=True,
        help="""
        Seconds after which a node's last agent report no longer counts (its sessions' usage is
        unknown, not zero). Keep it a few times `node_agent_interval`.

        Example::

            c.QueueService.node_report_stale = 60
        """,
    )
    registry_auth_file = Unicode(
        "",
        config=True,
        help="""
        File with the credentials of `node_agent_registry` (JSON: `username`, `password`,
        `serveraddress`; not readable by every user): the service lists the registry's images
        with them, and its client logs in with them before it deploys the node agent, so that
        the nodes can pull the agent's image. Empty: the registry is asked without a login. In
        Swarm mode the hub hands the service the spawner's `FGPUSwarmSpawner.registry_auth_file`
        (the nodes pull session images with the same): set it there, once, for both.

        Example::

            c.FGPUSwarmSpawner.registry_auth_file = "/etc/fgpu-hub/registry-auth.json"
        """,
    )
    node_credentials_file = Unicode(
        CREDENTIALS_FILE,
        config=True,
        help="""
        File holding each Swarm node's own key, with which its agent signs its reports (mode
        0600, made when missing; relative paths are in the state directory). Keep it as private
        as the hub's database: a key lets its holder report for that node.

        Example::

            c.QueueService.node_credentials_file = "/var/lib/fgpu-hub/fgpu_node_credentials.json"
        """,
    )
    proxy_url = Unicode(
        "",
        config=True,
        help="""
        The hub proxy's address as this service reaches it (the shipped config passes the hub's
        bind URL, e.g. http://127.0.0.1:8000). Each running session is told its planned end
        through it, for the time left in its JupyterLab status bar (session_end_notice.py).
        Empty: sessions are not told; the Sessions page still shows the end.

        Example::

            c.QueueService.proxy_url = "http://127.0.0.1:8000"
        """,
    )
    idle_timeout = Float(
        0.0,
        config=True,
        help="""
        The idle culler's timeout in seconds (the shipped config sets FGPU_IDLE_TIMEOUT's): the
        Sessions page and the session itself are told when an unused session will be stopped.
        0: no culler runs, no idle end is predicted. The hub hands the service the spawner's
        `FGPUSpawner.idle_timeout`: set it there, once, for both (and the culler's own).

        Example::

            c.FGPUSpawner.idle_timeout = 7200
        """,
    )
    lifetime_warning = Float(
        600.0,
        config=True,
        help="""
        Seconds before an automatic end (a group's `max_session_lifetime`, an idle cull) that the
        session is warned: a line on the Sessions page, ~/FGPU-WARNING.txt in the session and, for
        a lifetime end, a message in its terminals.

        Example::

            c.QueueService.lifetime_warning = 900
        """,
    )
    ends_interval = Float(
        5.0,
        config=True,
        help="""
        Seconds between two checks of the sessions' automatic ends: a session over its lifetime
        is stopped within this long, and warnings are given as close to their lead.

        Example::

            c.QueueService.ends_interval = 10
        """,
    )
    service_url = Unicode(
        config=True,
        help="""
        Where to listen (JUPYTERHUB_SERVICE_URL).

        Example::

            c.QueueService.service_url = "http://127.0.0.1:10102"
        """,
    )
    service_prefix = Unicode(
        config=True,
        help="""
        URL prefix (JUPYTERHUB_SERVICE_PREFIX).

        Example::

            c.QueueService.service_prefix = "/services/gpu-queue/"
        """,
    )

    def initialize(self, argv=None):
        """The site's settings first, as the hub hands them over (`c.QueueService.…` in its
        jupyterhub_config.py: fgpu_shared/site_config.py), then the command line, which wins."""
        handed = os.environ.get(site_config.ENV)
        if handed:
            try:
                self.update_config(site_config.service_config(handed))
            except (site_config.SiteConfigError, TraitError) as e:
                raise SystemExit(f"The site's settings for the queue service: {e}") from None
        super().initialize(argv)

    def settings_in_effect(self) -> dict:
        """Every setting as this service holds it, as JSON (a database password hidden)."""
        values = settings_of(self, QueueService.class_own_traits(config=True))
        values["db_url"] = safe_url(values["db_url"])
        return values

    def engine_settings_in_effect(self) -> dict:
        """The engine backend's class and every setting as it holds them, as JSON."""
        backend = self.engine_backend
        return {
            "class": type(backend).__name__,
            "settings": settings_of(backend, backend.trait_names(config=True)),
        }

    @validate("ssh_ciphers")
    def _known_ssh_ciphers(self, proposal) -> list[str]:
        """A cipher asyncssh does not know stops the service with its name, rather than
        leaving it without SSH."""
        known = cipher_names()
        for name in proposal.value:
            if name not in known:
                raise TraitError(f"ssh_ciphers: no cipher {name!r}; known: {', '.join(known)}")
        return proposal.value

    @validate("session_limits")
    def _known_session_limits(self, proposal) -> dict:
        """The limits' keys checked and their values read (a spawner's "32G", say), so that a
        typo stops the service with the key named; the keys not set keep their defaults."""
        limits = {}
        for key, value in proposal.value.items():
            if key not in SESSION_LIMITS:
                raise TraitError(f"session_limits has no {key!r}: keys are {list(SESSION_LIMITS)}")
            try:
                limits[key] = _session_limit(key, value)
            except ValueError as e:
                raise TraitError(f"session_limits[{key!r}]: {e}") from None
        return {**SESSION_LIMITS, **limits}

    @default("db_url")
    def _db_url_default(self) -> str:
        return queue_db_url()

    @validate("db_url")
    def _db_url_with_driver(self, proposal) -> str:
        return with_driver(proposal.value)

    def upgrade_backups(self) -> BackupSettings:
        return BackupSettings(
            folder=Path(self.upgrade_backup_dir) if self.upgrade_backup_dir else None,
            kept=self.upgrade_backups_kept,
            allow_without_backup=self.upgrade_without_backup,
        )

    @default("service_url")
    def _default_service_url(self):
        return os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101")

    @default("service_prefix")
    def _default_service_prefix(self):
        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/queue/")

    @default("deployment_id")
    def _default_deployment_id(self):
        return deployment_id(os.getcwd())

    async def discover_node(self) -> None:
        """Read the nodes from the engine: the one engine's once, when it first answers (at
        start, or later); a Swarm's every reconciler round, since nodes join, drain and fail. A
        change of the inventory is logged and given to the queue, whose next pass places on it."""
        backend = self.engine_backend
        if self.manager.nodes and not backend.nodes_change:
            return
        reading = await backend.read_nodes()
        found = [scheduler_node(node) for node in reading.nodes]
        if found == self.manager.nodes and self.manager.engine_problem is None:
            return
        self.log.info("%s", backend.describe(reading.nodes))
        await self.manager.replace_nodes(found, reading.withheld)

    # -- start-up: each step makes what the later ones need; `build` runs them in order ---------

    def build(self) -> web.Application:
        """The service's parts, made in the order they need one another, and the web
        application that serves them. A step that cannot be taken stops the service, named."""
        self.init_registry_auth()
        self.init_hub()
        self.init_db()
        self.init_engine()
        self.init_queue()
        self.init_images()
        self.init_folders()
        self.init_rounds()
        self.init_ssh()
        return self.init_app()

    def init_registry_auth(self) -> None:
        """A bad registry credentials file stops the service here, named."""
        try:
            self.registry_auth()
        except RegistryAuthError as e:
            self.log.critical("Not starting: QueueService.registry_auth_file: %s", e)
            raise SystemExit(1) from None

    def init_hub(self) -> None:
        """The hub's API, and the quotas read from it (the users' and groups')."""
        self.hub = HubClient()
        self.quotas = QuotaBook(self.user_quota, log=self.log)

    def init_db(self) -> None:
        """The service's own database, upgraded to this version's schema (a backup first)."""
        try:
            self.db = open_database(self.db_url, self.upgrade_backups(), self.log)
        except UpgradeRefused as e:
            # Before the service listens: the hub reports its service as gone, and the log why.
            self.log.critical("Not starting: %s", e)
            raise SystemExit(1) from None
        except OperationalError as e:
            self.log.critical(
                "Not starting: the queue DB %s does not answer: %s",
                safe_url(self.db_url),
                str(e.orig).strip().splitlines()[0] if e.orig else e,
            )
            raise SystemExit(1) from None

    def init_engine(self) -> None:
        """The engine's client and the backend of `engine_class`, made here once: what differs
        where sessions run is asked of it (engine/backend.py)."""
        # Connected on first use: the service starts, and answers, while the engine is down.
        self.docker = Engine(timeout=30)
        self.container_calls = ContainerCalls(log=self.log)
        self.container_locks = ContainerLocks()
        self.node_reports = NodeReports(stale_after=self.node_report_stale)
        self.node_credentials = NodeCredentials(self.node_credentials_file)
        hooks = ServiceHooks(
            # Closures: the manager and the catalog are made later (init_queue, init_images).
            running_ids=lambda: self.manager.running_ids(),
            registry_auth=self.registry_auth,
            image_digests=lambda: {
                v["image"]: v["digest"] for v in self.images.all() if v["digest"]
            },
            deployment_id=self.deployment_id,
            container_calls=self.container_calls,
            container_locks=self.container_locks,
            node_reports=self.node_reports,
            node_credentials=self.node_credentials,
            agent_service=self.agent_service,
            catalog=lambda: self.images.all(),
        )
        self.engine_backend = self.engine_class(self.docker, hooks, parent=self)
        self.freeze = self.engine_backend.freeze_watch()

    def init_queue(self) -> None:
        """The queue manager, with its usage budgets (store/usage.py), which file each
        session's use as it ends and admit a request only within them."""
        self.jobs = JobRules(
            self.job_time_limit,
            self.job_time_limit_max,
            self.jobs_waiting_per_user,
            start_after_max=self.job_start_after_max,
            group_times=self.quotas.job_times_of,
        )
        self.usage = UsageBook(
            self.db,
            # A closure: the manager reads the budgets as it admits, so it is made after them.
            lambda node: self.manager.group_of_node(node),
            quotas=self.quotas,
        )
        self.manager = QueueManager(
            self.db,
            [],
            SchedulerSettings(
                units_per_gpu=self.units_per_gpu,
                policy=self.policy,
                placement=self.placement,
                max_skips=self.max_skips,
                pending_timeout=self.pending_timeout,
                job_pending_timeout=self.job_pending_timeout,
            ),
            self.quotas,
            engine_problem=ENGINE_NOT_YET,
            usage_of=self.engine_backend.usage_of,
            admission_check=self._admission_check,
            # A closure: the automatic ends read the manager's records, so they come after it
            # (init_rounds).
            ends_of=lambda session_id: self.automatic_ends.view(session_id),
        )
        self.manager.image_nodes = self.engine_backend.image_holders

    def init_images(self) -> None:
        """The image catalog, seeded from catalog.yaml, and the builds of its heavy images."""
        self.images = ImageStore(self.db)
        catalog = load_catalog(self.catalog_path or None)
        seeded = self.images.seed(catalog)
        self.log.info("Image catalog seeded: %s", seeded)
        self.builds = BackgroundBuilds(
            heavy_names(catalog) if self.builds_here else [],
            catalog_path=self.catalog_path,
            built=self.look_at_engine_images,
            log=self.log,
            preexec=die_with_parent,
        )

    def init_folders(self) -> None:
        """Storage folders: their records, their files under `folders_root`, and the storage
        quotas that bound them."""
        root = os.path.abspath(self.folders_root)
        self.folders = Folders(
            FolderStore(self.db),
            FolderFiles(root),
            grace=self.folder_grace_days * 24 * 3600,
            storage_limits=self.quotas.storage_limits,
            members=self.quotas.members_of,
            groups_of=self.quotas.groups_of,
            projects=self.kernel_project_quotas(root),
        )
        self.say_mount_flags(root)
        # Where a batch job's notebook is looked for: the storage folders, and the homes.
        inspect_volume = self.engine_backend.volume_inspector()
        homes = HomeSettings(
            volume=self.home_volume, root=self.home_root, volumes_here=inspect_volume is not None
        )
        self.job_files = JobFiles(homes, inspect_volume)

    def init_ssh(self) -> None:
        """SSH and SFTP (queue_service/ssh/): logins checked with the hub, shells in sessions
        where the engine backend reaches them, files through the storage folders' parts."""
        # The page's path on the hub's address (the service does not know the address people
        # type: the login that reads this does).
        sessions_url = f"{self.service_prefix}sessions"
        self.ssh_keys = SSHKeyStore(self.db)
        self.ssh = SSHService(
            TokenLogins(self.hub, self.ssh_keys, self.log),
            LoginThrottle(self.ssh_failed_logins_allowed, self.ssh_login_hold_max, self.log),
            Shells(self.engine_backend.session_exec(), sessions_url, self.log),
            FileAreas(self.folders, self.job_files),
            self.folders.measure_after_change,
            self.log,
        )

    async def start_ssh(self) -> None:
        """Listen for SSH, if a port is set; a port taken or a host key unreadable leaves the
        service without SSH (logged), never without its pages."""
        if not self.ssh_port:
            return
        try:
            await self.ssh.listen(
                self.ssh_host, self.ssh_port, self.ssh_host_key_file, self.ssh_ciphers
            )
        except (OSError, ValueError) as e:
            self.log.error("No SSH service on port %s: %s", self.ssh_port, e)
            return
        self.log.info("SSH and SFTP listening on port %s", self.ssh_port)

    def say_mount_flags(self, root: str) -> None:
        """Warn when the folders root's mount lacks nosuid,nodev: the sessions' binds of
        folders take that mount's flags (store/mount_flags.py)."""
        os.makedirs(root, mode=0o700, exist_ok=True)
        point, missing = missing_flags(root)
        if missing:
            self.log.warning(
                "The folders root %s is on the mount %s without %s: a setuid file or device a "
                "session leaves in a folder keeps its power there. Mount the root with them, "
                "e.g. `mount --bind %s %s && mount -o remount,bind,nosuid,nodev %s` (in "
                "/etc/fstab: `%s %s none bind,nosuid,nodev`).",
                root,
                point,
                ",".join(missing),
                root,
                root,
                root,
                root,
                root,
            )

    def kernel_project_quotas(self, root: str) -> ProjectQuotas | None:
        """The kernel's project quotas on the folders root, if it has them and the site wants
        them; the log says which way the storage quotas are held."""
        if not self.project_quotas:
            self.log.info("Storage quotas are measured (QueueService.project_quotas is off).")
            return None
        os.makedirs(root, mode=0o700, exist_ok=True)  # closed, as folder_files.py says
        projects = ProjectQuotas(root)
        if projects.reason is not None:
            # Said at the service's default level: a site that counts on a hard limit must see it.
            self.log.warning(
                "Storage quotas are measured every %g s: the folders root %s cannot hold them "
                "as project quotas (%s).",
                self.folder_measure_interval,
                root,
                projects.reason,
            )
            return None
        self.log.warning("Storage quotas are held by project quotas on %s.", projects.mount.point)
        return projects

    def _admission_check(self, db, request: dict, groups: tuple[str, ...]):
        """A job's time limit within the site's maximum, then the usage budgets."""
        return self.jobs.refusal(db, request) or self.usage.admission_check(db, request, groups)

    def init_rounds(self) -> None:
        """What runs in rounds behind the API (started by `serve`): the reconciler, the removal
        of ended servers, the utilization samples, the automatic ends and the health checks."""
        self.server_remover = ServerRemover(
            self.db,
            self.hub,
            self.active_servers,
            log=self.log,
        )
        self.job_ends = JobEnds(
            self.manager, self.hub, self.engine_backend, self.deployment_id, log=self.log
        )
        self.reconciler = Reconciler(
            self.manager,
            log=self.log,
            start_grace=self.start_grace,
            hub=self.hub,
            respawn_grace=self.respawn_grace,
            ghost_grace=self.ghost_grace,
            deployment_id=self.deployment_id,
            # Until the node is read and the containers counted, no slice is granted and a
            # spawn is refused at once with 503: the engine's state is unknown.
            prepare=self.discover_node,
            sessions=self.engine_backend.session_lister(),
            watch=self.freeze.check if self.freeze else None,
            calls=self.container_calls,
            # An exited job whose engine event was missed ends with its own reason, not as lost.
            jobs=self.job_ends,
        )
        # Cluster utilization over time (store/utilization.py), for the Cluster page's charts.
        self.utilization = UtilizationLog(
            self.db,
            lambda: cluster_figures(self.manager),
            interval=self.utilization_interval,
            retention=timedelta(days=self.utilization_retention_days),
            detail=timedelta(hours=self.utilization_detail_hours),
            bucket=self.utilization_bucket_seconds,
            log=self.log,
        )
        self.automatic_ends = AutomaticEnds(
            self.manager,
            self.hub,
            self.quotas,
            idle_timeout=self.idle_timeout,
            warning_lead=self.lifetime_warning,
            # Sessions on other machines (Swarm) are warned on the page only.
            notifier=self.engine_backend.session_notifier(),
            end_notice=self._end_notice(),
            log=self.log,
            job_limit=self.jobs.limit_of,
        )
        self.health = self._health_monitor()

    def _health_monitor(self) -> HealthMonitor:
        freeze, db = self.freeze, self.db
        reported = self.engine_backend.reported_nodes()
        return HealthMonitor(
            self.manager,
            self.reconciler,
            lambda: select_one(db),
            self.reconcile_interval,
            containers=lambda: containers_check(
                self.container_calls.unresponsive(),
                freeze.frozen() if freeze else [],
                freeze.thaws() if freeze else [],
            ),
            # Sessions on other nodes: their engines' settings, as the nodes' agents report them.
            node_daemons=None if reported is None else lambda: node_daemons_check(reported()),
        )

    def init_app(self) -> web.Application:
        """The web application: the routes, and in its settings what the handlers read
        (handlers/base.py names each)."""
        prefix = self.service_prefix
        return web.Application(
            handlers.routes(prefix),
            **handlers.pages.settings(prefix, simulated=self.engine_backend.gpus_simulated),
            manager=self.manager,
            folders=self.folders,
            history=History(self.db),
            hub_client=self.hub,
            launcher=Launcher(self.hub, self.manager),
            automatic_ends=self.automatic_ends,
            quotas=self.quotas,
            usage=self.usage,
            utilization=self.utilization,
            images=self.images,
            image_builds=self.builds,
            look_at_engine_images=self.look_at_engine_images,
            docker=self.docker,
            spawner_service=self.spawner_service,
            # A typo in the site's presets stops the service here, with the preset named.
            site_presets=parse_presets(self.presets, "QueueService.presets"),
            session_limits=self.session_limits,
            job_rules=self.jobs,
            job_files=self.job_files,
            ssh_keys=self.ssh_keys,
            ssh_port=self.ssh_port,
            agent_service=self.agent_service,
            node_reports=self.node_reports,
            node_identity=NodeIdentity(self.node_credentials),
            rotate_node_key=self.engine_backend.rotate_node_key,
            node_agent_registry=self.engine_backend.commit_registry,
            engine_backend=self.engine_backend,
            health=self.health,
            cookie_secret=self.service_secret,
            end_notice_key=self.end_notice_key,
            settings_in_effect=self.settings_in_effect(),
            engine_settings_in_effect=self.engine_settings_in_effect(),
        )

    async def serve(self) -> None:
        app = self.build()
        url = urlparse(self.service_url)
        # Before the first answer: the launcher must never offer an image that is not built yet.
        await asyncio.to_thread(self.look_at_engine_images)
        await listen_when_free(app, url.port or 80, url.hostname, self.log)
        self.log.info("Queue service listening on %s%s", self.service_url, self.service_prefix)
        await self.engine_backend.start()
        await self.start_ssh()
        try:
            await self.reconciler.reconcile()
        except Exception as e:  # the engine is down: the reconciler's rounds try again
            self.log.warning("Queue service started without the Docker engine: %s", e)
        # Sessions that ended while no service of this version ran, with their nodes now known.
        self.log.info("Usage: %d ended sessions filed", await self.usage.file_unfiled())
        await self.quotas.refresh_users((r.user for r in self.manager.active_records()), self.hub)
        await self.manager.schedule()
        self.start_rounds()
        await self.reconciler.run(self.reconcile_interval)

    def active_servers(self) -> set[tuple[str, str]]:
        """(user, server name) of the sessions that have not ended."""
        return {(r.user, r.server_name) for r in self.manager.active_records()}

    def start_rounds(self) -> None:
        """Start the rounds `init_rounds` made (the reconciler's own runs in `serve`), and the
        stats, the looks at the engine's images and the background builds."""
        if self.remove_ended_servers:
            self._removal_task = asyncio.create_task(
                self.server_remover.run(self.server_removal_interval)
            )
        if self.visit_check_interval > 0:
            closer = VisitCloser(self.hub, self.active_servers, self.log)
            self._visits_task = asyncio.create_task(closer.run(self.visit_check_interval))
        if self.utilization_interval > 0:
            self._utilization_task = asyncio.create_task(self.utilization.run())
        self._ends_task = asyncio.create_task(self.automatic_ends.run(self.ends_interval))
        self._job_exits_task = asyncio.create_task(
            self.engine_backend.watch_job_exits(self.job_ends)
        )
        if self.engine_images_interval > 0 and self.engine_backend.images_listable:
            self._engine_images_task = asyncio.create_task(self.watch_engine_images())
        self._builds_task = asyncio.create_task(self.builds.run())
        if self.folder_measure_interval > 0:
            self._folders_task = asyncio.create_task(self.keep_folders_measured())

    def _end_notice(self) -> EndNotice | None:
        if not self.proxy_url:
            return None
        base_url = os.environ.get("JUPYTERHUB_BASE_URL", "/")
        return EndNotice(self.proxy_url, base_url, self.end_notice_key, log=self.log)

    @functools.cached_property
    def service_secret(self) -> bytes:
        """The service's own secret (its cookies', and the sessions' end-notice keys')."""
        return read_or_create_secret(self.cookie_secret_file)

    def end_notice_key(self, session_id: str) -> str:
        """Session `session_id`'s end-notice key (session_end_notice.py): the spawner puts it in
        the session's environment; the key opens that session's notice and nothing else."""
        return end_notice_key(self.service_secret, session_id)

    @property
    def builds_here(self) -> bool:
        # The images are built on this engine: where the sessions run only in single-host mode.
        return self.build_in_background and self.engine_backend.builds_images

    def look_at_engine_images(self) -> None:
        """Blocking: note which catalog images the sessions' engine can run: the local engine's
        images, or in Swarm mode those the site's registry holds (registry_images.py)."""
        if self.engine_images_interval <= 0 or not self.engine_backend.images_listable:
            return
        try:
            self.images.note_engine_images(self._runnable_references())
        except Exception as e:  # the engine or registry is away: keep what was seen last
            self.log.warning("Could not list the images sessions can run: %s", e)

    def _runnable_references(self) -> set[str]:
        wanted = {view["image"] for view in self.images.all()}
        found = self.engine_backend.runnable_images(wanted)
        pinned = {reference: digest for reference, digest in found.items() if digest}
        for moved in self.images.pin_digests(pinned):
            self.log.warning(
                "The registry's tag %s points at another image than the one pinned: sessions keep "
                "the pinned one until an admin checks the image again",
                moved,
            )
        return set(found)

    async def keep_folders_measured(self) -> None:
        """Measure every folder (sessions write them directly, so their sizes and the storage
        quotas' figures drift from what the service wrote) and purge the trash past its grace."""
        while True:
            try:
                await asyncio.to_thread(self.folders.measure_all)
                await asyncio.to_thread(self.folders.purge)
                self.folders.forget_session_mounts(r.id for r in self.manager.active_records())
            except Exception:
                self.log.exception("Measuring the storage folders failed; trying again later")
            try:
                await asyncio.to_thread(self.stop_folder_writes_past_quota)
            except Exception:
                self.log.exception("Stopping writes past storage quotas failed; trying again later")
            await asyncio.sleep(self.folder_measure_interval)

    def stop_folder_writes_past_quota(self) -> None:
        """Blocking: stop writes in the running sessions to folders now past their owner's
        quota (engine/folder_write_stops.py; on a Swarm, at their next start only)."""
        users = {r.id: r.user for r in self.manager.active_records()}
        for session_id, folder_id in self.folders.stop_writes_past_quota(users, self._stop_writes):
            self.log.info("Writes to folder %s stopped in session %s", folder_id, session_id)

    def _stop_writes(self, session_id: str, source: str) -> bool:
        try:
            return self.engine_backend.stop_folder_writes(session_id, source)
        except (subprocess.CalledProcessError, OSError) as e:
            words = getattr(e, "stderr", "") or e
            self.log.warning("Could not stop writes of session %s: %s", session_id, words)
            return False

    async def watch_engine_images(self) -> None:
        while True:
            await asyncio.sleep(self.engine_images_interval)
            await asyncio.to_thread(self.look_at_engine_images)

    def registry_auth(self) -> dict[str, str] | None:
        """The registry's credentials, or None without a file; a bad file raises
        RegistryAuthError, which says what is wrong with it."""
        return read_registry_auth(self.registry_auth_file) if self.registry_auth_file else None

    async def serve_until_stopped(self) -> None:
        """Serve until SIGINT or SIGTERM. The hub stops its services with SIGINT and escalates to
        SIGTERM only after 10 s; a shell that starts the hub in the background leaves SIGINT
        ignored, so both signals are handled here, and the hub's shutdown does not wait."""
        loop, main = asyncio.get_running_loop(), asyncio.current_task()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, main.cancel)
        watch = asyncio.create_task(end_with_parent(self._parent, main, self.log))
        try:
            await self.serve()
        except asyncio.CancelledError:
            self.log.info("Queue service stopping on a signal, or with its hub")
        finally:
            watch.cancel()

    def start(self):
        self._parent = os.getppid()  # read before the death signal is set: the hub may be gone
        die_with_parent()
        asyncio.run(self.serve_until_stopped())


def die_with_parent() -> None:
    """Have the kernel send SIGTERM when the hub that started the service dies, even by SIGKILL
    (an OOM kill): an orphan would hold the port and serve the old settings."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


async def end_with_parent(parent: int, main: asyncio.Task, log) -> None:
    """Cancel `main` once the parent is gone: the death signal follows the thread that started
    the service, misses a parent that died before it was set, and does not exist off Linux, so
    the parent's pid is watched as well (an orphan gets a new parent)."""
    while True:
        if os.getppid() != parent:
            log.warning("The hub that started the queue service is gone; stopping")
            main.cancel()
            return
        await asyncio.sleep(PARENT_CHECK_SECONDS)


async def listen_when_free(app: web.Application, port: int, host: str | None, log) -> None:
    """Listen, waiting up to BIND_RETRY_SECONDS while the port is still held: a service that
    ends with its hub releases it a moment after the new hub starts the next one."""
    deadline = asyncio.get_running_loop().time() + BIND_RETRY_SECONDS
    while True:
        try:
            # Bodies read in pieces of a MiB, not tornado's 64 KiB: a sixteenth of the calls
            # per upload chunk (tornado alone took 256 MiB in 0.32 s instead of 0.46 s).
            app.listen(port, host, max_body_size=MAX_BODY_BACKSTOP, chunk_size=STREAM_PIECE_BYTES)
            return
        except OSError as e:
            if e.errno != errno.EADDRINUSE or asyncio.get_running_loop().time() > deadline:
                raise
            log.warning("Port %s is still in use; trying again", port)
            await asyncio.sleep(0.5)


main = QueueService.launch_instance
