"""Builders of the scheduler core's values for its tests: a node, a pending request, a held
allocation (tests/test_scheduler.py and the tests of the core's other modules)."""

from __future__ import annotations

import itertools

from queue_service.core.resource_model import Allocation, Gpu, Node, Request, Slots

GIB = 2**30
_seq = itertools.count(1)


def node(name="node-0", gpus=1, cpu=16.0, mem=64 * GIB, group="default") -> Node:
    return Node(
        name, group, cpu, mem, tuple(Gpu(f"{name}-gpu{i}", 8 * GIB, 80) for i in range(gpus))
    )


def req(rid, fgpu=0.0, cpu=1.0, mem=GIB, user="alice", groups=(), rg=None, skips=0, seq=None):
    seq = next(_seq) if seq is None else seq
    return Request(rid, user, groups, Slots(cpu, mem, fgpu), rg, seq, skips)


def held(rid, node_name, gpus, fgpu, cpu=1.0, mem=GIB, user="someone", groups=()) -> Allocation:
    return Allocation(rid, user, groups, Slots(cpu, mem, fgpu), node_name, gpus)
