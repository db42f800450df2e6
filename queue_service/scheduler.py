"""The scheduler core of the `queue` service: who runs next, and where. Pure functions, no I/O.

Everything here takes plain values (nodes, allocations, pending requests, quotas) and returns plain
values, so it can be unit-tested, property-tested and benchmarked on its own; the service reads its
DB, calls `schedule()` and writes the decisions back. Only the standard library and the leaf `image_catalog.units` are imported.

Units (docs/source/explanation/architecture.md, "The resource model"):

- GPU shares are counted in integer quanta, `QUANTA_PER_GPU` to a GPU, so that the grants of one
  GPU add up exactly and never drift past 1.0 the way floats do. A request of `fgpu` units is
  `fgpu / units_per_gpu` of a GPU; above one GPU it spans whole GPUs plus at most one fraction, all
  on one node.
- CPU is counted in millicores and memory in bytes, also as integers.
- Quotas on fGPU are counted in ten-thousandths of an fGPU unit, whatever `units_per_gpu` is, so a
  quota of 2 fGPU holds exactly four requests of 0.5 fGPU.

Queue order is FIFO with backfill (a later request that fits may start before a blocked earlier
one) or DRF (dominant resource fairness between users). Either way a blocked request counts how
often it was overtaken, and once that count reaches `max_skips` nothing behind it may take
resources it could use until it starts: no request starves.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from image_catalog.units import format_size

from .quota_wording import waiting_reason

QUANTA_PER_GPU = 10_000
MILLICORES_PER_CORE = 1_000
#: Grain of fGPU quota accounting: 1e-4 fGPU, finer than any form offers.
FGPU_QUOTA_QUANTA = 10_000
DEFAULT_MAX_SKIPS = 10
# Slots.fits_in compares float cores; below a millicore two values are the same amount.
_CPU_EPSILON = 0.5 / MILLICORES_PER_CORE

Policy = Literal["fifo", "drf"]
Placement = Literal["best_fit", "fill", "spread"]
POLICIES: tuple[Policy, ...] = ("fifo", "drf")
PLACEMENTS: tuple[Placement, ...] = ("best_fit", "fill", "spread")
Cause = Literal["capacity", "quota", "order"]
#: Why a request is refused at once (the service's `errors.Cause` names the same kinds).
RefusalCause = Literal["invalid", "capacity", "forbidden", "quota"]


@dataclass(frozen=True)
class AdmissionRefusal:
    """A request that must not join the queue: what kind of refusal, and the sentence to show."""

    cause: RefusalCause
    message: str


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
# Values that go out


@dataclass(frozen=True)
class Waiting:
    """Why a request is still pending, and where it stands.

    `position` is 1-based, in the order the next pass will consider requests. `cause` is
    "capacity" (no node has room yet), "quota" (the user's or a group's quota is used up) or "order"
    (room exists, but an earlier request that has been overtaken `max_skips` times goes first).
    """

    position: int
    reason: str
    cause: Cause
    skips: int


@dataclass(frozen=True)
class SchedulePass:
    """The outcome of one pass. `refused` holds requests that can no longer ever start (the
    inventory shrank or a quota was lowered): the service ends them with that message."""

    placed: tuple[Allocation, ...]
    waiting: Mapping[str, Waiting]
    refused: Mapping[str, str]
    decisions: int


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


# ---------------------------------------------------------------------------------------------
# Words


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


# ---------------------------------------------------------------------------------------------
# Inventory: what could ever fit (admission)


class _Inventory:
    """Static facts about the nodes: groups, totals, and the biggest node shapes per group."""

    def __init__(self, nodes: Sequence[Node], units_per_gpu: float):
        _check_units(units_per_gpu)
        self.units = units_per_gpu
        self.groups: tuple[str, ...] = tuple(dict.fromkeys(n.resource_group for n in nodes))
        shapes: dict[str, set[tuple[int, int, int]]] = defaultdict(set)
        for n in nodes:
            shapes[n.resource_group].add((_millicores(n.cpu), n.mem, len(n.gpus)))
        # Only the Pareto-largest shapes matter; a cluster of identical nodes keeps just one.
        self.shapes = {g: _pareto_max(s) for g, s in shapes.items()}
        self.total_cpu = sum(_millicores(n.cpu) for n in nodes)
        self.total_mem = sum(n.mem for n in nodes)
        self.total_fq = sum(_fgpu_quota_quanta(len(n.gpus) * units_per_gpu) for n in nodes)
        # A pass asks this for every request, and requests come in few sizes.
        self._too_big: dict[tuple[Slots, tuple[str, ...]], str | None] = {}

    def too_big(self, need: _Need, slots: Slots, groups: Sequence[str]) -> str | None:
        """Why no node of `groups` could hold the request even when empty, or None if one could."""
        key = (slots, tuple(groups))
        if key not in self._too_big:
            self._too_big[key] = self._why_too_big(need, slots, groups)
        return self._too_big[key]

    def _why_too_big(self, need: _Need, slots: Slots, groups: Sequence[str]) -> str | None:
        shapes = [s for g in groups for s in self.shapes.get(g, ())]
        if any(
            cpu >= need.cpu and mem >= need.mem and gpus >= need.gpus_needed
            for cpu, mem, gpus in shapes
        ):
            return None
        most_cpu = max((s[0] for s in shapes), default=0) / MILLICORES_PER_CORE
        most_mem = max((s[1] for s in shapes), default=0)
        most_fgpu = max((s[2] for s in shapes), default=0) * self.units
        where = _groups_phrase(groups)
        return (
            f"This request can never start: it asks for {_describe(slots)}, but no node {where} "
            f"is that big. The most any node there has is {_cores(most_cpu)}, "
            f"{format_size(most_mem)} memory and {_fgpu(most_fgpu)}."
        )


def _pareto_max(shapes: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    shapes = sorted(set(shapes), reverse=True)
    kept: list[tuple[int, int, int]] = []
    for shape in shapes:
        if not any(all(k >= s for k, s in zip(other, shape, strict=True)) for other in kept):
            kept.append(shape)
    return kept


def _groups_phrase(groups: Sequence[str]) -> str:
    if len(groups) == 1:
        return f"in resource group '{groups[0]}'"
    return "in resource groups " + ", ".join(f"'{g}'" for g in groups)


def _candidate_groups(
    request: Request, inventory: _Inventory, quotas: Quotas
) -> tuple[str, ...] | AdmissionRefusal:
    """The resource groups a request may be placed in, or why there are none."""
    allowed = quotas.allowed_resource_groups(request.user, request.groups)
    wanted = request.resource_group
    if wanted is not None:
        if wanted not in inventory.groups:
            known = ", ".join(f"'{g}'" for g in inventory.groups) or "none"
            return AdmissionRefusal(
                "invalid",
                f"There is no resource group '{wanted}'. The resource groups are: {known}.",
            )
        if allowed is not None and wanted not in allowed:
            return AdmissionRefusal(
                "forbidden",
                f"You may not use resource group '{wanted}'. "
                f"You may use: {', '.join(sorted(allowed)) or 'none'}.",
            )
        return (wanted,)
    usable = tuple(g for g in inventory.groups if allowed is None or g in allowed)
    if not usable:
        return AdmissionRefusal(
            "capacity", "None of the resource groups you may use has any nodes."
        )
    return usable


def _invalid_slots(slots: Slots) -> str | None:
    if not slots.cpu > 0:
        return f"A session needs some CPU; {slots.cpu:g} cores were asked."
    if not slots.mem > 0:
        return f"A session needs some memory; {slots.mem} bytes were asked."
    if not slots.fgpu >= 0:
        return f"fGPU cannot be negative; {slots.fgpu:g} was asked."
    return None


def _quota_scopes(request: Request, quotas: Quotas) -> list[tuple[str | None, Quota]]:
    """(group or None for the user, quota) pairs that a request of this user must respect."""
    scopes: list[tuple[str | None, Quota]] = [(None, quotas.for_user(request.user))]
    scopes.extend((group, quotas.for_group(group)) for group in request.groups)
    return scopes


def _above_quota_max(request: Request, quotas: Quotas) -> str | None:
    """A request bigger than a quota's whole allowance can never start."""
    slots = request.slots
    for group, quota in _quota_scopes(request, quotas):
        scope, limit = _scope(group), quota.max_slots
        if quota.max_sessions is not None and quota.max_sessions < 1:
            return f"This request can never start: {scope} quota allows no sessions."
        if limit.cpu is not None and _millicores(slots.cpu) > _millicores(limit.cpu):
            return (
                f"This request can never start: it asks for {_cores(slots.cpu)}, "
                f"and {scope} quota is {_cores(limit.cpu)} in all."
            )
        if limit.mem is not None and slots.mem > limit.mem:
            return (
                f"This request can never start: it asks for {format_size(slots.mem)} memory, "
                f"and {scope} quota is {format_size(limit.mem)} in all."
            )
        if limit.fgpu is not None and _fgpu_quota_quanta(slots.fgpu) > _fgpu_quota_quanta(
            limit.fgpu
        ):
            return (
                f"This request can never start: it asks for {_fgpu(slots.fgpu)}, "
                f"and {scope} quota is {_fgpu(limit.fgpu)} in all."
            )
    return None


