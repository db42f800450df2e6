"""What a course's instructors may do to the catalog (queue_service/course_images.py): the
images offered only to courses they teach, nothing another class or everyone sees."""

from __future__ import annotations

import pytest

from queue_service.course_images import may_manage, refusal

TAUGHT = frozenset({"cs101", "cs102"})


@pytest.mark.parametrize(
    ("groups", "manages"),
    [
        (["cs101"], True),
        (["cs101", "cs102"], True),
        ([], False),  # everyone's
        (["cs101", "cs999"], False),  # another class sees it too
        (["cs999"], False),
        ("cs101", False),  # not a list
        ([{"x": 1}], False),
    ],
)
def test_a_course_curator_manages_only_images_offered_to_their_courses_alone(groups, manages):
    assert may_manage(TAUGHT, {"name": "lab", "groups": groups}) is manages


def test_a_catalog_curator_manages_everything():
    assert may_manage(None, {"name": "lab", "groups": []})


def test_the_refusal_names_the_courses_and_who_would_see_the_image():
    words = refusal(TAUGHT, [{"name": "lab", "groups": ["cs101"]}, {"name": "lab", "groups": []}])
    assert "courses you teach (cs101, cs102)" in words
    assert "'lab' would be offered to everyone" in words
    assert refusal(TAUGHT, [{"name": "lab", "groups": ["cs102"]}]) is None
    assert refusal(frozenset(), []) == "You teach no course."
