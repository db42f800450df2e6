"""A course's roster (queue_service/core/rosters.py) and a group read as a course (courses.py):
every bad line is refused with its number, before anything would change."""

from __future__ import annotations

import re

import pytest

from queue_service.core.errors import Refusal
from queue_service.core.rosters import MAX_ROWS, parse_roster
from queue_service.courses import COURSE_PROPERTY, check_new_course, course_of


def test_a_roster_with_a_header_and_blank_lines_names_students_and_instructors():
    roster = parse_roster("user,role\r\nann,student\n\n tim , instructor \nbob,student\n")
    assert roster.students == ("ann", "bob")
    assert roster.instructors == ("tim",)
    assert roster.members == ("tim", "ann", "bob")


def test_a_header_is_read_in_any_case_but_only_as_the_first_line():
    assert parse_roster("User,Role\ntim,instructor\n").instructors == ("tim",)
    with pytest.raises(Refusal, match="line 2: 'user' is not a user name|line 2: the role"):
        parse_roster("tim,instructor\nuser,role\n")


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("tim,instructor\nann,teacher\n", "line 2: the role 'teacher' is neither"),
        ("tim,instructor\nAnn,student\n", "line 2: 'Ann' is not a user name"),
        ("tim,instructor\nann/../x,student\n", "line 2: 'ann/../x' is not a user name"),
        ("tim,instructor\n,student\n", "line 2: a user name is missing"),
        ("tim,instructor\nann,student\nann,instructor\n", "line 3: 'ann' is on the roster twice"),
        (
            "tim,instructor\nann\n",
            "line 2: write `user,role` or `user,name,role` (found 1 columns)",
        ),
        (
            "tim,instructor\nann,Ann,Lee,student\n",
            "line 2: write `user,role` or `user,name,role` (found 4",
        ),
        ("tim,instructor\nann,stu\x00dent\n", "line 2: "),
        ("ann,student\n", "names no instructor"),
        ("", "names no instructor"),
    ],
)
def test_a_bad_roster_is_refused_naming_its_line(text, found):
    with pytest.raises(Refusal, match=re.escape(found)) as refused:
        parse_roster(text)
    assert refused.value.message.endswith("Nothing was changed.") or "no instructor" in found


def test_a_roster_holds_at_most_so_many_people():
    lines = ["tim,instructor"] + [f"s{i},student" for i in range(MAX_ROWS)]
    with pytest.raises(Refusal, match=f"line {MAX_ROWS + 1}: a roster holds at most"):
        parse_roster("\n".join(lines))
    assert len(parse_roster("\n".join(lines[:MAX_ROWS])).members) == MAX_ROWS


def test_a_group_is_a_course_only_with_its_property():
    assert course_of({"name": "g", "users": ["ann"], "properties": {}}) is None
    group = {
        "name": "cs101",
        "users": ["tim", "ann"],
        "properties": {COURSE_PROPERTY: {"instructors": ["tim"]}, "fgpu_quota": {"fgpu": 8}},
    }
    course = course_of(group)
    assert (course.role_of("tim"), course.role_of("ann"), course.role_of("eve")) == (
        "instructor",
        "student",
        None,
    )
    assert course.listing("ann") == {
        "name": "cs101",
        "instructors": ["tim"],
        "role": "student",
        "members": 2,
        "allowance": {"fgpu": 8},
        "message": None,
        "bounds": None,
        "presets": None,
        "folder": None,
    }


@pytest.mark.parametrize(
    "body",
    [
        {"name": "cs101"},
        {"name": "cs101", "instructors": []},
        {"name": "cs101", "instructors": "tim"},
        {"name": "cs101", "instructors": ["tim", "tim"]},
        {"name": "cs101", "instructors": ["Tim"]},
        {"name": "a/b", "instructors": ["tim"]},
        {"name": "", "instructors": ["tim"]},
        {"name": 5, "instructors": ["tim"]},
    ],
)
def test_a_new_course_is_checked_before_anything(body):
    with pytest.raises(Refusal):
        check_new_course(body)


def test_a_roster_may_give_display_names_in_a_middle_column():
    roster = parse_roster(
        "user,name,role\ntim,Tim Berners,instructor\nann,,student\nbob,Bob Ng,student\n"
    )
    assert roster.members == ("tim", "ann", "bob")
    assert roster.names == {"tim": "Tim Berners", "bob": "Bob Ng"}
    # The two forms mix: a two-column line has no display name.
    assert parse_roster("tim,instructor\nann,Ann Lee,student\n").names == {"ann": "Ann Lee"}


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("tim,instructor\nann,A\tL,student\n", "line 2: a display name is printable text"),
        ("tim,instructor\nann," + "x" * 101 + ",student\n", "line 2: a display name"),
        ("tim,instructor\nann,Ann,Lee,student\n", "line 2: write `user,role` or `user,name,role`"),
    ],
)
def test_a_bad_display_name_is_refused_with_its_line(text, found):
    with pytest.raises(Refusal, match=re.escape(found)):
        parse_roster(text)