def _too_many_pending(request: Request, quotas: Quotas, pending: Iterable[Request]) -> str | None:
    others = [p for p in pending if p.id != request.id]
    for group, quota in _quota_scopes(request, quotas):
        if quota.max_pending is None:
            continue
        if group is None:
            count = sum(1 for p in others if p.user == request.user)
        else:
            count = sum(1 for p in others if group in p.groups)
        if count >= quota.max_pending:
            return (
                f"{_scope(group).capitalize()} quota allows {quota.max_pending} pending "
                f"request{'s' if quota.max_pending != 1 else ''} at a time, and "
                f"{count} {'are' if count != 1 else 'is'} waiting. Cancel one, or wait for it to start."
            )
    return None


def _never_fits(
    request: Request, need: _Need, inventory: _Inventory, quotas: Quotas
) -> tuple[tuple[str, ...] | None, AdmissionRefusal | None]:
    """(candidate resource groups, None) for a request that could start some day, else (None, why)."""
    if why := _invalid_slots(request.slots):
        return None, AdmissionRefusal("invalid", why)
    candidates = _candidate_groups(request, inventory, quotas)
    if isinstance(candidates, AdmissionRefusal):
        return None, candidates
    if why := _above_quota_max(request, quotas):
        return None, AdmissionRefusal("quota", why)
    if why := inventory.too_big(need, request.slots, candidates):
        return None, AdmissionRefusal("capacity", why)
    return candidates, None


