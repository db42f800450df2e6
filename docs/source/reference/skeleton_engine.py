"""A skeleton engine backend: the least a third place for sessions needs (docs/source/reference/engines.md).

Its nodes are a setting, and nothing runs on them: sessions would start through a spawner of
its own (a Kubernetes or Slurm one), and a real backend lists them, reads their usage and their
jobs' ends and logs from there. It passes the backend contract tests
(tests/test_engine_contract.py), as the shipped Docker and Swarm engines do.

    c.QueueService.engine_class = "skeleton_engine.SkeletonEngine"
    c.SkeletonEngine.nodes = {"node-1": "1x16GiB"}
"""

from __future__ import annotations

from traitlets import Dict, Float

from queue_service.engine import inventory
from queue_service.engine.backend import EngineBackend, NodeReading


class SkeletonEngine(EngineBackend):
    """Fixed nodes with simulated GPUs; no session, job or image of its own."""

    nodes_change = False

    nodes = Dict(
        {"skeleton-1": "1x8GiB"},
        config=True,
        help="""
        The nodes sessions could run on: their names, each with its simulated GPUs.

        Example::

            c.SkeletonEngine.nodes = {"node-1": "1x16GiB", "node-2": "2x8GiB"}
        """,
    )
    node_cpu = Float(
        8.0,
        config=True,
        help="""
        CPU cores of each node.

        Example::

            c.SkeletonEngine.node_cpu = 32
        """,
    )

    async def read_nodes(self) -> NodeReading:
        return NodeReading(
            [
                inventory.NodeInfo(
                    name,
                    "default",
                    self.node_cpu - self.reserve_cpu,
                    64 * 2**30 - self.reserve_mem,
                    inventory.parse_simulated_gpus(gpus, node=name),
                    simulated=True,
                )
                for name, gpus in self.nodes.items()
            ]
        )

    def describe(self, nodes: list[inventory.NodeInfo]) -> str:
        return "Skeleton nodes: " + ", ".join(node.name for node in nodes)

    def session_lister(self):
        return NoSessions()

    def usage_of(self, session_id: str) -> dict | None:
        return None

    @property
    def images_listable(self) -> bool:
        return False  # every image of the catalog is offered

    def runnable_images(self, wanted):
        return {}

    def watch_job_exits(self, job_ends):
        return job_ends.look()  # asks `exited_jobs` every second

    def job_exit(self, session_id: str):
        return None

    def remove_job(self, session_id: str) -> None:
        pass

    def job_log(self, session_id: str, lines: int) -> str | None:
        return None

    def follow_job_log(self, session_id: str, tail: int):
        return None


class NoSessions:
    """The reconciler's view of what runs: {session id: its labelled container or service}."""

    def __call__(self) -> dict:
        return {}

    def why_gone(self, session_id: str) -> str | None:
        return None

    def remove_gone(self, session_ids) -> None:
        pass
