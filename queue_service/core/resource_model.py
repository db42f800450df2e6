"""The resource model of the scheduler core: what a node has, what a request asks for and a
grant holds, the quotas that bound them, and the integer units they are compared in. Pure values.

Units (docs/source/explanation/architecture.md, "The resource model"):

- GPU shares are counted in integer quanta, `QUANTA_PER_GPU` to a GPU, so that the grants of one
  GPU add up exactly and never drift past 1.0 the way floats do. A request of `fgpu` units is
  `fgpu / units_per_gpu` of a GPU; above one GPU it spans whole GPUs plus at most one fraction, all
  on one node.
- CPU is counted in millicores and memory in bytes, also as integers.
- Quotas on fGPU are counted in ten-thousandths of an fGPU unit, whatever `units_per_gpu` is, so a
  quota of 2 fGPU holds exactly four requests of 0.5 fGPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

QUANTA_PER_GPU = 10_000
MILLICORES_PER_CORE = 1_000
#: Grain of fGPU quota accounting: 1e-4 fGPU, finer than any form offers.
FGPU_QUOTA_QUANTA = 10_000
# Slots.fits_in compares float cores; below a millicore two values are the same amount.
_CPU_EPSILON = 0.5 / MILLICORES_PER_CORE


# ---------------------------------------------------------------------------------------------
# Values that come in


@dataclass(frozen=True)
class Gpu:
    uuid: str
    memory_bytes: int = 0
    sm_count: int = 0


@dataclass(frozen=True)
class Node:
    """One Docker host (or Swarm node): capacity after the configured reserve."""

    name: str
    resource_group: str
    cpu: float
    mem: int
    gpus: tuple[Gpu, ...] = ()


@dataclass(frozen=True)
class Slots:
    """An amount of resources: `cpu` in cores, `mem` in bytes, `fgpu` in fGPU units."""

    cpu: float = 0.0
    mem: int = 0
    fgpu: float = 0.0

    def __add__(self, other: Slots) -> Slots:
        return Slots(self.cpu + other.cpu, self.mem + other.mem, self.fgpu + other.fgpu)

    def __sub__(self, other: Slots) -> Slots:
        return Slots(self.cpu - other.cpu, self.mem - other.mem, self.fgpu - other.fgpu)

    def fits_in(self, other: Slots) -> bool:
        """True when every field of self is at most other's (to a millicore / 1e-4 fGPU)."""
        return (
            self.cpu <= other.cpu + _CPU_EPSILON
            and self.mem <= other.mem
            and _fgpu_quota_quanta(self.fgpu) <= _fgpu_quota_quanta(other.fgpu)
        )


@dataclass(frozen=True)
class Request:
    """A pending session request. `skips` is how often it has been overtaken so far."""

    id: str
    user: str
    groups: tuple[str, ...]
    slots: Slots
    resource_group: str | None = None
    enqueued_seq: int = 0
    skips: int = 0
    #: The catalog image it starts (None: not said), whose holders it goes to first.
    image: str | None = None


@dataclass(frozen=True)
class Allocation:
    """Resources held by a granted session: a node, and a fraction of each of its GPUs."""

    request_id: str
    user: str
    groups: tuple[str, ...]
    slots: Slots
    node: str
    gpus: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SlotLimits:
    """Upper bounds on summed slots; None means no bound on that field."""

    cpu: float | None = None
    mem: int | None = None
    fgpu: float | None = None


@dataclass(frozen=True)
class Quota:
    """Limits for one user or one hub group. None everywhere means unlimited."""

    max_slots: SlotLimits = SlotLimits()
    max_sessions: int | None = None
    max_pending: int | None = None
    resource_groups: tuple[str, ...] | None = None


UNLIMITED = Quota()


@dataclass(frozen=True)
class Quotas:
    """Quotas by user name and by hub group name; a name not listed gets the default.

    A user's own usage must stay within the user quota, and each of the user's groups' summed usage
    within that group's quota. Resource groups are the exception: a group *grants* access, so a user
    may use the resource groups of any of their groups (a student in "students" and "gpu-lab" gets
    both), within the user quota's own list.
    """

    users: Mapping[str, Quota] = field(default_factory=dict)
    groups: Mapping[str, Quota] = field(default_factory=dict)
    default_user: Quota = UNLIMITED
    default_group: Quota = UNLIMITED

    def for_user(self, user: str) -> Quota:
        return self.users.get(user, self.default_user)

    def for_group(self, group: str) -> Quota:
        return self.groups.get(group, self.default_group)

    def allowed_resource_groups(self, user: str, groups: Sequence[str]) -> frozenset[str] | None:
        """The resource groups this user may use; None means all of them."""
        allowed = _as_set(self.for_user(user).resource_groups)
        if groups:
            granted: set[str] = set()
            for group in groups:
                by_group = _as_set(self.for_group(group).resource_groups)
                if by_group is None:
                    granted = None
                    break
                granted |= by_group
            if granted is not None:
                allowed = frozenset(granted) if allowed is None else allowed & granted
        return allowed


NO_QUOTAS = Quotas()


def _as_set(groups: tuple[str, ...] | None) -> frozenset[str] | None:
    return None if groups is None else frozenset(groups)


# ---------------------------------------------------------------------------------------------
# Conversions


def gpu_quanta(fgpu: float, units_per_gpu: float) -> int:
    """A request's GPU share in quanta. Any positive fGPU needs at least one quantum."""
    if fgpu <= 0:
        return 0
    return max(1, round(fgpu / units_per_gpu * QUANTA_PER_GPU))


def fraction_quanta(fraction: float) -> int:
    """The quanta of a stored grant fraction; sum these, not the floats, to check a GPU."""
    return round(fraction * QUANTA_PER_GPU)


def _millicores(cpu: float) -> int:
    return round(cpu * MILLICORES_PER_CORE)


def _fgpu_quota_quanta(fgpu: float) -> int:
    return round(fgpu * FGPU_QUOTA_QUANTA)


def _check_units(units_per_gpu: float) -> None:
    if not units_per_gpu > 0:
        raise ValueError(f"units_per_gpu must be positive, not {units_per_gpu!r}")


class _Need:
    """A request's slots as the integers the scheduler compares."""

    __slots__ = ("cpu", "mem", "fq", "gq", "whole", "rest")

    def __init__(self, slots: Slots, units_per_gpu: float):
        self.cpu = _millicores(slots.cpu)
        self.mem = slots.mem
        self.fq = _fgpu_quota_quanta(slots.fgpu)
        self.gq = gpu_quanta(slots.fgpu, units_per_gpu)
        # A share below one GPU is all "rest"; exactly one GPU is one whole GPU.
        self.whole, self.rest = divmod(self.gq, QUANTA_PER_GPU)

    @property
    def gpus_needed(self) -> int:
        return self.whole + (1 if self.rest else 0)

    def dominates(self, other: _Need) -> bool:
        """At least as big as `other` in every dimension: wherever self fits, other fits."""
        return self.cpu >= other.cpu and self.mem >= other.mem and self.gq >= other.gq