def admission_refusal(
    request: Request,
    nodes: Sequence[Node],
    quotas: Quotas = NO_QUOTAS,
    units_per_gpu: float = 1,
    pending: Iterable[Request] = (),
) -> AdmissionRefusal | None:
    """Why `request` must be refused at once, or None if it may join the queue.

    Refused: a request no node of its resource groups could ever hold, one above a quota's whole
    allowance, one for an unknown or forbidden resource group, and one beyond the pending-count
    quota given the requests already `pending`. Anything else may wait: it will fit some day.
    """
    inventory = _Inventory(nodes, units_per_gpu)
    _, refusal = _never_fits(request, _Need(request.slots, units_per_gpu), inventory, quotas)
    if refusal is None and (why := _too_many_pending(request, quotas, pending)):
        refusal = AdmissionRefusal("quota", why)
    return refusal


def admission_error(
    request: Request,
    nodes: Sequence[Node],
    quotas: Quotas = NO_QUOTAS,
    units_per_gpu: float = 1,
    pending: Iterable[Request] = (),
) -> str | None:
    """The sentence of `admission_refusal`, or None."""
    refusal = admission_refusal(request, nodes, quotas, units_per_gpu, pending)
    return refusal.message if refusal else None


# ---------------------------------------------------------------------------------------------
# Which requests a pass must consider again


_ANY_GROUP = ("any",)


def limits_anything(quota: Quota) -> bool:
    """Whether a pass ever checks this quota against usage (its resource groups are read at
    admission and in `_candidate_groups`, which usage never changes)."""
    limit = quota.max_slots
    return quota.max_sessions is not None or any(
        value is not None for value in (limit.cpu, limit.mem, limit.fgpu)
    )


def reconsidered(
    pending: Sequence[Request],
    quotas: Quotas,
    resource_groups: Iterable[str],
    dirty_groups: Iterable[str | None],
    dirty_users: Mapping[str, Sequence[str]],
    keys: Sequence[tuple] | None = None,
) -> list[Request]:
    """The pending requests whose outcome a FIFO pass may change, in the order given.

    Requests are joined when they can touch each other in a pass: through a resource group (one's
    placement takes capacity, or moves the skip count, the other could use), or through a quota
    both are checked against (the user's own, or a hub group's: one's placement uses it up for the
    other). A request whose resource group is None may go anywhere: it joins every group.
    `dirty_groups` (None: all of them) are the resource groups whose nodes, holdings or line
    changed since the last pass that placed; `dirty_users` (with their hub groups) the users whose
    holdings changed. Every request joined to either comes back; the others would meet exactly
    what they met in the last pass, which left them as they are, so a pass leaves them again.
    `keys` are the requests' `ScopeKeys`, when the caller keeps them.
    """
    parent: dict[tuple, tuple] = {}

    def root(element: tuple) -> tuple:
        parent.setdefault(element, element)
        while parent[element] != element:
            parent[element] = parent[parent[element]]
            element = parent[element]
        return element

    def join(a: tuple, b: tuple) -> None:
        parent[root(a)] = root(b)

    if keys is None:
        scope_key = ScopeKeys(quotas)
        keys = [scope_key(request) for request in pending]
    scope_of = {key: _scope_elements(key) for key in set(keys)}
    dirty_groups = set(dirty_groups)
    if None in dirty_groups or any(key[0] is None for key in scope_of):
        for group in resource_groups:
            join(("g", group), _ANY_GROUP)
    for first, *rest in scope_of.values():
        for element in rest:
            join(first, element)
    marked = {root(_ANY_GROUP if g is None else ("g", g)) for g in dirty_groups}
    for user, groups in dirty_users.items():
        marked.add(root(("u", user)))
        marked.update(root(("h", group)) for group in groups)
    chosen = {key for key, elements in scope_of.items() if root(elements[0]) in marked}
    return [r for r, key in zip(pending, keys, strict=True) if key in chosen]


