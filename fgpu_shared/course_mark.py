"""The mark that makes a hub group a course: the group property `fgpu_course`,
`{"instructors": ["alice", "bob"]}` (docs/source/howto/courses.md).

The queue service reads it (queue_service/courses.py) and the hub's LMS login writes it
(fgpu_spawner/lti_courses.py), so its name lives here, where both may import it.
"""

from __future__ import annotations

COURSE_PROPERTY = "fgpu_course"


def marked_instructors(mark: object) -> list[str] | None:
    """The instructors a decoded `fgpu_course` value names, or None when it is no course mark.
    A mark without a list of instructors is a course without any."""
    if not isinstance(mark, dict):
        return None
    instructors = mark.get("instructors")
    if not isinstance(instructors, list):
        return []
    return [name for name in instructors if isinstance(name, str)]
