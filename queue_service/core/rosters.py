"""A course's roster as an instructor uploads it: CSV text, one `user,role` line per person,
or `user,display name,role` (an LMS's or a registrar's export names people too).

Pure (no I/O): the whole roster is read and checked here before the service makes its first
call to the hub, so a roster with one bad line changes nothing. A refusal names the line.

- `role` is `student` or `instructor`; a first line `user,role` (or `user,name,role`) is a header
  and skipped;
- a display name is optional, at most `MAX_DISPLAY_NAME` characters of printable text; the
  Course page shows it beside the user name (the hub itself keeps no display names);
- user names are hub names as the hub keeps them: lower case (JupyterHub lower-cases a name it
  creates, so `Ann` on a roster would make `ann` and then never match), letters, digits and
  `._@-`, at most `MAX_USER_NAME` characters;
- empty lines are skipped; a name twice is refused (which of the two roles was meant?);
- at most `MAX_ROWS` people, and the roster names at least one instructor: a roster without one
  would leave the course with nobody to run it.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field

from .errors import Refusal

ROLES = ("student", "instructor")
MAX_ROWS = 2000
MAX_USER_NAME = 64
#: The largest roster body: MAX_ROWS lines of a long name and a role fit with room to spare.
MAX_BYTES = 256 * 1024
USER_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._@-]*")
MAX_DISPLAY_NAME = 100
_HEADERS = {("user", "role"), ("user", "name", "role"), ("user", "display name", "role")}


@dataclass(frozen=True)
class Roster:
    """Who a course has: its students and its instructors, in the roster's order."""

    students: tuple[str, ...]
    instructors: tuple[str, ...]
    #: Display names, for those the roster gave one.
    names: dict[str, str] = field(default_factory=dict)

    @property
    def members(self) -> tuple[str, ...]:
        return self.instructors + self.students


def user_name_problem(name: object) -> str | None:
    """Why `name` is no hub user name a course can hold, or None when it is one."""
    if not isinstance(name, str) or not name:
        return "a user name is missing"
    if len(name) > MAX_USER_NAME or not USER_NAME_RE.fullmatch(name):
        return (
            f"{name[:MAX_USER_NAME]!r} is not a user name (lower-case letters, digits and ._@-, "
            f"at most {MAX_USER_NAME} characters)"
        )
    return None


def parse_roster(text: str) -> Roster:
    """The roster in `text`, or a Refusal ("invalid") naming the first bad line."""
    people: dict[str, str] = {}
    names: dict[str, str] = {}
    for number, row in _rows(text):
        cells = tuple(cell.strip() for cell in row)
        if not any(cells) or (not people and _is_header(cells)):
            continue
        user, name, role = _person(number, cells)
        if user in people:
            raise _bad(number, f"{user!r} is on the roster twice")
        people[user] = role
        if name:
            names[user] = name
        if len(people) > MAX_ROWS:
            raise _bad(number, f"a roster holds at most {MAX_ROWS} people")
    return _roster_of(people, names)


def _rows(text: str):
    """(line number, cells) of each line; a line the csv module cannot read is refused."""
    reader = csv.reader(text.splitlines())
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise _bad(reader.line_num, str(e)) from None
        yield reader.line_num, row


def _is_header(cells: tuple[str, ...]) -> bool:
    return tuple(cell.lower().replace("_", " ") for cell in cells) in _HEADERS


def _person(number: int, cells: tuple[str, ...]) -> tuple[str, str, str]:
    """(user, display name or "", role) of a line."""
    if len(cells) not in (2, 3):
        raise _bad(number, f"write `user,role` or `user,name,role` (found {len(cells)} columns)")
    user, name, role = (cells[0], "", cells[1]) if len(cells) == 2 else cells
    problem = user_name_problem(user)
    if problem:
        raise _bad(number, problem)
    if len(name) > MAX_DISPLAY_NAME or not name.isprintable():
        raise _bad(
            number, f"a display name is printable text of at most {MAX_DISPLAY_NAME} characters"
        )
    if role not in ROLES:
        raise _bad(number, f"the role {role[:32]!r} is neither student nor instructor")
    return user, name, role


def _roster_of(people: dict[str, str], names: dict[str, str]) -> Roster:
    instructors = tuple(user for user, role in people.items() if role == "instructor")
    if not instructors:
        raise Refusal("The roster names no instructor: a course needs at least one.")
    students = tuple(user for user, role in people.items() if role == "student")
    return Roster(students=students, instructors=instructors, names=names)


def _bad(number: int, problem: str) -> Refusal:
    return Refusal(f"Roster line {number}: {problem}. Nothing was changed.")