class ScopeKeys:
    """A request's (resource group, user if the user's quota limits anything, hub groups whose
    quota limits anything): what it is joined through, told apart cheaply for thousands."""

    def __init__(self, quotas: Quotas):
        self.quotas = quotas
        self.default_user = limits_anything(quotas.default_user)
        self.hub_groups: dict[str, bool] = {}

    def __call__(self, request: Request) -> tuple:
        quota = self.quotas.users.get(request.user)
        limited = self.default_user if quota is None else limits_anything(quota)
        groups = ()
        if request.groups:
            groups = tuple(g for g in request.groups if self._limits(g))
        return (request.resource_group, request.user if limited else None, groups)

    def _limits(self, group: str) -> bool:
        if group not in self.hub_groups:
            self.hub_groups[group] = limits_anything(self.quotas.for_group(group))
        return self.hub_groups[group]


def _scope_elements(key: tuple) -> tuple[tuple, ...]:
    resource_group, user, groups = key
    elements = [_ANY_GROUP if resource_group is None else ("g", resource_group)]
    if user is not None:
        elements.append(("u", user))
    elements.extend(("h", g) for g in groups)
    return tuple(elements)


# ---------------------------------------------------------------------------------------------
# Free capacity


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


# ---------------------------------------------------------------------------------------------
# Pending timeout


def pending_timeouts(
    enqueued_at: Mapping[str, datetime | float],
    now: datetime | float,
    timeout: timedelta | float | None,
) -> tuple[str, ...]:
    """Ids of the requests that have waited longer than `timeout`, oldest first.

    Times are datetimes (with a timedelta timeout) or seconds (with a number). A timeout of None or
    zero means requests wait for as long as it takes.
    """
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if seconds is None or seconds <= 0:
        return ()
    expired = [(t, rid) for rid, t in enqueued_at.items() if now - t > timeout]
    return tuple(rid for _, rid in sorted(expired))


# ---------------------------------------------------------------------------------------------
# The working state of one pass: free capacity with indexes for fast placement


class _NodeState:
    __slots__ = (
        "rank",
        "name",
        "group",
        "uuids",
        "cpu",
        "mem",
        "free",
        "whole",
        "total",
        "most_partial",
        "alive",
    )

    def __init__(self, rank: int, node: Node, cpu: int, mem: int, free: list[int]):
        self.rank, self.name, self.group = rank, node.name, node.resource_group
        self.uuids = tuple(g.uuid for g in node.gpus)
        self.cpu, self.mem, self.free = cpu, mem, free
        self.whole = sum(1 for q in free if q == QUANTA_PER_GPU)
        self.total = sum(q for q in free if q > 0)
        self.most_partial = _most_partial(free)
        self.alive = True

    def holds_gpus(self, need: _Need) -> bool:
        """Whether `_slices_on_node` finds slices for `need` here, told from two counts instead
        of a walk over the GPUs: enough whole GPUs, and for a remainder either one whole GPU more
        or a partly used GPU with room for it. Searches test many nodes for each one they take."""
        if self.whole < need.whole:
            return False
        return not need.rest or self.whole > need.whole or self.most_partial >= need.rest


def _most_partial(free: list[int]) -> int:
    """The most free quanta on a partly used GPU, 0 if none is."""
    return max((q for q in free if _is_partial(q)), default=0)


class _GroupIndex:
    """Sorted lists over one resource group's live nodes.

    `partial` holds (free quanta, node rank, gpu index) for GPUs that are partly used, so best-fit
    finds the tightest GPU with one bisect. Wholly free GPUs are not in it: they are counted per node
    in `by_whole`, which lets a multi-GPU request find a node with enough of them, and lets a small
    request that fits no partial GPU break into the node with the fewest whole GPUs left.
    """

    __slots__ = ("partial", "by_whole", "by_total", "by_cpu")

    def __init__(self):
        self.partial: list[tuple[int, int, int]] = []
        self.by_whole: list[tuple[int, int]] = []
        self.by_total: list[tuple[int, int]] = []
        self.by_cpu: list[tuple[int, int]] = []


def _remove(sorted_list: list, item: tuple) -> None:
    del sorted_list[bisect_left(sorted_list, item)]


def _move(sorted_list: list, rank: int, before: int, after: int) -> None:
    """Move a node's (count, rank) entry from `before` to `after`; 0 means not listed."""
    if before == after:
        return
    if before:
        _remove(sorted_list, (before, rank))
    if after:
        insort(sorted_list, (after, rank))


def _is_partial(quanta: int) -> bool:
    return 0 < quanta < QUANTA_PER_GPU


