"""Free capacity: what is left on every node and each of its GPUs once the allocations are taken
off, for pages and progress messages, and as the start of a pass's placement state. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from queue_service.core.resource_model import (
    MILLICORES_PER_CORE,
    QUANTA_PER_GPU,
    Allocation,
    Node,
    _check_units,
    _millicores,
    fraction_quanta,
)


@dataclass(frozen=True)
class GpuFree:
    uuid: str
    index: int
    fraction_free: float
    fgpu_free: float


@dataclass(frozen=True)
class NodeFree:
    name: str
    resource_group: str
    cpu_total: float
    cpu_free: float
    mem_total: int
    mem_free: int
    gpus: tuple[GpuFree, ...]

    @property
    def fgpu_free(self) -> float:
        return sum(gpu.fgpu_free for gpu in self.gpus)


def _node_free(
    nodes: Sequence[Node], allocations: Iterable[Allocation]
) -> dict[str, tuple[int, int, list[int]]]:
    """Per node name: free millicores, free bytes and free quanta per GPU, in the node's GPU order."""
    free = {n.name: [_millicores(n.cpu), n.mem, [QUANTA_PER_GPU] * len(n.gpus)] for n in nodes}
    gpu_slot = {(n.name, g.uuid): i for n in nodes for i, g in enumerate(n.gpus)}
    for a in allocations:
        entry = free.get(a.node)
        if entry is None:  # a node that left the inventory holds nothing we can place on
            continue
        entry[0] -= _millicores(a.slots.cpu)
        entry[1] -= a.slots.mem
        for uuid, fraction in a.gpus.items():
            index = gpu_slot.get((a.node, uuid))
            if index is not None:
                entry[2][index] -= fraction_quanta(fraction)
    return {name: (cpu, mem, gpus) for name, (cpu, mem, gpus) in free.items()}


def free_capacity(
    nodes: Sequence[Node], allocations: Iterable[Allocation], units_per_gpu: float = 1
) -> tuple[NodeFree, ...]:
    """What is free on every node and GPU, for pages and progress messages."""
    _check_units(units_per_gpu)
    free = _node_free(nodes, allocations)
    result = []
    for n in nodes:
        cpu, mem, gpus = free[n.name]
        result.append(
            NodeFree(
                name=n.name,
                resource_group=n.resource_group,
                cpu_total=n.cpu,
                cpu_free=cpu / MILLICORES_PER_CORE,
                mem_total=n.mem,
                mem_free=mem,
                gpus=tuple(
                    GpuFree(
                        uuid=g.uuid,
                        index=i,
                        fraction_free=q / QUANTA_PER_GPU,
                        fgpu_free=q * units_per_gpu / QUANTA_PER_GPU,
                    )
                    for i, (g, q) in enumerate(zip(n.gpus, gpus, strict=True))
                ),
            )
        )
    return tuple(result)
