"""`python -m queue_service`: the hub-managed `queue` service (docs/source/explanation/contracts.md, contract 4).

JupyterHub starts it with JUPYTERHUB_SERVICE_URL, _PREFIX, _API_URL and _API_TOKEN in its
environment; everything else is configured with `--QueueService.<trait>=<value>` on its command line
(the shipped jupyterhub_config.py builds that from the FGPU_* environment variables).
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

from jupyterhub.traitlets import ByteSpecification
from sqlalchemy.exc import OperationalError
from tornado import web
from traitlets import Bool, CaselessStrEnum, Dict, Float, Integer, List, Unicode, default, validate
from traitlets.config import Application

from fgpu_shared.registry_auth import RegistryAuthError, log_in, read_registry_auth
from image_catalog import load_catalog
from image_catalog.build import heavy_names
from image_catalog.launch_options import SESSION_LIMITS
from queue_service import handlers
from queue_service.core import resource_model
from queue_service.core.errors import Refusal
from queue_service.core.presets import parse_presets
from queue_service.engine import inventory
from queue_service.engine.client import Engine
from queue_service.engine.container_calls import ContainerCalls, ContainerLocks
from queue_service.engine.frozen_containers import THAW_AFTER_SECONDS, FreezeWatch
from queue_service.engine.node_agent_deploy import (
    TOKEN_FILE,
    AgentSettings,
    deploy_node_agents,
    node_agent_token,
    pinned_image,
    rotate_node_key,
)
from queue_service.engine.node_credentials import CREDENTIALS_FILE, NodeCredentials
from queue_service.engine.node_identity import NodeIdentity
from queue_service.engine.node_reports import DAEMON_FIX, NodeReports, wrong_daemon_settings
from queue_service.engine.registry_images import registry_digests
from queue_service.engine.session_containers import DockerSessionLister
from queue_service.engine.session_services import SwarmSessionLister
from queue_service.engine.stats import StatsSampler
from queue_service.store.db import open_database
from queue_service.store.db_upgrade import DEFAULT_KEPT, BackupSettings, UpgradeRefused, safe_url
from queue_service.store.deployment import deployment_id
from queue_service.store.history import History
from queue_service.store.images import ImageStore
from queue_service.store.state_dir import queue_db_url, with_driver
from queue_service.store.usage import UsageBook
from queue_service.store.utilization import UtilizationLog, cluster_figures

from .automatic_ends import AutomaticEnds, DockerNotifier
from .health import HealthMonitor, containers_check, node_daemons_check, select_one
from .hub_client import HubClient
from .image_builds import BackgroundBuilds
from .image_check import engine_references
from .launches import Launcher
from .queue import QueueManager, SchedulerSettings
from .quotas import DEFAULT_USER_QUOTA, QuotaBook
from .reconciler import Reconciler
from .server_removal import ServerRemover
from .session_end_notice import EndNotice

#: Largest body the server reads at all (the handlers refuse more than 64 KiB with a message).
MAX_BODY_BACKSTOP = 1 << 20
#: How long the engine may take to commit a session to a private image.
COMMIT_TIMEOUT_SECONDS = 600
#: Commits that may wait on the engine at once; more wait their turn in the commit executor.
COMMIT_WORKERS = 2
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
        """,
    )
    upgrade_backup_dir = Unicode(
        "",
        config=True,
        help="""
        Where the backup taken before a schema upgrade of the database goes. Empty: beside a
        SQLite file, and in the state directory for a PostgreSQL dump (`pg_dump -Fc`).
        """,
    )
    upgrade_backups_kept = Integer(
        DEFAULT_KEPT,
        config=True,
        help="""Upgrade backups of the database kept; older ones are deleted after a new one.""",
    )
    upgrade_without_backup = Bool(
        False,
        config=True,
        help="""
        Upgrade the database even when no backup can be taken first (`pg_dump` missing or
        failing, a backup folder it cannot write). Off: the service refuses to start, and says
        why, rather than migrate a database it could not restore.
        """,
    )
    units_per_gpu = Integer(1, config=True, help="""fGPU units in one physical GPU.""")
    simulated_gpus = Unicode(
        "",
        config=True,
        help="""Simulated GPUs for hosts without any, e.g. "2x8GiB". Empty reads the real ones (NVML).""",
    )
    engine = CaselessStrEnum(
        ["docker", "swarm"],
        default_value="docker",
        config=True,
        help="""
        Where sessions run: `docker`, the one engine DOCKER_HOST names (single host); `swarm`, the
        Docker Swarm whose manager DOCKER_HOST names. In Swarm mode the nodes, their resource
        groups and GPUs come from the Swarm's node labels (`inventory.swarm_nodes`), read again
        every reconciler round, so a node that joins, drains or goes down changes what the queue
        places; sessions are services (`session_services.py`).
        """,
    )
    node_down_grace = Float(
        30.0,
        config=True,
        help="""
        Swarm mode: seconds a node may be down before its sessions end as lost and their slices
        are given back. A node that is back sooner (a reboot of the engine, a network blip) keeps
        its sessions. Waiting requests go to the other nodes at once either way.
        """,
    )
    resource_group = Unicode("default", config=True, help="""Resource group of this node.""")
    reserve_cpu = Float(0.0, config=True, help="""CPU cores of the node kept back from sessions.""")
    reserve_mem = ByteSpecification(
        "512M", config=True, help="""Memory of the node kept back from sessions (bytes or 1G...)."""
    )
    policy = CaselessStrEnum(
        ["fifo", "drf"],
        default_value="fifo",
        config=True,
        help="""Queue order: `fifo` (with bounded backfill) or `drf` (dominant resource fairness).""",
    )
    placement = CaselessStrEnum(
        ["best_fit", "fill", "spread"],
        default_value="best_fit",
        config=True,
        help="""Where a session goes: `best_fit` keeps GPUs whole; `fill` and `spread` as in Backend.AI.""",
    )
    max_skips = Integer(
        10,
        config=True,
        help="""How often later, smaller requests may overtake a waiting one before it is served first.""",
    )
    pending_timeout = Float(
        3600.0,
        config=True,
        help="""Seconds a request may wait before it ends as PENDING_TIMEOUT; 0 waits forever.""",
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
        the admin panel) apply as well. Keep the hub's `named_server_limit_per_user` at
        sessions + pending (the shipped jupyterhub_config.py derives both from FGPU_USER_QUOTA).
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
        presets' checks use them. Keep them equal to the spawner's (FGPUSpawner.cpu_min,
        cpu_max, cpu_default, mem_min, mem_max, mem_default, fgpu_max, fgpu_default), which
        judges every start; the shipped jupyterhub_config.py sets both from one dict. Keys and
        defaults: {SESSION_LIMITS} (mem in bytes).

            c.QueueService.session_limits = {{**SESSION_LIMITS, "fgpu_max": 2}}
        """,
    )
    spawner_service = Unicode(
        "fgpu-spawner",
        config=True,
        help="""Name of the hub service whose token the spawner presents; only it may ask for grants.""",
    )
    catalog_path = Unicode(
        "",
        config=True,
        help="""
        catalog.yaml that seeds the image catalog at every start (empty: the shipped one). Seeding
        adds new entries and follows the file's changes, but never undoes an instructor's edit.
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

            c.QueueService.engine_images_interval = 60
        """,
    )
    reconcile_interval = Float(
        5.0, config=True, help="""Seconds between full reconciliations of records and containers."""
    )
    thaw_frozen_after = Float(
        THAW_AFTER_SECONDS,
        config=True,
        help="""
        Seconds a session container may stay frozen (paused by hand, or a cgroup freezer left
        frozen) before the service thaws it; each thaw is logged and reported by `api/health`.
        Single-host mode only: in Swarm mode the containers are on other machines.

            c.QueueService.thaw_frozen_after = 60
        """,
    )
    remove_ended_servers = Bool(
        True,
        config=True,
        help="""
        Remove an ended session's named server from the hub once the hub has stopped it, so that
        the hub's home page does not list every stopped server forever (the Sessions page's
        Finished tab keeps the history). Failures are logged and tried again.
        """,
    )
    server_removal_interval = Float(
        5.0,
        config=True,
        help="""Seconds between two rounds that remove ended sessions' named servers from the hub.""",
    )
    start_grace = Float(
        180.0,
        config=True,
        help="""
        Seconds a grant may wait for its container to appear before the reconciler reclaims it
        (the spawn died with the hub, say). Keep it above the time the largest image takes to
        start, or slow starts lose their grant.
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
        """,
    )
    stats_interval = Float(
        5.0,
        config=True,
        help="""
        Seconds between two rounds of live stats (one `docker stats` call per running session,
        and NVML on GPU hosts). Pages and /metrics read the last round and never reach the engine.
        """,
    )
    utilization_interval = Float(
        60.0,
        config=True,
        help="""
        Seconds between two samples of the cluster's utilization (capacity, allocated and used
        CPU, memory and fGPU), kept in the service's DB for the Cluster page's charts and
        `api/utilization`. 0 takes no samples.
        """,
    )
    utilization_retention_days = Float(
        30.0,
        config=True,
        help="""Days the utilization samples are kept; older ones are deleted.""",
    )
    utilization_detail_hours = Float(
        24.0,
        config=True,
        help="""
        Hours each utilization sample is kept as it was taken; older ones are averaged into
        buckets of `utilization_bucket_seconds`, so a long-running hub keeps about
        detail / interval + retention / bucket rows (1440 + 4320 by default), not more.
        """,
    )
    utilization_bucket_seconds = Float(
        600.0,
        config=True,
        help="""Seconds of the buckets older utilization samples are averaged into.""",
    )
    cookie_secret_file = Unicode(
        "fgpu_queue_cookie_secret",
        config=True,
        help="""
        File holding the secret that signs the service's login and XSRF cookies, created (mode
        0600) when missing. Relative paths are in the state directory (where the hub starts), so
        that open pages stay logged in across a service restart.
        """,
    )
    deployment_id = Unicode(
        config=True,
        help="""
        Id of this hub's deployment: only session containers labelled with it (`fgpu.deployment`)
        are adopted or stopped, so hubs sharing an engine never touch each other's sessions.
        Default: read from `fgpu_deployment_id` in the working directory (the hub's state
        directory), made there on first start; the spawner gets the same from the config.
        """,
    )
    agent_service = Unicode(
        "fgpu-node-agent",
        config=True,
        help="""Name of the hub service whose token the node agents present; only it may report nodes.""",
    )
    node_report_stale = Float(
        20.0,
        config=True,
        help="""
        Seconds after which a node's last agent report no longer counts (its sessions' usage is
        unknown, not zero). Keep it a few times `node_agent_interval`.
        """,
    )
    node_agent_url = Unicode(
        "",
        config=True,
        help="""
        Where node agents reach this service, as seen from a Swarm node: the hub's public URL of
        the service, e.g. http://10.213.0.1:8000/services/queue/. Set, the service deploys the node
        agent on the Swarm its engine manages (a global service) at start, and again whenever the
        agent's code or token changed; empty (single-host mode), no agent is deployed.
        """,
    )
    node_agent_image = Unicode(
        "fgpu/jupyter-base:py3.11",
        config=True,
        help="""Image that runs the node agent (any with python3; every node must be able to pull it).""",
    )
    node_agent_interval = Float(
        5.0, config=True, help="""Seconds between two reports of a node agent."""
    )
    node_agent_docker_socket = Unicode(
        "/var/run/docker.sock",
        config=True,
        help="""
        The engine socket of each node, as the node sees it, bound into its agent. Swarm fills
        templates in it: in the Swarm lab, where /var/run/docker.sock is the machine's own engine,
        /var/lib/fgpu-swarm-lab/LAB/nodes/{{.Node.Hostname}}/docker.sock is each node's.
        """,
    )
    node_agent_registry = Unicode(
        "",
        config=True,
        help="""
        The site's registry (host:port) to which node agents push sessions saved as private
        images, so that any node can start them; empty, nothing is committed through an agent.
        """,
    )
    registry_auth_file = Unicode(
        "",
        config=True,
        help="""
        File with the credentials of `node_agent_registry` (JSON: `username`, `password`,
        `serveraddress`; not readable by every user): the service lists the registry's images
        with them, and its client logs in with them before it deploys the node agent, so that
        the nodes can pull the agent's image. Empty: the registry is asked without a login.
        """,
    )
    registry_ca = Unicode(
        "",
        config=True,
        help="""
        CA certificate (PEM) that `node_agent_registry`'s TLS certificate is checked against, for a
        registry whose certificate no public CA signed (the lab's). Empty: the system's CAs.
        """,
    )
    node_agent_deploy_interval = Float(
        60.0,
        config=True,
        help="""
        Seconds between two checks that every Swarm node runs its agent, with its own key: a node
        that joined gets its agent within this time, one that left loses its agent and key.
        """,
    )
    node_credentials_file = Unicode(
        CREDENTIALS_FILE,
        config=True,
        help="""
        File holding each Swarm node's own key, with which its agent signs its reports (mode
        0600, made when missing; relative paths are in the state directory). Keep it as private
        as the hub's database: a key lets its holder report for that node.
        """,
    )
    node_agent_token_file = Unicode(
        TOKEN_FILE,
        config=True,
        help="""
        File holding the node agents' hub API token (the shipped config declares the
        `fgpu-node-agent` service with it), made (mode 0600) when missing; relative paths are in
        the state directory. The service hands it to the agents as a Swarm secret.
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
        """,
    )
    idle_timeout = Float(
        0.0,
        config=True,
        help="""
        The idle culler's timeout in seconds (the shipped config passes FGPU_IDLE_TIMEOUT): the
        Sessions page and the session itself are told when an unused session will be stopped.
        0: no culler runs, no idle end is predicted.
        """,
    )
    lifetime_warning = Float(
        600.0,
        config=True,
        help="""
        Seconds before an automatic end (a group's `max_session_lifetime`, an idle cull) that the
        session is warned: a line on the Sessions page, ~/FGPU-WARNING.txt in the session and, for
        a lifetime end, a message in its terminals.
        """,
    )
    ends_interval = Float(
        5.0,
        config=True,
        help="""
        Seconds between two checks of the sessions' automatic ends: a session over its lifetime
        is stopped within this long, and warnings are given as close to their lead.
        """,
    )
    service_url = Unicode(config=True, help="""Where to listen (JUPYTERHUB_SERVICE_URL).""")
    service_prefix = Unicode(config=True, help="""URL prefix (JUPYTERHUB_SERVICE_PREFIX).""")

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

    async def read_swarm_nodes(self) -> None:
        """Read the Swarm's nodes (every round: nodes join, drain and fail); a change of the
        inventory is logged and given to the queue, whose next pass places on it."""
        nodes = await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: inventory.swarm_nodes(
                [n.attrs for n in self.docker.nodes.list()], self.reserve_cpu, self.reserve_mem
            ),
        )
        found = [scheduler_node(node) for node in nodes if not self.isolation_refused(node.name)]
        if found == self.manager.nodes and self.manager.engine_problem is None:
            return
        described = ", ".join(
            f"{n.name} ({n.resource_group}: {n.cpu:g} CPU, {len(n.gpus)} GPU)" for n in found
        )
        self.log.info("Swarm nodes taking sessions: %s", described or "none")
        withheld = {
            n.name: self._refused_nodes[n.name] for n in nodes if self._refused_nodes[n.name]
        }
        await self.manager.replace_nodes(found, withheld)

    def isolation_refused(self, node: str) -> bool:
        """Whether `node`'s agent reports an engine setting that lets sessions reach one another
        or gain privileges: no session is placed there (its running ones go on, as on a paused
        node) until it is fixed. Unknown (no fresh report, an older agent) is flagged by the
        health check and doctor, not refused: nodes run no agent in some setups (docs/source/howto/swarm.md,
        "Swarm mode"), and the first reports come a few seconds after the hub starts."""
        report = self.node_reports.fresh(node)
        wrong = [] if report is None else wrong_daemon_settings(report.daemon)
        if wrong and self._refused_nodes.get(node) != wrong:  # said once, not every round
            self.log.warning(
                "Node %s takes no sessions: its engine has %s wrong; %s",
                node,
                " and ".join(wrong),
                DAEMON_FIX,
            )
        self._refused_nodes[node] = wrong
        return bool(wrong)

    async def discover_node(self) -> None:
        """Read the node from the engine, once: at start, or when the engine first answers."""
        if self.engine == "swarm":
            await self.read_swarm_nodes()
            return
        if self.manager.nodes:
            return
        node = await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: inventory.discover_local_node(
                self.docker,
                resource_group=self.resource_group,
                simulated_spec=self.simulated_gpus or None,
                reserve_cpu=self.reserve_cpu,
                reserve_mem=self.reserve_mem,
            ),
        )
        self.log.info(
            "Node %s: %g CPU, %d bytes, %d GPU(s)%s",
            node.name,
            node.cpu,
            node.mem,
            len(node.gpus),
            " (simulated)" if node.simulated else "",
        )
        await self.manager.replace_nodes([scheduler_node(node)])

    def session_lister(self, docker_client):
        """How the reconciler lists what runs: containers on one engine, or Swarm services."""
        if self.engine == "swarm":
            return SwarmSessionLister(docker_client, self.node_down_grace, time.time)
        return DockerSessionLister(docker_client)

    def build(self) -> web.Application:
        # Connected on first use: the service starts, and answers, while the engine is down.
        docker_client = self.docker = Engine(timeout=30)
        try:
            self.registry_auth()  # a bad credentials file stops the service here, named
        except RegistryAuthError as e:
            self.log.critical("Not starting: QueueService.registry_auth_file: %s", e)
            raise SystemExit(1) from None
        self.hub = HubClient()
        self.quotas = QuotaBook(self.user_quota, log=self.log)
        settings = SchedulerSettings(
            units_per_gpu=self.units_per_gpu,
            policy=self.policy,
            placement=self.placement,
            max_skips=self.max_skips,
            pending_timeout=self.pending_timeout,
        )
        try:
            db = open_database(self.db_url, self.upgrade_backups(), self.log)
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
        self.manager = QueueManager(db, [], settings, self.quotas)
        self.manager.engine_problem = ENGINE_NOT_YET
        # Usage accounting and budgets (usage_store.py): files each session's use as it ends.
        self.usage = UsageBook(db, self.manager.group_of_node, quotas=self.quotas)
        self.manager.admission_check = self.usage.admission_check
        self.images = ImageStore(db)
        self.server_remover = ServerRemover(
            db,
            self.hub,
            lambda: {(r.user, r.server_name) for r in self.manager.active_records()},
            log=self.log,
        )
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
        calls = ContainerCalls(log=self.log)
        locks = ContainerLocks()
        # Single-host mode: the service reads the freezer of the sessions' containers itself.
        freeze = (
            FreezeWatch(calls, docker_client, thaw_after=self.thaw_frozen_after, log=self.log)
            if self.engine == "docker"
            else None
        )
        self.reconciler = Reconciler(
            self.manager,
            docker_client,
            log=self.log,
            start_grace=self.start_grace,
            hub=self.hub,
            respawn_grace=self.respawn_grace,
            deployment_id=self.deployment_id,
            # Until the node is read and the containers counted, no slice is granted and a
            # spawn is refused at once with 503: the engine's state is unknown.
            prepare=self.discover_node,
            sessions=self.session_lister(docker_client),
            watch=freeze.check if freeze else None,
            calls=calls,
        )
        self.stats = StatsSampler(
            docker_client,
            self.manager.running_ids,
            interval=self.stats_interval,
            read_gpus=not self.simulated_gpus,
            log=self.log,
            calls=calls,
        )
        self.node_reports = NodeReports(stale_after=self.node_report_stale)
        self.node_credentials = NodeCredentials(self.node_credentials_file)
        self._agents_lock = asyncio.Lock()
        self._refused_nodes: dict[str, list[str]] = {}
        # In Swarm mode a session's usage is read on its node, by the node's agent.
        self.manager.usage_of = (
            self.node_reports.usage if self.engine == "swarm" else self.stats.usage
        )
        # Cluster utilization over time (utilization_store.py), for the Cluster page's charts.
        self.utilization = UtilizationLog(
            db,
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
            notifier=DockerNotifier(docker_client, calls, locks) if freeze else None,
            end_notice=self._end_notice(),
            log=self.log,
        )
        self.manager.ends_of = self.automatic_ends.view
        self.health = HealthMonitor(
            self.manager,
            self.reconciler,
            lambda: select_one(db),
            self.reconcile_interval,
            containers=lambda: containers_check(
                calls.unresponsive(),
                freeze.frozen() if freeze else [],
                freeze.thaws() if freeze else [],
            ),
            node_daemons=(
                (lambda: node_daemons_check(self.node_reports.nodes()))
                if self.engine == "swarm"
                else None
            ),
        )
        prefix = self.service_prefix
        return web.Application(
            handlers.routes(prefix),
            **handlers.pages.settings(prefix, simulated=bool(self.simulated_gpus)),
            manager=self.manager,
            history=History(db),
            hub_client=self.hub,
            launcher=Launcher(self.hub, self.manager),
            automatic_ends=self.automatic_ends,
            quotas=self.quotas,
            usage=self.usage,
            utilization=self.utilization,
            images=self.images,
            image_builds=self.builds,
            look_at_engine_images=self.look_at_engine_images,
            docker=docker_client,
            # Committing a session copies its whole writable layer: minutes, not seconds.
            docker_commits=Engine(timeout=COMMIT_TIMEOUT_SECONDS),
            # Their own threads: minutes-long commits must not hold the default executor, which
            # the reconciler and every other engine call use.
            commit_executor=ThreadPoolExecutor(COMMIT_WORKERS, thread_name_prefix="fgpu-commit"),
            container_locks=locks,
            spawner_service=self.spawner_service,
            # A typo in the site's presets stops the service here, with the preset named.
            site_presets=parse_presets(self.presets, "QueueService.presets"),
            session_limits={**SESSION_LIMITS, **self.session_limits},
            agent_service=self.agent_service,
            node_reports=self.node_reports,
            node_identity=NodeIdentity(self.node_credentials),
            rotate_node_key=self.rotate_node_key,
            node_agent_registry=self.node_agent_registry,
            engine=self.engine,
            health=self.health,
            cookie_secret=read_or_create_secret(self.cookie_secret_file),
        )

    async def serve(self) -> None:
        app = self.build()
        url = urlparse(self.service_url)
        # Before the first answer: the launcher must never offer an image that is not built yet.
        await asyncio.to_thread(self.look_at_engine_images)
        await listen_when_free(app, url.port or 80, url.hostname, self.log)
        self.log.info("Queue service listening on %s%s", self.service_url, self.service_prefix)
        if self.node_agent_url:
            await self.deploy_node_agents()
            self._agents_task = asyncio.create_task(self.keep_node_agents_deployed())
        try:
            await self.reconciler.reconcile()
        except Exception as e:  # the engine is down: the reconciler's rounds try again
            self.log.warning("Queue service started without the Docker engine: %s", e)
        # Sessions that ended while no service of this version ran, with their nodes now known.
        self.log.info("Usage: %d ended sessions filed", await self.usage.file_unfiled())
        await self.quotas.refresh_users((r.user for r in self.manager.active_records()), self.hub)
        await self.manager.schedule()
        self._stats_task = asyncio.create_task(self.stats.run())
        if self.remove_ended_servers:
            self._removal_task = asyncio.create_task(
                self.server_remover.run(self.server_removal_interval)
            )
        if self.utilization_interval > 0:
            self._utilization_task = asyncio.create_task(self.utilization.run())
        self._ends_task = asyncio.create_task(self.automatic_ends.run(self.ends_interval))
        if self.engine_images_interval > 0 and self._images_can_be_looked_at():
            self._engine_images_task = asyncio.create_task(self.watch_engine_images())
        self._builds_task = asyncio.create_task(self.builds.run())
        await self.reconciler.run(self.reconcile_interval)

    def _images_can_be_looked_at(self) -> bool:
        # In Swarm mode without a registry, the nodes' images are the site's business: all offered.
        return self.engine == "docker" or bool(self.node_agent_registry)

    def _end_notice(self) -> EndNotice | None:
        if not self.proxy_url:
            return None
        base_url = os.environ.get("JUPYTERHUB_BASE_URL", "/")
        return EndNotice(self.proxy_url, base_url, self.hub.token, log=self.log)

    @property
    def builds_here(self) -> bool:
        return self.build_in_background and self.engine == "docker"

    def look_at_engine_images(self) -> None:
        """Blocking: note which catalog images the sessions' engine can run: the local engine's
        images, or in Swarm mode those the site's registry holds (registry_images.py)."""
        if self.engine_images_interval <= 0 or not self._images_can_be_looked_at():
            return
        try:
            self.images.note_engine_images(self._runnable_references())
        except Exception as e:  # the engine or registry is away: keep what was seen last
            self.log.warning("Could not list the images sessions can run: %s", e)

    def _runnable_references(self) -> set[str]:
        if self.engine == "docker":
            return engine_references(self.docker)
        wanted = {view["image"] for view in self.images.all()}
        found = registry_digests(
            self.node_agent_registry, wanted, self.registry_auth(), self.registry_ca or None
        )
        for moved in self.images.pin_digests(found):
            self.log.warning(
                "The registry's tag %s points at another image than the one pinned: sessions keep "
                "the pinned one until an admin checks the image again",
                moved,
            )
        return set(found)

    async def watch_engine_images(self) -> None:
        while True:
            await asyncio.sleep(self.engine_images_interval)
            await asyncio.to_thread(self.look_at_engine_images)

    def registry_auth(self) -> dict[str, str] | None:
        """The registry's credentials, or None without a file; a bad file raises
        RegistryAuthError, which says what is wrong with it."""
        return read_registry_auth(self.registry_auth_file) if self.registry_auth_file else None

    def _log_in_to_registry(self) -> None:
        # docker-py then sends the credentials with the agents' services: their nodes pull the
        # agent's image with them.
        auth = self.registry_auth()
        if auth is not None:
            log_in(self.docker.api, auth)

    def _agent_settings(self) -> AgentSettings:
        return AgentSettings(
            token=node_agent_token(self.node_agent_token_file),
            report_url=self.node_agent_url,
            image=pinned_image(
                self.node_agent_image,
                self.node_agent_registry,
                {v["image"]: v["digest"] for v in self.images.all() if v["digest"]},
            ),
            name=self.agent_service,
            interval=self.node_agent_interval,
            deployment_id=self.deployment_id,
            docker_socket=self.node_agent_docker_socket,
            registry_auth=json.dumps(auth, sort_keys=True)
            if (auth := self.registry_auth())
            else None,
        )

    async def deploy_node_agents(self) -> None:
        """Deploy (or update) every node's agent; a failure is logged, not fatal: the service
        works without reports, with usage of other nodes' sessions unknown."""
        try:
            await asyncio.to_thread(self._log_in_to_registry)
            async with self._agents_lock:
                services = await asyncio.to_thread(
                    deploy_node_agents, self.docker, self.node_credentials, self._agent_settings()
                )
            self.log.debug("Node agents deployed: %s", ", ".join(s.name for s in services))
        except Exception as e:
            self.log.error("Could not deploy the node agents: %s", e)

    async def keep_node_agents_deployed(self) -> None:
        while True:
            await asyncio.sleep(self.node_agent_deploy_interval)
            await self.deploy_node_agents()

    async def rotate_node_key(self, node: str):
        """A new key for `node`'s agent, which moves to it now (api/nodes/{node}/key)."""
        if not self.node_agent_url:
            raise Refusal("No node agents are deployed here (single-host mode).", "conflict")
        await asyncio.to_thread(self._log_in_to_registry)
        async with self._agents_lock:
            return await asyncio.to_thread(
                rotate_node_key,
                self.docker,
                self.node_credentials,
                self._agent_settings(),
                node,
            )

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
            app.listen(port, host, max_body_size=MAX_BODY_BACKSTOP)
            return
        except OSError as e:
            if e.errno != errno.EADDRINUSE or asyncio.get_running_loop().time() > deadline:
                raise
            log.warning("Port %s is still in use; trying again", port)
            await asyncio.sleep(0.5)


main = QueueService.launch_instance