class _Cluster:
    def __init__(
        self,
        nodes: Sequence[Node],
        allocations: Iterable[Allocation],
        min_cpu: int,
        min_mem: int,
    ):
        free = _node_free(nodes, allocations)
        # A node that cannot hold even the smallest pending request is left out of every index,
        # so that searches never walk over it.
        self.min_cpu, self.min_mem = min_cpu, min_mem
        self.nodes = [_NodeState(rank, n, *free[n.name]) for rank, n in enumerate(nodes)]
        self.index = {n.resource_group: _GroupIndex() for n in nodes}
        for state in self.nodes:
            state.alive = state.cpu >= min_cpu and state.mem >= min_mem
            if state.alive:
                self._index_node(state)
                idx = self.index[state.group]
                for gi, q in enumerate(state.free):
                    if _is_partial(q):
                        idx.partial.append((q, state.rank, gi))
        for idx in self.index.values():
            for lst in (idx.partial, idx.by_whole, idx.by_total, idx.by_cpu):
                lst.sort()

    def _index_node(self, state: _NodeState) -> None:
        idx = self.index[state.group]
        if state.whole:
            insort(idx.by_whole, (state.whole, state.rank))
        if state.total:
            insort(idx.by_total, (state.total, state.rank))
        insort(idx.by_cpu, (state.cpu, state.rank))

    def take(self, state: _NodeState, need: _Need, gpus: list[tuple[int, int]]) -> None:
        """Subtract a placement from a node and bring the indexes up to date (only the entries
        whose value changed move)."""
        idx = self.index[state.group]
        whole, total, cpu = state.whole, state.total, state.cpu
        for gi, quanta in gpus:
            before = state.free[gi]
            if _is_partial(before):
                _remove(idx.partial, (before, state.rank, gi))
            after = state.free[gi] = before - quanta
            if before == QUANTA_PER_GPU:
                state.whole -= 1
            state.total -= quanta
            if _is_partial(after):
                insort(idx.partial, (after, state.rank, gi))
        state.most_partial = _most_partial(state.free)
        state.cpu -= need.cpu
        state.mem -= need.mem
        state.alive = state.cpu >= self.min_cpu and state.mem >= self.min_mem
        _move(idx.by_whole, state.rank, whole, state.whole if state.alive else 0)
        _move(idx.by_total, state.rank, total, state.total if state.alive else 0)
        _remove(idx.by_cpu, (cpu, state.rank))
        if state.alive:
            insort(idx.by_cpu, (state.cpu, state.rank))
        else:
            for gi, q in enumerate(state.free):
                if _is_partial(q):
                    _remove(idx.partial, (q, state.rank, gi))

    # -- finding a place ------------------------------------------------------------------------

    def find(
        self, need: _Need, groups: Sequence[str], placement: Placement
    ) -> tuple[_NodeState, list[tuple[int, int]]] | None:
        """The best node and GPU slices for `need` in `groups`, or None when nothing fits now."""
        if need.gq == 0:
            search = self._cpu_only_spread if placement == "spread" else self._cpu_only_tightest
        elif placement == "fill":
            search = self._most_used_node
        elif placement == "spread":
            search = self._least_used_node
        elif need.whole == 0:
            search = self._tightest_gpu
        elif need.rest:
            search = self._whole_gpus_and_tightest_rest
        else:
            search = self._fewest_whole_gpus
        best = None
        for group in groups:
            found = search(self.index[group], need)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
        if best is None:
            return None
        _, state, slices = best
        # A search that says None leaves the slices to be cut on the chosen node only (a request
        # free to go to any resource group has one best node found in each).
        return state, _slices_on_node(state.free, need) if slices is None else slices

    def _fits_cpu_mem(self, state: _NodeState, need: _Need) -> bool:
        return state.cpu >= need.cpu and state.mem >= need.mem

    def _tightest_gpu(self, idx: _GroupIndex, need: _Need):
        """Best fit below one GPU: the partly used GPU that the request fills most fully."""
        partial = idx.partial
        for j in range(bisect_left(partial, (need.rest,)), len(partial)):
            free, rank, gi = partial[j]
            state = self.nodes[rank]
            if self._fits_cpu_mem(state, need):
                return (free, 0, rank), state, [(gi, need.rest)]
        # No partly used GPU has room: break into a whole GPU where fewest whole GPUs remain, so
        # that nodes with many whole GPUs stay free for multi-GPU requests.
        found = self._fewest_whole_gpus(idx, need)
        if found is not None:
            (whole, rank), state, gpus = found
            return (QUANTA_PER_GPU, whole, rank), state, gpus
        return None

    def _fewest_whole_gpus(self, idx: _GroupIndex, need: _Need):
        """Best fit for one or more whole GPUs: the node left with the fewest whole GPUs."""
        by_whole = idx.by_whole
        for j in range(bisect_left(by_whole, (max(need.whole, 1),)), len(by_whole)):
            whole, rank = by_whole[j]
            state = self.nodes[rank]
            if self._fits_cpu_mem(state, need) and state.holds_gpus(need):
                return (whole, rank), state, None
        return None

    def _whole_gpus_and_tightest_rest(self, idx: _GroupIndex, need: _Need):
        """Best fit above one GPU with a remainder: put the remainder on the tightest partly used
        GPU of a node that also has the whole GPUs, which spends one whole GPU less than taking
        another whole one for it; only when there is no such node, take one more whole GPU."""
        partial = idx.partial
        for j in range(bisect_left(partial, (need.rest,)), len(partial)):
            free, rank, gi = partial[j]
            state = self.nodes[rank]
            if state.whole >= need.whole and self._fits_cpu_mem(state, need):
                wholes = [i for i, q in enumerate(state.free) if q == QUANTA_PER_GPU]
                slices = [(i, QUANTA_PER_GPU) for i in wholes[: need.whole]]
                return (0, free, rank), state, [*slices, (gi, need.rest)]
        found = self._fewest_whole_gpus(idx, need)
        if found is not None:
            (whole, rank), state, gpus = found
            return (1, whole, rank), state, gpus
        return None

    def _most_used_node(self, idx: _GroupIndex, need: _Need):
        """Backend.AI's "fill": the node with the least free GPU share that still fits."""
        by_total, nodes = idx.by_total, self.nodes
        for j in range(bisect_left(by_total, (need.gq,)), len(by_total)):
            total, rank = by_total[j]
            state = nodes[rank]
            if state.cpu >= need.cpu and state.mem >= need.mem and state.holds_gpus(need):
                return (total, rank), state, None
        return None

    def _least_used_node(self, idx: _GroupIndex, need: _Need):
        """Backend.AI's "spread": the node with the most free GPU share that fits."""
        by_total, nodes = idx.by_total, self.nodes
        for j in range(len(by_total) - 1, -1, -1):
            total, rank = by_total[j]
            if total < need.gq:
                break
            state = nodes[rank]
            if state.cpu >= need.cpu and state.mem >= need.mem and state.holds_gpus(need):
                return (-total, rank), state, None
        return None

    def _cpu_only_tightest(self, idx: _GroupIndex, need: _Need):
        """No GPU asked: the node with the least free CPU that fits (best fit and fill alike)."""
        by_cpu = idx.by_cpu
        for j in range(bisect_left(by_cpu, (need.cpu,)), len(by_cpu)):
            cpu, rank = by_cpu[j]
            if self.nodes[rank].mem >= need.mem:
                return (cpu, rank), self.nodes[rank], []
        return None

    def _cpu_only_spread(self, idx: _GroupIndex, need: _Need):
        by_cpu = idx.by_cpu
        for j in range(len(by_cpu) - 1, -1, -1):
            cpu, rank = by_cpu[j]
            if cpu < need.cpu:
                break
            if self.nodes[rank].mem >= need.mem:
                return (-cpu, rank), self.nodes[rank], []
        return None


