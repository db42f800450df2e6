"""The quotas that bound what a user may still start, each with its figures and the sentence the
pages show: api/resources `limits` (docs/source/explanation/sessions-and-queue.md, the resource indicator).

A quota is counted as the scheduler counts it (scheduler.py): the user's own quota over the
user's sessions, each hub group's quota over all of its members' sessions. Every configured
figure is listed, `reached` when nothing more fits under it, so that a page can tell "your quota
is used up" apart from "the cluster is full" and name the figure: "You have 3 of 3 sessions
(your quota)."

Pure: the holdings are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

from queue_service.core.quota_wording import limit_sentence
from queue_service.core.resource_model import Quota

#: The order a page lists them in: what stops a launch outright first.
KINDS = ("sessions", "pending", "fgpu", "cpu", "mem")


@dataclass(frozen=True)
class Holding:
    """What one quota's holder has now: the user (group None) or all members of a hub group."""

    group: str | None
    quota: Quota
    cpu: float
    mem: int
    fgpu: float
    sessions: int  # holding a slice (scheduled or running)
    pending: int  # waiting in the queue


def quota_limits(holdings: list[Holding]) -> list[dict]:
    """Every configured figure of every quota that applies, in KINDS order:
    [{kind, group, used, limit, left, reached, text}]."""
    rows = [_row(h, kind, used, limit) for h in holdings for kind, used, limit in _figures(h)]
    return sorted(rows, key=lambda row: KINDS.index(row["kind"]))


def _figures(h: Holding):
    slots = h.quota.max_slots
    for kind, used, limit in (
        ("sessions", h.sessions, h.quota.max_sessions),
        ("pending", h.pending, h.quota.max_pending),
        ("fgpu", h.fgpu, slots.fgpu),
        ("cpu", h.cpu, slots.cpu),
        ("mem", h.mem, slots.mem),
    ):
        if limit is not None:
            yield kind, used, limit


def _row(h: Holding, kind: str, used: float, limit: float) -> dict:
    left = round(max(0, limit - used), 6)
    return {
        "kind": kind,
        "group": h.group,
        "used": used,
        "limit": limit,
        "left": left,
        # 1e-9: 0.1 + 0.2 fGPU held of a 0.3 quota is used up, whatever the float says.
        "reached": left <= 1e-9,
        "text": limit_sentence(kind, h.group, used, limit),
    }
