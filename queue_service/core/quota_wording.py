"""How a quota's figures are said, in one place: the limits the pages list (limits.py, "You have
3 of 3 sessions (running or starting; your quota).") and the reason a PENDING request waits for a
quota (scheduler.py, "waiting for quota: you have 3 of 3 sessions (running or starting; your
quota)"). Pure."""

from __future__ import annotations

from fgpu_shared.units import format_size


def holding_clause(kind: str, group: str | None, used: float, limit: float) -> str:
    """ "you have 3 of 3 sessions (running or starting; your quota)",
    "group 'lab' holds 2 fGPU of 2 fGPU (its quota)"."""
    who = "you" if group is None else f"group '{group}'"
    whose = "your quota" if group is None else "its quota"
    have = "have" if group is None else "has"
    if kind == "sessions":
        return f"{who} {have} {int(used)} of {int(limit)} sessions (running or starting; {whose})"
    if kind == "pending":
        return f"{who} {have} {int(used)} of {int(limit)} requests waiting in the queue ({whose})"
    hold = "hold" if group is None else "holds"
    return f"{who} {hold} {amount(kind, used)} of {amount(kind, limit)} ({whose})"


def limit_sentence(kind: str, group: str | None, used: float, limit: float) -> str:
    """The clause as a sentence: "You have 3 of 3 sessions (running or starting; your quota)."."""
    clause = holding_clause(kind, group, used, limit)
    return clause[0].upper() + clause[1:] + "."


def waiting_reason(kind: str, group: str | None, used: float, limit: float, asked: float) -> str:
    """Why a request waits for a quota, with the figures the pages show."""
    reason = f"waiting for quota: {holding_clause(kind, group, used, limit)}"
    if kind in ("sessions", "pending"):
        return reason
    return f"{reason}; this request asks for {amount(kind, asked)} more"


def amount(kind: str, value: float) -> str:
    if kind == "mem":
        return f"{format_size(int(value))} memory"
    number = f"{round(value, 2):g}"
    if kind == "cpu":
        return f"{number} CPU core" + ("" if value == 1 else "s")
    return f"{number} fGPU"
