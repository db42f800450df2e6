"""A course's message to its members: what an instructor posts, and the announcement it becomes.

An instructor (or an admin) posts a short message to a course (`POST api/courses/{name}/message`);
the service keeps it in the course's group property, beside the instructors:

    "fgpu_course": {"instructors": ["tim"], "message": {"text": "...", "by": "tim", "at": "…Z"}}

Every member then sees it as the hub's announcement, the banner on top of the hub's pages and the
service's: the hub reads it through `c.JupyterHub.template_vars` (`announcement_of` takes the hub's
user), the service's pages from the groups it reads anyway. One function makes the banner's HTML
for both, escaping everything an instructor wrote: JupyterHub renders an announcement unescaped
(`{{ announcement | safe }}`), and an instructor must not be able to put markup, let alone a
script, on a student's hub page.
"""

from __future__ import annotations

from collections.abc import Iterable

from markupsafe import Markup

from fgpu_shared import group_properties
from fgpu_shared.course_mark import COURSE_PROPERTY

#: The longest message, in characters: a banner, not a page.
MAX_MESSAGE = 500


def message_problem(text: object) -> str | None:
    """Why `text` cannot be a course's message, or None."""
    if not isinstance(text, str):
        return "text must be a string (an empty one takes the message down)."
    if len(text) > MAX_MESSAGE:
        return f"A course's message is at most {MAX_MESSAGE} characters; this one has {len(text)}."
    return None


def message_of(properties: dict | None) -> dict | None:
    """The course message a group's (decoded) properties hold, or None."""
    mark = (properties or {}).get(COURSE_PROPERTY)
    message = mark.get("message") if isinstance(mark, dict) else None
    if not isinstance(message, dict) or not isinstance(message.get("text"), str):
        return None
    return message if message["text"].strip() else None


def announcement(courses: Iterable[tuple[str, dict | None]]) -> Markup:
    """The banner for (course name, message) pairs, one line per message; empty for none."""
    lines = [
        Markup("<strong>{}</strong> · {}: {}").format(
            name, message.get("by") or "", message["text"]
        )
        for name, message in sorted(courses, key=lambda pair: pair[0])
        if message is not None
    ]
    return Markup("<br>").join(lines)


def announcement_of(user) -> Markup:
    """The hub's `template_vars` callable: the messages of `user`'s courses (the hub's User, or
    None on the login page, which shows none). Group properties are in the hub's own database,
    so this reads nothing over the network."""
    if user is None:
        return Markup("")
    groups = getattr(user, "groups", None) or ()
    return announcement(
        (group.name, message_of(group_properties.decoded(group.properties))) for group in groups
    )
