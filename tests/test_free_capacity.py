"""Free capacity on its own: what is left per node and GPU."""

from __future__ import annotations

from queue_service.core.free_capacity import free_capacity

from .core_values import GIB, held, node


def test_free_capacity_per_node_and_gpu():
    nodes = [node("a", gpus=2, cpu=8, mem=16 * GIB)]
    allocations = [held("x", "a", {"a-gpu0": 1.0, "a-gpu1": 0.25}, 2.5, cpu=3, mem=4 * GIB)]
    (free,) = free_capacity(nodes, allocations, units_per_gpu=2)
    assert (free.cpu_free, free.mem_free) == (5.0, 12 * GIB)
    assert [(g.uuid, g.fraction_free, g.fgpu_free) for g in free.gpus] == [
        ("a-gpu0", 0.0, 0.0),
        ("a-gpu1", 0.75, 1.5),
    ]
    assert free.fgpu_free == 1.5