def _slices_on_node(free: list[int], need: _Need) -> list[tuple[int, int]] | None:
    """(gpu index, quanta) slices for `need` on one node: whole GPUs plus the tightest GPU for the
    remainder, or None if the node's GPUs cannot hold it."""
    wholes = [gi for gi, q in enumerate(free) if q == QUANTA_PER_GPU]
    if len(wholes) < need.whole:
        return None
    slices = [(gi, QUANTA_PER_GPU) for gi in wholes[: need.whole]]
    if need.rest:
        spare = wholes[need.whole :]
        tightest, tightest_free = -1, QUANTA_PER_GPU + 1
        for gi, q in enumerate(free):
            if need.rest <= q < tightest_free and (q < QUANTA_PER_GPU or gi in spare):
                tightest, tightest_free = gi, q
        if tightest < 0:
            return None
        slices.append((tightest, need.rest))
    return slices


# ---------------------------------------------------------------------------------------------
# One scheduling pass


class _Usage:
    """What one user or one group holds, as integers: millicores, bytes, fGPU quanta, sessions."""

    __slots__ = ("cpu", "mem", "fq", "sessions")

    def __init__(self):
        self.cpu = self.mem = self.fq = self.sessions = 0

    def add(self, need: _Need) -> None:
        self.cpu += need.cpu
        self.mem += need.mem
        self.fq += need.fq
        self.sessions += 1


def _over_quota(group: str | None, quota: Quota, used: _Usage, need: _Need) -> str | None:
    """Why a request waits for this quota (worded as the pages word its limit), or None."""
    limit = quota.max_slots
    if quota.max_sessions is not None and used.sessions + 1 > quota.max_sessions:
        return waiting_reason("sessions", group, used.sessions, quota.max_sessions, 1)
    if limit.cpu is not None and used.cpu + need.cpu > _millicores(limit.cpu):
        in_cores = used.cpu / MILLICORES_PER_CORE
        return waiting_reason("cpu", group, in_cores, limit.cpu, need.cpu / MILLICORES_PER_CORE)
    if limit.mem is not None and used.mem + need.mem > limit.mem:
        return waiting_reason("mem", group, used.mem, limit.mem, need.mem)
    if limit.fgpu is not None and used.fq + need.fq > _fgpu_quota_quanta(limit.fgpu):
        in_fgpu = used.fq / FGPU_QUOTA_QUANTA
        return waiting_reason("fgpu", group, in_fgpu, limit.fgpu, need.fq / FGPU_QUOTA_QUANTA)
    return None


