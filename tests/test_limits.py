"""queue_service.core.limits: every quota figure that applies, its use, and the sentence the pages
show. Pure: no hub, no DB (the figures as api/resources gives them: tests/test_queue.py)."""

from __future__ import annotations

import pytest

from queue_service.core.limits import Holding, quota_limits
from queue_service.core.quota_wording import limit_sentence
from queue_service.core.resource_model import UNLIMITED, Quota, SlotLimits

GIB = 1024**3


def holding(group=None, quota=UNLIMITED, cpu=0.0, mem=0, fgpu=0.0, sessions=0, pending=0):
    return Holding(group, quota, cpu, mem, fgpu, sessions, pending)


def test_the_issues_case_names_the_session_quota_with_its_figures():
    quota = Quota(max_sessions=3, max_pending=2, max_slots=SlotLimits(fgpu=4))
    rows = quota_limits([holding(quota=quota, fgpu=3, sessions=3)])

    assert [row["kind"] for row in rows] == ["sessions", "pending", "fgpu"]
    sessions = rows[0]
    assert sessions["reached"] is True and sessions["left"] == 0
    assert sessions["text"].startswith("You have 3 of 3 sessions")
    assert rows[2]["reached"] is False and rows[2]["left"] == 1
    assert rows[2]["text"] == "You hold 3 fGPU of 4 fGPU (your quota)."


def test_no_quota_lists_nothing():
    assert quota_limits([holding(), holding(group="students")]) == []


def test_a_group_quota_says_whose_it_is_and_counts_all_members():
    quota = Quota(max_slots=SlotLimits(cpu=2, mem=4 * GIB))
    rows = quota_limits([holding(), holding("students", quota, cpu=2, mem=GIB)])

    assert [(r["kind"], r["group"], r["reached"]) for r in rows] == [
        ("cpu", "students", True),
        ("mem", "students", False),
    ]
    assert rows[0]["text"] == "Group 'students' holds 2 CPU cores of 2 CPU cores (its quota)."
    assert rows[1]["text"] == "Group 'students' holds 1 GiB memory of 4 GiB memory (its quota)."


def test_fractions_that_fill_a_quota_exactly_reach_it():
    rows = quota_limits([holding(quota=Quota(max_slots=SlotLimits(fgpu=0.3)), fgpu=0.1 + 0.2)])
    assert rows[0]["reached"] is True


def test_a_zero_quota_is_reached_before_anything_is_held():
    rows = quota_limits([holding(quota=Quota(max_slots=SlotLimits(fgpu=0)))])
    assert rows[0]["reached"] is True
    assert rows[0]["text"] == "You hold 0 fGPU of 0 fGPU (your quota)."


@pytest.mark.parametrize(
    ("kind", "group", "used", "limit", "text"),
    [
        ("pending", None, 2, 2, "You have 2 of 2 requests waiting in the queue (your quota)."),
        (
            "pending",
            "lab",
            1,
            4,
            "Group 'lab' has 1 of 4 requests waiting in the queue (its quota).",
        ),
        (
            "sessions",
            "lab",
            4,
            4,
            "Group 'lab' has 4 of 4 sessions (running or starting; its quota).",
        ),
        ("cpu", None, 1, 1, "You hold 1 CPU core of 1 CPU core (your quota)."),
        (
            "mem",
            None,
            1536 * 1024**2,
            2 * GIB,
            "You hold 1.5 GiB memory of 2 GiB memory (your quota).",
        ),
        ("fgpu", None, 0.5, 1, "You hold 0.5 fGPU of 1 fGPU (your quota)."),
    ],
)
def test_each_figure_reads_as_a_sentence_with_its_unit(kind, group, used, limit, text):
    assert limit_sentence(kind, group, used, limit) == text
