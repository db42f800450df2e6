"""What `PATCH api/courses/{name}` makes of a course's group properties (course_settings.py):
checked whole, one new set of properties or a refusal, the properties it does not touch kept as
stored."""

from __future__ import annotations

import json

import pytest

from queue_service.core.errors import Refusal
from queue_service.course_settings import check_change, new_properties

MARK = {"fgpu_course": {"instructors": ["tim"]}}


def refused(call, *args) -> Refusal:
    with pytest.raises(Refusal) as caught:
        call(*args)
    return caught.value


def test_an_instructor_needs_bounds_and_never_sets_them():
    assert refused(check_change, {"bounds": {"fgpu": 1}}, False).cause == "forbidden"
    problem = refused(new_properties, MARK, {"allowance": {"fgpu": 1}}, False)
    assert problem.cause == "forbidden" and "An admin must set" in str(problem)
    problem = refused(new_properties, MARK, {"presets": []}, False)
    assert problem.cause == "forbidden"


@pytest.mark.parametrize(
    "body", [{}, [], {"instructors": ["eve"]}, {"automount": "yes"}, {"allowance": 3}]
)
def test_a_malformed_change_is_refused(body):
    with pytest.raises(Refusal):
        new_properties(MARK, check_change(body, True), True)


def test_a_change_keeps_what_it_does_not_touch_as_stored():
    stored = {
        **MARK,
        "fgpu_quota": json.dumps({"fgpu": 2, "cpu": 4}),  # the admin panel's text
        "fgpu_course_bounds": {"fgpu": 8},
        "fgpu_job_time_limit": "8h",
    }
    changed = new_properties(stored, {"allowance": {"fgpu": 6}}, False)
    assert changed["fgpu_quota"] == {"fgpu": 6, "cpu": 4}
    assert {k: changed[k] for k in stored if k != "fgpu_quota"} == {
        k: stored[k] for k in stored if k != "fgpu_quota"
    }
    # A change that touches no allowance leaves the admin's text as it is.
    unchanged = new_properties(stored, {"presets": None}, False)
    assert unchanged["fgpu_quota"] == stored["fgpu_quota"]


def test_an_admins_new_bounds_lower_the_allowance_and_none_removes_them():
    stored = {**MARK, "fgpu_quota": {"fgpu": 10, "sessions": 5}}
    changed = new_properties(stored, {"bounds": {"fgpu": 8}}, True)
    assert changed["fgpu_quota"] == {"fgpu": 8, "sessions": 5}
    assert changed["fgpu_course_bounds"] == {"fgpu": 8}
    assert "fgpu_course_bounds" not in new_properties(changed, {"bounds": None}, True)
    # An admin's own allowance is held to the bounds as well, in the same request too.
    problem = refused(
        new_properties, stored, {"bounds": {"fgpu": 8}, "allowance": {"fgpu": 9}}, True
    )
    assert "at most 8 fGPU" in str(problem)


def test_automount_needs_the_course_folder():
    assert "no folder yet" in str(refused(new_properties, MARK, {"automount": True}, False))
    stored = {**MARK, "fgpu_course_folder": {"id": "abc", "automount": False}}
    changed = new_properties(stored, {"automount": True}, False)
    assert changed["fgpu_course_folder"] == {"id": "abc", "automount": True}