class _SkipBook:
    """Counts overtakings without touching every blocked request on every placement.

    Blocked requests are grouped by their candidate resource groups (the "key"). A placement in
    group g overtakes every blocked request whose key contains g, so one counter per key suffices:
    a request's skips are its starting skips plus how far its key's counter moved since it blocked.
    When the counter reaches the lowest threshold of a key, that key's groups are frozen.
    """

    def __init__(self, max_skips: int):
        self.max_skips = max_skips
        self.moved: dict[tuple[str, ...], int] = {}
        self.threshold: dict[tuple[str, ...], int] = {}
        self.keys_by_group: dict[str, list[tuple[str, ...]]] = defaultdict(list)
        self.blocked: dict[str, tuple[tuple[str, ...], int, int]] = {}
        self.frozen: set[str] = set()

    def block(self, request: Request, key: tuple[str, ...]) -> None:
        if key not in self.moved:
            self.moved[key] = 0
            self.threshold[key] = 1 << 62
            for group in key:
                self.keys_by_group[group].append(key)
        moved = self.moved[key]
        self.blocked[request.id] = (key, moved, request.skips)
        reached_at = moved + self.max_skips - request.skips
        if reached_at <= moved:
            self.frozen.update(key)
        else:
            self.threshold[key] = min(self.threshold[key], reached_at)

    def placed_in(self, group: str) -> None:
        for key in self.keys_by_group.get(group, ()):
            self.moved[key] += 1
            if self.moved[key] >= self.threshold[key]:
                self.frozen.update(key)

    def skips(self, request: Request) -> int:
        entry = self.blocked.get(request.id)
        if entry is None:
            return request.skips
        key, moved_then, skips_then = entry
        return skips_then + self.moved[key] - moved_then


class _FailureMemo:
    """Within a pass free capacity only shrinks, so a request at least as big as one that failed
    on the same resource groups fails too: answer that without searching."""

    LIMIT = 32

    def __init__(self):
        self.failures: dict[tuple[str, ...], list[_Need]] = defaultdict(list)

    def known_to_fail(self, need: _Need, groups: tuple[str, ...]) -> bool:
        return any(need.dominates(failed) for failed in self.failures.get(groups, ()))

    def remember(self, need: _Need, groups: tuple[str, ...]) -> None:
        kept = [f for f in self.failures[groups] if not f.dominates(need)]
        kept.append(need)
        self.failures[groups] = kept[-self.LIMIT :]


