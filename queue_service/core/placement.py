"""Placement: which node and which GPU slices a request gets within one pass, by `best_fit`,
`fill` or `spread`. The pass's working state is the free capacity with sorted indexes per
resource group (`_Cluster`), so that a search takes a bisect or two instead of a walk over every
node; a request above one GPU takes whole GPUs plus at most one fraction, all on one node
(`_slices_on_node`). `find(..., only=nodes)` searches those nodes alone (the nodes that hold a
request's image already: scheduler.py tries them first). Pure."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from typing import Literal

from queue_service.core.free_capacity import _node_free
from queue_service.core.resource_model import QUANTA_PER_GPU, Allocation, Node, _Need

Placement = Literal["best_fit", "fill", "spread"]
PLACEMENTS: tuple[Placement, ...] = ("best_fit", "fill", "spread")


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
        #: The nodes a search may take (None: any), for the length of one `find`.
        self.only: frozenset[str] | None = None
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
        self,
        need: _Need,
        groups: Sequence[str],
        placement: Placement,
        only: frozenset[str] | None = None,
    ) -> tuple[_NodeState, list[tuple[int, int]]] | None:
        """The best node and GPU slices for `need` in `groups` (among the nodes named in `only`,
        when given), or None when nothing fits now."""
        self.only = only
        try:
            return self._find(need, groups, placement)
        finally:
            self.only = None

    def _find(self, need: _Need, groups: Sequence[str], placement: Placement):
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
        """Room for the request's CPU and memory, on a node the search may take."""
        return (
            state.cpu >= need.cpu
            and state.mem >= need.mem
            and (self.only is None or state.name in self.only)
        )

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
            if self._fits_cpu_mem(state, need) and state.holds_gpus(need):
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
            if self._fits_cpu_mem(state, need) and state.holds_gpus(need):
                return (-total, rank), state, None
        return None

    def _cpu_only_tightest(self, idx: _GroupIndex, need: _Need):
        """No GPU asked: the node with the least free CPU that fits (best fit and fill alike)."""
        by_cpu = idx.by_cpu
        for j in range(bisect_left(by_cpu, (need.cpu,)), len(by_cpu)):
            cpu, rank = by_cpu[j]
            if self._fits_cpu_mem(self.nodes[rank], need):
                return (cpu, rank), self.nodes[rank], []
        return None

    def _cpu_only_spread(self, idx: _GroupIndex, need: _Need):
        by_cpu = idx.by_cpu
        for j in range(len(by_cpu) - 1, -1, -1):
            cpu, rank = by_cpu[j]
            if cpu < need.cpu:
                break
            if self._fits_cpu_mem(self.nodes[rank], need):
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
