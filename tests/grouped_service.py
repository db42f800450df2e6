"""The real queue service with more than one resource group on this one host, for hub tests.

The single-host service knows one node, the hub's engine, in `DockerEngine.resource_group`; a site
gets more groups from more nodes. Here, as in the Swarm lab where every node sees the whole
machine, sibling nodes of other groups are put next to the engine's node with the manager's own
`set_nodes`, each with simulated GPUs; sessions granted on them run on the one engine (the
single-host spawner). Everything else is the shipped service. The hub runs it as its `queue`
service (`grouped_hub` in conftest.py):

    python tests/grouped_service.py --GroupedQueueService.siblings='{"gpu-a100": {"a100-1": "2x40GiB"}}' ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The code of the tree this file is in, whatever the service's working directory.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from traitlets import Unicode  # noqa: E402

from queue_service.app import QueueService  # noqa: E402
from queue_service.core import resource_model  # noqa: E402
from queue_service.engine import inventory


def sibling_nodes(local: resource_model.Node, groups: dict) -> list[resource_model.Node]:
    """{group: {node name: simulated GPU spec}} → nodes with the local node's CPU and memory."""
    return [
        resource_model.Node(
            name,
            group,
            local.cpu,
            local.mem,
            tuple(
                resource_model.Gpu(gpu.uuid, gpu.memory_bytes, gpu.sm_count)
                for gpu in inventory.parse_simulated_gpus(spec, node=name)
            ),
        )
        for group, nodes in groups.items()
        for name, spec in nodes.items()
    ]


class GroupedQueueService(QueueService):
    siblings = Unicode(
        "{}",
        config=True,
        help="""JSON {group: {node name: simulated GPU spec}}: nodes added next to the engine's.""",
    )

    async def discover_node(self) -> None:
        if self.manager.nodes:
            return
        await super().discover_node()
        (local,) = self.manager.nodes
        self.manager.set_nodes([local, *sibling_nodes(local, json.loads(self.siblings))])


if __name__ == "__main__":
    GroupedQueueService.launch_instance()