class _Pass:
    def __init__(
        self,
        nodes: Sequence[Node],
        allocations: Sequence[Allocation],
        pending: Sequence[Request],
        quotas: Quotas,
        placement: Placement,
        units_per_gpu: float,
        max_skips: int,
    ):
        self.inventory = _Inventory(nodes, units_per_gpu)
        self.quotas, self.placement, self.units = quotas, placement, units_per_gpu
        # Requests come in few sizes: one _Need per size.
        self._need_of_slots: dict[Slots, _Need] = {}
        self.needs = {r.id: self.need_of(r.slots) for r in pending}
        self.cluster = _Cluster(
            nodes,
            allocations,
            min_cpu=min((n.cpu for n in self.needs.values()), default=0),
            min_mem=min((n.mem for n in self.needs.values()), default=0),
        )
        self.user_usage: dict[str, _Usage] = defaultdict(_Usage)
        self.group_usage: dict[str, _Usage] = defaultdict(_Usage)
        for a in allocations:
            self._charge(a.user, a.groups, self.need_of(a.slots))
        self.skips = _SkipBook(max_skips)
        self.memo = _FailureMemo()
        self.placed: list[Allocation] = []
        self.refused: dict[str, str] = {}
        self.considered: list[Request] = []
        self.outcome: dict[str, tuple[Cause, str | None, tuple[str, ...]]] = {}

    def need_of(self, slots: Slots) -> _Need:
        need = self._need_of_slots.get(slots)
        if need is None:
            need = self._need_of_slots[slots] = _Need(slots, self.units)
        return need

    def _charge(self, user: str, groups: Sequence[str], need: _Need) -> None:
        self.user_usage[user].add(need)
        for group in groups:
            self.group_usage[group].add(need)

    def dominant_share(self, user: str) -> float:
        used, inv = self.user_usage[user], self.inventory
        shares = [
            used.cpu / inv.total_cpu if inv.total_cpu else 0.0,
            used.mem / inv.total_mem if inv.total_mem else 0.0,
            used.fq / inv.total_fq if inv.total_fq else 0.0,
        ]
        return max(shares)

    def quota_block(self, request: Request, need: _Need) -> str | None:
        for group, quota in _quota_scopes(request, self.quotas):
            usage = self.user_usage[request.user] if group is None else self.group_usage[group]
            if why := _over_quota(group, quota, usage, need):
                return why
        return None

    def consider(self, request: Request) -> None:
        self.considered.append(request)
        need = self.needs[request.id]
        candidates, refusal = _never_fits(request, need, self.inventory, self.quotas)
        if refusal:
            self.refused[request.id] = refusal.message
            return
        if why := self.quota_block(request, need):
            self.outcome[request.id] = ("quota", why, candidates)
            return
        open_groups = tuple(g for g in candidates if g not in self.skips.frozen)
        if not open_groups:
            self.outcome[request.id] = ("order", None, candidates)
            return
        found = None
        if not self.memo.known_to_fail(need, open_groups):
            found = self.cluster.find(need, open_groups, self.placement)
        if found is None:
            self.memo.remember(need, open_groups)
            self.skips.block(request, candidates)
            self.outcome[request.id] = ("capacity", None, candidates)
            return
        self.place(request, need, *found)

    def place(
        self, request: Request, need: _Need, state: _NodeState, slices: list[tuple[int, int]]
    ) -> None:
        self.cluster.take(state, need, slices)
        self._charge(request.user, request.groups, need)
        self.skips.placed_in(state.group)
        self.placed.append(
            Allocation(
                request_id=request.id,
                user=request.user,
                groups=request.groups,
                slots=request.slots,
                node=state.name,
                gpus={state.uuids[gi]: q / QUANTA_PER_GPU for gi, q in slices},
            )
        )

    # -- orders -----------------------------------------------------------------------------------

    def run_fifo(self, pending: Sequence[Request]) -> None:
        for request in sorted(pending, key=lambda r: r.enqueued_seq):
            self.consider(request)

    def run_drf(self, pending: Sequence[Request]) -> None:
        """Lowest dominant share first; but requests already overtaken `max_skips` times go before
        anyone, since a dynamic order would otherwise let anyone overtake them."""
        by_seq = sorted(pending, key=lambda r: r.enqueued_seq)
        at_bound = [r for r in by_seq if r.skips >= self.skips.max_skips]
        for request in at_bound:
            self.consider(request)
        queues: dict[str, deque[Request]] = defaultdict(deque)
        for request in by_seq:
            if request.skips < self.skips.max_skips:
                queues[request.user].append(request)
        heap = [(self.dominant_share(u), q[0].enqueued_seq, u) for u, q in queues.items()]
        heapq.heapify(heap)
        while heap:
            _, _, user = heapq.heappop(heap)
            queue = queues[user]
            self.consider(queue.popleft())
            # Only this user's share can have changed, so the other heap entries stay true.
            if queue:
                heapq.heappush(heap, (self.dominant_share(user), queue[0].enqueued_seq, user))

    # -- the answer -------------------------------------------------------------------------------

    def result(self) -> SchedulePass:
        summaries = _GroupSummaries(self.cluster)
        waiting: dict[str, Waiting] = {}
        # The reason depends only on the size and the resource groups, and many requests share them.
        reasons: dict[tuple[Slots, tuple[str, ...]], tuple[Cause, str]] = {}
        position = 0
        for request in self.considered:
            if request.id not in self.outcome:
                continue
            cause, reason, candidates = self.outcome[request.id]
            if cause != "quota":
                key = (request.slots, candidates)
                if key not in reasons:
                    reasons[key] = self.capacity_reason(request, candidates, summaries)
                cause, reason = reasons[key]
            position += 1
            waiting[request.id] = Waiting(position, reason, cause, self.skips.skips(request))
        return SchedulePass(
            placed=tuple(self.placed),
            waiting=waiting,
            refused=dict(self.refused),
            decisions=len(self.considered),
        )

    def capacity_reason(
        self, request: Request, candidates: tuple[str, ...], summaries: _GroupSummaries
    ) -> tuple[Cause, str]:
        need = self.needs[request.id]
        frozen = [g for g in candidates if g in self.skips.frozen]
        if frozen and summaries.might_fit(need, frozen):
            return "order", (
                "room is free, but an earlier request has been overtaken "
                f"{self.skips.max_skips} times and goes first"
            )
        return "capacity", summaries.shortfall(need, request.slots, candidates, self.units)


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


def schedule(
    nodes: Sequence[Node],
    allocations: Sequence[Allocation],
    pending: Sequence[Request],
    quotas: Quotas = NO_QUOTAS,
    *,
    policy: Policy = "fifo",
    placement: Placement = "best_fit",
    units_per_gpu: float = 1,
    max_skips: int = DEFAULT_MAX_SKIPS,
) -> SchedulePass:
    """One scheduling pass: place as many pending requests as fit, in queue order.

    `allocations` are the grants held now; `pending` the requests waiting, each with the skip count
    it has so far. Nothing given is changed: the new allocations, every still-pending request's
    reason, position and new skip count, and the requests that can never start are returned.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; use one of {', '.join(PLACEMENTS)}")
    if max_skips < 0:
        raise ValueError(f"max_skips must be at least 0, not {max_skips}")
    work = _Pass(nodes, allocations, pending, quotas, placement, units_per_gpu, max_skips)
    if policy == "fifo":
        work.run_fifo(pending)
    else:
        work.run_drf(pending)
    return work.result()
