"""The tree an SFTP login sees, and where each path of it is. Pure.

An SFTP login sees its home folder at `/` (what a session sees at `~`), and its storage folders at
`/folders/<name>` (what a session that mounts them sees at `~/folders/<name>`): its own and those
shared with it, session or not. `/folders` itself is not a directory of the home: it lists the
folders the login may reach, and nothing is made in it.

A path is checked here before any file is touched, with the Storage page's own rules
(`folder_names.path_parts`): no `..`, no NUL, no component longer than a file system takes. A
client's current directory is `/`, so a relative path is taken from there; `realpath` (what a
client's `cd` asks) folds `.` and `..` without ever climbing above `/`. Links are the file layer's
to refuse, since only the disk knows them (`store/folder_files.py`).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from queue_service.core.errors import Refusal
from queue_service.core.folder_names import MAX_PATH_BYTES, folder_name, path_parts

#: Where the storage folders are in the tree, as in a session's home.
FOLDERS = "folders"


@dataclass(frozen=True)
class Place:
    """Where a path is: `home` (`parts` in the home folder), `folders` (the list of folders) or
    `folder` (`parts` in the storage folder named `folder`)."""

    area: str
    parts: tuple[str, ...] = ()
    folder: str = ""


def place_of(path: str) -> Place:
    """Where `path` (absolute, or from `/`) is; a refusal for a path that could leave the tree."""
    if len(path.encode()) > MAX_PATH_BYTES:
        raise Refusal(f"A path has at most {MAX_PATH_BYTES} bytes.", "invalid")
    # Empty components and `.` are what a client's joins leave (`/a//b`, `/a/./b`): harmless.
    kept = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in kept:
        raise Refusal(f"{path!r}: '..' is not followed; name the path from /.", "forbidden")
    parts = path_parts("/".join(kept))
    if not parts or parts[0] != FOLDERS:
        return Place("home", parts)
    if len(parts) == 1:
        return Place("folders")
    return Place("folder", parts[2:], folder_name(parts[1]))


def real_path(path: str) -> str:
    """`path` made absolute and folded (`.` and `..`), never above `/`: what a client's `cd`
    and `pwd` show."""
    folded = posixpath.normpath(posixpath.join("/", path))
    return "/" + folded.lstrip("/")
