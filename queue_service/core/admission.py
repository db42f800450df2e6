"""Admission: whether a request may join the queue, or must be refused at once because it can
never start (no node of its resource groups is that big, it is above a quota's whole allowance,
its resource group is unknown or forbidden) or too many of its requests already wait. Every
scheduling pass asks the same of each request it considers (`_never_fits`). Pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from fgpu_shared.units import format_size
from queue_service.core.resource_model import (
    MILLICORES_PER_CORE,
    NO_QUOTAS,
    Node,
    Quota,
    Quotas,
    Request,
    Slots,
    _check_units,
    _fgpu_quota_quanta,
    _millicores,
    _Need,
)
from queue_service.core.slot_wording import _cores, _describe, _fgpu, _scope

#: Why a request is refused at once (the service's `errors.Cause` names the same kinds).
RefusalCause = Literal["invalid", "capacity", "forbidden", "quota"]


@dataclass(frozen=True)
class AdmissionRefusal:
    """A request that must not join the queue: what kind of refusal, and the sentence to show."""

    cause: RefusalCause
    message: str


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
    """Why one more waiting request is refused under a `pending` quota. The caller passes the
    waiting interactive sessions alone, and none for a batch job (queue.py): waiting jobs have
    their own limit (jobs.py)."""
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
                f"session{'s' if quota.max_pending != 1 else ''} at a time (its `pending` "
                f"limit), and {count} {'are' if count != 1 else 'is'} waiting. Cancel one, or "
                "wait for it to start."
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
