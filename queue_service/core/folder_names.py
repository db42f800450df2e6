"""What a storage folder may be called, and which paths inside one a request may name. Pure.

A folder's name is what a person sees and what its mount point in a session is called
(`/home/jovyan/folders/<name>`), so it is one path component a shell can type: letters, digits,
`.`, `_`, `-` and inner spaces, at most `MAX_NAME` characters. A name that starts with `.` marks an
**automount** folder (`.local`, `.cache`), mounted in every session of its owner without asking.

A path inside a folder is a list of components, each checked here before the file system sees
it: no empty component, no `.` or `..`, no NUL, no component longer than the file system allows.
Symlinks are the file layer's to refuse (`store/folder_files.py`): only the disk knows them.
"""

from __future__ import annotations

import re

from queue_service.core.errors import Refusal

MAX_NAME = 64
#: Linux's NAME_MAX (bytes of one component) and a cap on a whole path's bytes.
MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 4096
#: Levels of a path the files API reaches or makes: deep enough for any project's tree, and far
#: from where walking a tree gets costly (a session can still make deeper ones on disk, which
#: the service walks without recursion: store/tree_walk.py).
MAX_PATH_DEPTH = 64
_NAME_RE = re.compile(r"[A-Za-z0-9._-]([A-Za-z0-9._ -]*[A-Za-z0-9._-])?")
PERMISSIONS = ("ro", "rw")


def folder_name(name) -> str:
    """`name` if it may name a folder; else a refusal that says what is wrong with it."""
    if not isinstance(name, str) or not name:
        raise Refusal("A folder needs a name.", "invalid")
    if len(name) > MAX_NAME:
        raise Refusal(f"A folder's name has at most {MAX_NAME} characters.", "invalid")
    if name in (".", ".."):
        raise Refusal(f"{name!r} cannot name a folder.", "invalid")
    if not _NAME_RE.fullmatch(name):
        raise Refusal(
            f"{name!r} cannot name a folder: use letters, digits, '.', '_', '-' and spaces "
            "between them (no '/').",
            "invalid",
        )
    return name


def is_automount(name: str) -> bool:
    """Whether a folder of this name is mounted in every session of its owner."""
    return name.startswith(".")


def permission(value) -> str:
    """A share's permission: "ro" (read-only) or "rw" (read-write)."""
    if value not in PERMISSIONS:
        raise Refusal('A share\'s permission is "ro" (read-only) or "rw" (read-write).', "invalid")
    return value


def path_parts(path: str) -> tuple[str, ...]:
    """The components of `path` inside a folder ("" is the folder itself); a refusal for any
    path that could leave it or that no file system would take."""
    if "\0" in path:
        raise Refusal("A path cannot hold a NUL character.", "invalid")
    if path.startswith("/"):
        raise Refusal("A path inside a folder does not start with '/'.", "invalid")
    if len(path.encode()) > MAX_PATH_BYTES:
        raise Refusal(f"A path has at most {MAX_PATH_BYTES} bytes.", "invalid")
    parts = tuple(path.rstrip("/").split("/")) if path.strip("/") else ()
    if len(parts) > MAX_PATH_DEPTH:
        raise Refusal(
            f"A path has at most {MAX_PATH_DEPTH} levels of folders; this one has {len(parts)}.",
            "invalid",
        )
    for part in parts:
        if part in ("", ".", ".."):
            raise Refusal(f"{path!r} is not a path inside the folder ('{part}').", "invalid")
        if len(part.encode()) > MAX_COMPONENT_BYTES:
            raise Refusal(f"A file name has at most {MAX_COMPONENT_BYTES} bytes.", "invalid")
    return parts
