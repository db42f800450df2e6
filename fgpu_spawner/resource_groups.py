"""The resource groups a user may pick (Backend.AI's scaling groups: groups of nodes), with what
is free in each for them, read from the queue service's `api/resources` answer for that user.

Pure (no I/O): the spawner fetches the answer (queue_client.resources_for) and hands it here for
the spawn form's choice. A submitted `resource_group` is judged by the queue service when the
spawner asks for the grant (the scheduler's admission: 403 for a group the user may not use, 400
for none of that name), before any container exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from fgpu_shared.units import format_size


@dataclass(frozen=True)
class GroupOffer:
    """One resource group the user may use, with what is free there for them now (within every
    quota that applies): cores, bytes and fGPU units."""

    name: str
    cpu: float
    mem: int
    fgpu: float
    #: Whether the group has GPUs at all; a CPU-only group does not mention fGPU.
    has_gpus: bool

    @property
    def free_text(self) -> str:
        """E.g. "3 fGPU, 12 CPU, 40 GiB free" (sizes as everywhere on the pages: format_size)."""
        parts = [f"{_number(self.fgpu)} fGPU"] if self.has_gpus else []
        parts += [f"{_number(self.cpu)} CPU", f"{format_size(self.mem)} free"]
        return ", ".join(parts)

    @property
    def label(self) -> str:
        return f"{self.name} — {self.free_text}"


def _number(value: float) -> str:
    """At most one decimal, none when whole: 12, 0.5, 40, 7.8."""
    return f"{round(value, 1):g}"


def offered_groups(resources: dict) -> list[GroupOffer]:
    """The groups this user may use, in the service's order (the order of its nodes)."""
    offers = []
    for name, group in (resources.get("resource_groups") or {}).items():
        if not group.get("allowed"):
            continue
        free = group.get("allocatable") or {}
        capacity = group.get("capacity") or {}
        offers.append(
            GroupOffer(
                name=name,
                cpu=max(float(free.get("cpu") or 0), 0.0),
                mem=max(int(free.get("mem") or 0), 0),
                fgpu=max(float(free.get("fgpu") or 0), 0.0),
                has_gpus=float(capacity.get("fgpu") or 0) > 0,
            )
        )
    return offers
