"""A PostgreSQL dump from an archive, fed to psql with its backslash commands locked.

psql runs more than SQL: a line such as `\\! rm -rf ~` in a dump runs a shell command on the
machine that restores, as whoever restores. `pg_dump` writes no such command (15.14 and later
write `\\restrict KEY` ... `\\unrestrict KEY` around the dump, for exactly this reason). So the
copy psql reads starts with a `\\restrict` of a key this restore alone knows: psql then refuses
every backslash command but `\\unrestrict` with that key, wherever it hides in a line. Lines that
start with one (outside COPY data) are refused before any database is touched, with the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from .archive import ArchiveError

#: The dump's own lock (pg_dump >= 15.14): replaced by the restore's.
_LOCK_RE = re.compile(rb"^\\(un)?restrict [A-Za-z0-9]+\r?\n?$")
#: The start of a COPY block: its data lines follow, up to `\.`, and are never commands.
_COPY_RE = re.compile(rb"^COPY .* FROM stdin;\r?\n?$")
_COPY_END = b"\\."


#: The first minor release of each major that knows `\restrict` (August 2025); 18 on all do.
_RESTRICT_SINCE = {13: 22, 14: 19, 15: 14, 16: 10, 17: 6}
_VERSION_RE = re.compile(r"\(PostgreSQL\) (\d+)(?:\.(\d+))?")


def knows_restrict(version: str) -> bool:
    """Whether the psql of `psql --version` (e.g. "psql (PostgreSQL) 15.18 (Debian ...)") can
    lock a dump's commands."""
    match = _VERSION_RE.search(version)
    if match is None:
        return False
    major, minor = int(match.group(1)), int(match.group(2) or 0)
    return major >= 18 or minor >= _RESTRICT_SINCE.get(major, 10**6)


def locked_lines(lines: Iterable[bytes], key: str, member: str) -> Iterator[bytes]:
    """The dump's lines behind a `\\restrict key`; an ArchiveError at a line that is a psql
    command (outside COPY data)."""
    yield f"\\restrict {key}\n".encode()
    in_copy = False
    for number, line in enumerate(lines, 1):
        if in_copy:
            in_copy = line.rstrip(b"\r\n") != _COPY_END
        elif _LOCK_RE.match(line):
            continue
        elif line.startswith(b"\\"):
            command = line.split()[0].decode(errors="replace")
            raise ArchiveError(
                f"{member} runs the psql command {command!r} (line {number}); a dump of"
                " fgpu-hub backup never does; nothing restored"
            )
        else:
            in_copy = bool(_COPY_RE.match(line))
        yield line


def locked_copy(dump: Path, copy: Path, key: str, member: str) -> None:
    """`dump` as psql will read it, written to `copy`."""
    with open(dump, "rb") as lines, open(copy, "wb") as out:
        for line in locked_lines(lines, key, member):
            out.write(line)
