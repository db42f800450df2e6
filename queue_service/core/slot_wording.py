"""How the core words amounts in its messages: CPU cores, memory, fGPU, a GPU by its node, and
whose quota ("your", "group 'students'"). Pure."""

from __future__ import annotations

from fgpu_shared.units import format_size
from queue_service.core.resource_model import QUANTA_PER_GPU, Slots


def _cores(cpu: float) -> str:
    return f"{cpu:g} CPU core" + ("" if cpu == 1 else "s")


def _fgpu(fgpu: float) -> str:
    return f"{round(fgpu, 2):g} fGPU"


def _quanta_fgpu(quanta: int, units_per_gpu: float) -> str:
    return _fgpu(quanta * units_per_gpu / QUANTA_PER_GPU)


def _describe(slots: Slots) -> str:
    parts = [_cores(slots.cpu), f"{format_size(slots.mem)} memory"]
    if slots.fgpu > 0:
        parts.append(_fgpu(slots.fgpu))
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _gpu_name(node: str, index: int) -> str:
    return f"gpu-{index} on {node}"


def _scope(group: str | None) -> str:
    """Whose quota: "your quota", "group 'students' quota"."""
    return "your" if group is None else f"group '{group}'"
