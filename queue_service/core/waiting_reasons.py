"""Why a request waits for capacity, in words: the largest free amounts per resource group at the
end of a pass (`_GroupSummaries`), and the sentence naming what is short. A wait for a quota is
worded by quota_wording.py. Pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from fgpu_shared.units import format_size
from queue_service.core.placement import _Cluster
from queue_service.core.resource_model import MILLICORES_PER_CORE, QUANTA_PER_GPU, Slots, _Need
from queue_service.core.slot_wording import _cores, _describe, _fgpu, _gpu_name, _quanta_fgpu


class _GroupSummaries:
    """The largest free amounts per resource group at the end of a pass, to explain waits.

    For multi-GPU requests one number is not enough (1.5 GPUs fit one whole GPU beside a half-free
    one), so `spans` keeps, per group and per count of wholly free GPUs on a node, the most free
    quanta on a partly used GPU of such a node.
    """

    def __init__(self, cluster: _Cluster):
        self.cpu: dict[str, tuple[int, str]] = {}
        self.mem: dict[str, tuple[int, str]] = {}
        self.gpu: dict[str, tuple[int, str]] = {}
        self.spans: dict[str, dict[int, tuple[int, str]]] = defaultdict(dict)
        for state in cluster.nodes:
            g = state.group
            _keep_max(self.cpu, g, state.cpu, state.name)
            _keep_max(self.mem, g, state.mem, state.name)
            for gi, q in enumerate(state.free):
                _keep_max(self.gpu, g, q, _gpu_name(state.name, gi))
            partial = max((q for q in state.free if q < QUANTA_PER_GPU), default=0)
            _keep_max(self.spans[g], state.whole, partial, state.name)

    def _most(self, table: dict[str, tuple[int, str]], groups: Sequence[str]) -> tuple[int, str]:
        return max((table[g] for g in groups if g in table), default=(0, ""), key=lambda t: t[0])

    def might_fit(self, need: _Need, groups: Sequence[str]) -> bool:
        """Whether each resource on its own is free somewhere (a node may still lack them together)."""
        return (
            self._most(self.cpu, groups)[0] >= need.cpu
            and self._most(self.mem, groups)[0] >= need.mem
            and self._gpu_shortfall(need, groups) is None
        )

    def _gpu_shortfall(self, need: _Need, groups: Sequence[str]) -> tuple[int, str] | None:
        """None when some node's GPUs could hold `need`; else (most free, where) to report."""
        if need.gq == 0:
            return None
        if need.whole == 0:
            most = self._most(self.gpu, groups)
            return None if most[0] >= need.rest else most
        most_whole = (0, "")
        for group in groups:
            for whole, (partial, node) in self.spans.get(group, {}).items():
                spare = whole - need.whole
                if spare > 0 or (spare == 0 and partial >= need.rest):
                    return None
                most_whole = max(most_whole, (whole, node), key=lambda t: t[0])
        return most_whole

    def shortfall(self, need: _Need, slots: Slots, groups: Sequence[str], units: float) -> str:
        short = self._gpu_shortfall(need, groups)
        if short is not None:
            free, where = short
            if need.whole == 0:
                if free <= 0:
                    return f"waiting for {_fgpu(slots.fgpu)}; every GPU is fully in use"
                return (
                    f"waiting for {_fgpu(slots.fgpu)}; the most free on one GPU is "
                    f"{_quanta_fgpu(free, units)} ({where})"
                )
            if need.gpus_needed == 1:
                # One whole GPU, and none is wholly free anywhere (else it would not wait).
                return f"waiting for {_fgpu(slots.fgpu)}, which needs a whole GPU; none is free"
            return (
                f"waiting for {_fgpu(slots.fgpu)}, which spans {need.gpus_needed} GPUs on one "
                f"node; the most wholly free GPUs on one node is {free}"
                + (f" ({where})" if free else "")
            )
        cpu, cpu_node = self._most(self.cpu, groups)
        if cpu < need.cpu:
            return (
                f"waiting for {_cores(slots.cpu)}; the most free on one node is "
                f"{max(cpu, 0) / MILLICORES_PER_CORE:g} ({cpu_node})"
            )
        mem, mem_node = self._most(self.mem, groups)
        if mem < need.mem:
            return (
                f"waiting for {format_size(slots.mem)} memory; the most free on one node is "
                f"{format_size(max(mem, 0))} ({mem_node})"
            )
        return f"waiting for one node with {_describe(slots)} free at once"


def _keep_max(table: dict, key, value: int, name: str) -> None:
    if key not in table or value > table[key][0]:
        table[key] = (value, name)
