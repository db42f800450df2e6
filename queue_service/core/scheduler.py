"""The scheduler core of the `queue` service: who runs next, and where. Pure functions, no I/O.

`schedule()` takes plain values (nodes, allocations, pending requests, quotas) and returns plain
values, so it can be unit-tested, property-tested and benchmarked on its own; the service reads its
DB, calls `schedule()` and writes the decisions back. Only the standard library and the leaf
`fgpu_shared.units` are imported.

Its parts are the modules beside it: the values and their units (resource_model.py), admission
(admission.py), placement on nodes and GPUs (placement.py), the words of a wait
(waiting_reasons.py, slot_wording.py), free capacity (free_capacity.py), pending timeouts
(pending_timeouts.py) and which requests a pass must consider again (reconsideration.py). This
module holds the pass itself: queue order, quotas and the skip bound.

Queue order is FIFO with backfill (a later request that fits may start before a blocked earlier
one) or DRF (dominant resource fairness between users). Either way a blocked request counts how
often it was overtaken, and once that count reaches `max_skips` nothing behind it may take
resources it could use until it starts: no request starves.

Among the nodes with room, those that hold a request's image already come first (`image_nodes`,
from the nodes' reports: engine/image_prepull.py); the placement rule picks among them, and
among all nodes when none of them has room. A node that must pull the image first keeps a
student waiting for minutes.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from queue_service.core.admission import _Inventory, _never_fits, _quota_scopes
from queue_service.core.placement import PLACEMENTS, Placement, _Cluster, _NodeState
from queue_service.core.quota_wording import waiting_reason
from queue_service.core.resource_model import (
    FGPU_QUOTA_QUANTA,
    MILLICORES_PER_CORE,
    NO_QUOTAS,
    QUANTA_PER_GPU,
    Allocation,
    Node,
    Quota,
    Quotas,
    Request,
    Slots,
    _fgpu_quota_quanta,
    _millicores,
    _Need,
)
from queue_service.core.waiting_reasons import _GroupSummaries

DEFAULT_MAX_SKIPS = 10

Policy = Literal["fifo", "drf"]
POLICIES: tuple[Policy, ...] = ("fifo", "drf")
Cause = Literal["capacity", "quota", "order"]


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
        image_nodes: Mapping[str, frozenset[str]],
    ):
        self.inventory = _Inventory(nodes, units_per_gpu)
        self.image_nodes = image_nodes
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
            found = self.find(request, need, open_groups)
        if found is None:
            self.memo.remember(need, open_groups)
            self.skips.block(request, candidates)
            self.outcome[request.id] = ("capacity", None, candidates)
            return
        self.place(request, need, *found)

    def find(self, request: Request, need: _Need, groups: tuple[str, ...]):
        """A place on a node that holds the request's image, else on any node."""
        holders = self.image_nodes.get(request.image) if request.image else None
        if holders:
            found = self.cluster.find(need, groups, self.placement, only=holders)
            if found is not None:
                return found
        return self.cluster.find(need, groups, self.placement)

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
    image_nodes: Mapping[str, frozenset[str]] | None = None,
) -> SchedulePass:
    """One scheduling pass: place as many pending requests as fit, in queue order.

    `allocations` are the grants held now; `pending` the requests waiting, each with the skip count
    it has so far; `image_nodes` the nodes that hold each image already (catalog name → node
    names), which its requests go to first when one of them has room. Nothing given is changed: the new allocations, every still-pending request's
    reason, position and new skip count, and the requests that can never start are returned.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; use one of {', '.join(PLACEMENTS)}")
    if max_skips < 0:
        raise ValueError(f"max_skips must be at least 0, not {max_skips}")
    work = _Pass(
        nodes, allocations, pending, quotas, placement, units_per_gpu, max_skips, image_nodes or {}
    )
    if policy == "fifo":
        work.run_fifo(pending)
    else:
        work.run_drf(pending)
    return work.result()
