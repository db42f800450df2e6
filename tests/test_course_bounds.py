"""A course's bounds (course_bounds.py): what an instructor may write of the allowance and the
presets, checked with the readers the service reads them with."""

from __future__ import annotations

import pytest

from queue_service.core.errors import Refusal
from queue_service.course_bounds import (
    changed_allowance,
    limit_phrase,
    read_presets,
    read_quota,
    within_bounds,
)
from queue_service.quotas import parse_member_quota, parse_quota

BOUNDS = {"fgpu": 8, "mem": "64G", "sessions": 3, "fgpu_hours_per_week": 40}


def refusal(call, *args, **kwargs) -> Refusal:
    with pytest.raises(Refusal) as caught:
        call(*args, **kwargs)
    return caught.value


def test_an_instructor_sets_bounded_keys_within_their_bounds():
    current = {"fgpu": 2, "cpu": 4}
    change = {"fgpu": 8, "mem": "32G", "fgpu_hours_per_week": 10}
    allowance = changed_allowance(current, change, BOUNDS, instructor=True)
    assert allowance == {"fgpu": 8, "cpu": 4, "mem": "32G", "fgpu_hours_per_week": 10}
    # What is accepted is what the quota reader reads.
    assert parse_quota(allowance, "course").max_slots.fgpu == 8


@pytest.mark.parametrize(
    "change, words",
    [
        ({"fgpu": 8.5}, "fgpu: at most 8 fGPU for the course"),
        ({"mem": "65G"}, "mem: at most 64 GiB"),
        ({"sessions": 4}, "at most 3 sessions"),
        ({"fgpu_hours_per_week": 41}, "at most 40 fGPU-hours per week"),
        ({"fgpu": None}, "fgpu: at most 8 fGPU"),  # no limit is beyond any bound
    ],
)
def test_a_value_beyond_its_bound_is_refused_naming_the_bound(change, words):
    problem = refusal(changed_allowance, {"fgpu": 2}, change, BOUNDS, instructor=True)
    assert problem.cause == "invalid"
    assert words in str(problem) and "set by an admin" in str(problem)


def test_an_instructor_may_not_touch_a_key_without_a_bound():
    problem = refusal(changed_allowance, {}, {"cpu": 1}, BOUNDS, instructor=True)
    assert problem.cause == "forbidden" and "cpu" in str(problem)
    # An admin may, and is held to the bounds that exist.
    assert changed_allowance({}, {"cpu": 1}, BOUNDS, instructor=False) == {"cpu": 1}
    assert refusal(changed_allowance, {}, {"fgpu": 9}, BOUNDS, instructor=False)


@pytest.mark.parametrize(
    "change", [{"fgpu": -1}, {"mem": "lots"}, {"fgpu_hours_per_week": "x"}, {"fgpu": "nan"}]
)
def test_what_the_quota_readers_refuse_is_refused(change):
    problem = refusal(changed_allowance, {}, change, BOUNDS, instructor=False)
    assert problem.cause == "invalid"


def test_bounds_are_quota_mappings():
    assert read_quota(None, "bounds") is None
    assert read_quota({"fgpu": 8, "resource_groups": ["a"]}, "bounds")
    for bad in ({"gpus": 1}, {"fgpu": "many"}, [1], "8"):
        assert refusal(read_quota, bad, "bounds").cause == "invalid"


def test_setting_bounds_lowers_the_allowance_to_them():
    bounds = {"fgpu": 4, "mem": "8G", "resource_groups": ["a", "b"]}
    lowered = within_bounds({"fgpu": 6, "mem": "2G", "resource_groups": ["b", "c"]}, bounds)
    assert lowered == {"fgpu": 4, "mem": "2G", "resource_groups": ["b"]}
    assert within_bounds(None, bounds) == {"fgpu": 4, "mem": "8G", "resource_groups": ["a", "b"]}


def test_resource_groups_stay_within_theirs():
    bounds = {"resource_groups": ["default"]}
    assert changed_allowance({}, {"resource_groups": "default"}, bounds, instructor=True)
    problem = refusal(changed_allowance, {}, {"resource_groups": ["gpu"]}, bounds, instructor=True)
    assert "only the resource groups default" in str(problem)
    assert limit_phrase("storage", "10G") == (
        "at most 10 GiB of storage for the course (all its members together), set by an admin"
    )


def test_presets_are_read_as_the_service_reads_them_and_kept_within_the_bounds():
    good = [{"name": "half GPU", "cpu": 2, "mem": "8G", "fgpu": 1}]
    assert read_presets(good, BOUNDS) == good
    assert read_presets(None, BOUNDS) is None
    big = [{"name": "huge", "cpu": 1, "mem": "128G", "fgpu": 1}]
    assert "Preset huge: mem: at most 64 GiB" in str(refusal(read_presets, big, BOUNDS))
    twice = good * 2
    assert "twice" in str(refusal(read_presets, twice, BOUNDS))
    many = [{"name": f"p{i}", "cpu": 1, "mem": "1G"} for i in range(21)]
    assert "at most 20 presets" in str(refusal(read_presets, many, BOUNDS))
    assert refusal(read_presets, {"name": "x"}, BOUNDS).cause == "invalid"


def test_per_member_bounds_hold_what_each_student_may_be_given():
    bounds = {"fgpu": 8, "per_member": {"fgpu": 2, "sessions": 2}}
    given = changed_allowance(
        {"fgpu": 4}, {"per_member": {"fgpu": 1, "sessions": 2}}, bounds, instructor=True
    )
    assert given == {"fgpu": 4, "per_member": {"fgpu": 1, "sessions": 2}}
    assert parse_member_quota(given, "course").max_slots.fgpu == 1  # what the book reads
    for change, words in [
        ({"per_member": {"fgpu": 3, "sessions": 1}}, "per_member: fgpu: at most 2 fGPU for each"),
        ({"per_member": {"fgpu": 1}}, "per_member: sessions: at most 2 sessions for each member"),
        ({"per_member": None}, "per_member: fgpu: at most 2 fGPU"),
    ]:
        problem = refusal(changed_allowance, given, change, bounds, instructor=True)
        assert problem.cause == "invalid" and words in str(problem), str(problem)
    problem = refusal(changed_allowance, given, {"per_member": {"cpu": 1}}, bounds, True)
    assert problem.cause == "forbidden" and "per_member.cpu" in str(problem)
    # New bounds lower it; a preset bigger than one member may hold is refused.
    assert within_bounds({"per_member": {"fgpu": 4}}, bounds)["per_member"] == bounds["per_member"]
    big = [{"name": "big", "cpu": 1, "mem": "1G", "fgpu": 3}]
    assert "at most 2 fGPU for each member" in str(refusal(read_presets, big, bounds))
