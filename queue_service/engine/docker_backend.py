"""Sessions on one Docker engine, the one DOCKER_HOST names (single-host mode): see backend.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from . import folder_write_stops, inventory, job_containers
from .backend import EngineBackend, JobExit, LogStream, NodeReading
from .session_containers import DockerSessionLister
from .stats import StatsSampler


class DockerBackend(EngineBackend):
    """One node, this engine's, read once; sessions are its containers, sampled by `stats`."""

    sessions_here = True
    nodes_change = False

    def __init__(
        self,
        client,
        stats: StatsSampler,
        resource_group: str,
        simulated_gpus: str,
        reserve_cpu: float,
        reserve_mem: int,
    ) -> None:
        super().__init__(client)
        self.stats = stats
        self.resource_group = resource_group
        self.simulated_gpus = simulated_gpus
        self.reserve_cpu = reserve_cpu
        self.reserve_mem = reserve_mem

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
