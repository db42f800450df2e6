"""Sessions on one Docker engine, the one DOCKER_HOST names (single-host mode): see backend.py.

`c.QueueService.engine_class = "docker"` (the default) picks it; its settings are
`c.DockerEngine.…`. The service's own machine is the one node, read once; sessions are its
containers, whose usage `stats` samples, whose freezer the service watches, and inside which it
warns of an end by `docker exec`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from traitlets import Float, Unicode

from . import folder_write_stops, inventory, job_containers
from .backend import EngineBackend, JobExit, LogStream, NodeReading
from .client import Engine
from .container_commits import commit_container
from .frozen_containers import THAW_AFTER_SECONDS, FreezeWatch
from .local_images import remove_image
from .session_containers import DockerSessionLister
from .session_exec import SessionExec
from .session_warnings import DockerNotifier
from .stats import StatsSampler
from .volumes import inspect_volume_with

#: How long the engine may take to commit a session to a private image.
COMMIT_TIMEOUT_SECONDS = 600
#: Commits that may wait on the engine at once; more wait their turn.
COMMIT_WORKERS = 2


class DockerEngine(EngineBackend):
    """One node, this engine's, read once; sessions are its containers, sampled by `stats`."""

    nodes_change = False
    builds_images = True

    resource_group = Unicode(
        "default",
        config=True,
        help="""
        Resource group of this node.

        Example::

            c.DockerEngine.resource_group = "gpu-a100"
        """,
    )
    simulated_gpus = Unicode(
        "",
        config=True,
        help="""
        Simulated GPUs for hosts without any, e.g. "2x8GiB". Empty reads the real ones (NVML).

        Example::

            c.DockerEngine.simulated_gpus = "4x16GiB"
        """,
    )
    thaw_frozen_after = Float(
        THAW_AFTER_SECONDS,
        config=True,
        help="""
        Seconds a session container may stay frozen (paused by hand, or a cgroup freezer left
        frozen) before the service thaws it; each thaw is logged and reported by `api/health`.
        Single-host mode only: in Swarm mode the containers are on other machines.

        Example::

            c.DockerEngine.thaw_frozen_after = 300
        """,
    )
    stats_interval = Float(
        5.0,
        config=True,
        help="""
        Seconds between two rounds of live stats (one `docker stats` call per running session,
        and NVML on GPU hosts). Pages and /metrics read the last round and never reach the engine.

        Example::

            c.DockerEngine.stats_interval = 15
        """,
    )

    def __init__(self, client, hooks, **kwargs) -> None:
        super().__init__(client, hooks, **kwargs)
        self.stats = StatsSampler(
            client,
            hooks.running_ids,
            interval=self.stats_interval,
            read_gpus=not self.simulated_gpus,
            log=self.log,
            calls=hooks.container_calls,
        )
        # Committing a session copies its whole writable layer: minutes, not seconds, on a client
        # and threads of their own, so that the reconciler's and other engine calls go on.
        self._commits = Engine(timeout=COMMIT_TIMEOUT_SECONDS)
        self._commit_threads = ThreadPoolExecutor(COMMIT_WORKERS, thread_name_prefix="fgpu-commit")
        self._freeze = FreezeWatch(
            hooks.container_calls, client, thaw_after=self.thaw_frozen_after, log=self.log
        )

    @property
    def gpus_simulated(self) -> bool:
        return bool(self.simulated_gpus)

    async def start(self) -> None:
        self._stats_task = asyncio.create_task(self.stats.run())

    def watch_job_exits(self, job_ends):
        # The engine's `die` events say when a job's container exits.
        return job_ends.watch()

    def freeze_watch(self) -> FreezeWatch:
        return self._freeze

    async def commit_session(self, session_id: str, node: str, commit):
        committed = await asyncio.get_running_loop().run_in_executor(
            self._commit_threads,
            commit_container,
            self._commits,
            session_id,
            commit,
            self.hooks.container_locks,
        )
        return committed, lambda: remove_image(self._commits, committed["id"])

    def volume_inspector(self):
        return inspect_volume_with(self.client)

    def session_exec(self) -> SessionExec:
        hooks = self.hooks
        return SessionExec(self.client, hooks.container_locks, hooks.deployment_id)

    def session_notifier(self) -> DockerNotifier:
        hooks = self.hooks
        return DockerNotifier(self.client, hooks.container_calls, hooks.container_locks)

    async def read_nodes(self) -> NodeReading:
        node = await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: inventory.discover_local_node(
                self.client,
                resource_group=self.resource_group,
                simulated_spec=self.simulated_gpus or None,
                reserve_cpu=self.reserve_cpu,
                reserve_mem=self.reserve_mem,
            ),
        )
        return NodeReading([node])

    def describe(self, nodes: list[inventory.NodeInfo]) -> str:
        return "; ".join(
            f"Node {node.name}: {node.cpu:g} CPU, {node.mem} bytes, {len(node.gpus)} GPU(s)"
            + (" (simulated)" if node.simulated else "")
            for node in nodes
        )

    def session_lister(self) -> DockerSessionLister:
        return DockerSessionLister(self.client)

    def usage_of(self, session_id: str) -> dict | None:
        return self.stats.usage(session_id)

    @property
    def images_listable(self) -> bool:
        return True

    def runnable_images(self, wanted: Iterable[str]) -> dict[str, str | None]:
        # Every image the engine holds, whatever `wanted`: one call lists them all.
        return dict.fromkeys(engine_references(self.client))

    def job_exit(self, session_id: str) -> JobExit | None:
        container = job_containers.job_container(self.client, session_id)
        if container is None:
            return None
        code = job_containers.exit_code(container)
        if code is None:
            return None, ""
        return code, job_containers.log_tail(self.client, container)

    def stop_folder_writes(self, session_id: str, source: str) -> bool:
        return bool(folder_write_stops.stop_folder_writes(self.client, session_id, source))

    def remove_job(self, session_id: str) -> None:
        container = job_containers.job_container(self.client, session_id)
        if container is not None:
            job_containers.remove(container)

    def job_log(self, session_id: str, lines: int) -> str | None:
        container = job_containers.job_container(self.client, session_id)
        return (
            None
            if container is None
            else job_containers.running_tail(self.client, container, lines)
        )

    def follow_job_log(self, session_id: str, tail: int) -> LogStream | None:
        container = job_containers.job_container(self.client, session_id)
        return (
            None if container is None else job_containers.follow_log(self.client, container, tail)
        )


def engine_references(client) -> set[str]:
    """Every image reference the engine holds, as a catalog may spell it ("x" is "x:latest")."""
    tags = {tag for image in client.api.images() for tag in image.get("RepoTags") or ()}
    return tags | {tag.removesuffix(":latest") for tag in tags if tag.endswith(":latest")}
