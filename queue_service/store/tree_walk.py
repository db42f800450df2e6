"""Walking a directory tree a session wrote: without recursion, without following a link, and
with a bounded number of open descriptors, however deep the tree is.

Sessions write storage folders and homes directly, so a tree may be any depth: a chain of
100,000 directories costs a student a few seconds. `os.fwalk` and `shutil.rmtree` recurse (a
`RecursionError` near 1,000 levels) and hold one descriptor per level (`EMFILE` past the
process's limit); either failure used to stop the measure round, the trash purge and the
backup for every folder.

How this walk goes, and why it is correct:

- **One directory open at a time** (plus the top, which the caller owns). Going down, a
  subdirectory is opened relative to the current one with `O_NOFOLLOW | O_DIRECTORY`: a link
  is never entered (the open fails and the entry is left as it is), and a directory replaced
  by a link meanwhile is likewise refused.
- **Going up by `..`, checked.** Each level remembers the device and inode of its directory.
  Back from a child, `..` is opened relative to the child and must be that same directory;
  if a session moved the child elsewhere meanwhile, `..` is another directory and the walk
  stops with `TreeChanged` rather than go on in a place it did not choose. Going back to
  the top itself reuses the top's descriptor. Re-opening each parent from the top instead
  would be as safe but cost depth² opens (5·10⁹ for a 100,000-deep chain); keeping every
  level open would cost depth descriptors.
- **Memory** is the names still to visit on the way down (the subdirectories of each
  directory on the current path): no more than the tree's own listing.

`walk` yields `Enter` on the way down (top-down, the top first) and `Leave` after a
directory's subtree (bottom-up), so one walk serves measuring, tagging, archiving and
removing (`remove_tree`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TreeChanged(OSError):
    """A directory moved while it was walked: the walk stops where it is (the next one, a
    round later, sees the tree as it is then)."""


@dataclass(frozen=True)
class Enter:
    """A directory reached: `fd` is open on it until the walk goes on (do not close it);
    `names` are its entries (links, files and subdirectories); `path` the names from the top
    (the walker's own list: read it, do not keep or change it)."""

    path: list[str]
    fd: int
    names: list[str]


@dataclass(frozen=True)
class Leave:
    """A directory's subtree is done: `parent_fd` is open on its parent, `name` is its name
    there (so it can be removed). Not yielded for the top."""

    parent_fd: int
    name: str


@dataclass
class _Level:
    identity: tuple[int, int]
    subdirs: list[str] = field(default_factory=list)


def walk(top_fd: int) -> Iterator[Enter | Leave]:
    """Every directory under (and including) the directory open at `top_fd`, never following
    a link. A subdirectory that vanishes or turns into a link meanwhile is skipped."""
    path: list[str] = []
    levels = [_Level(_identity(top_fd))]
    fd = top_fd
    try:
        levels[0].subdirs = yield from _enter(path, fd)
        while levels:
            level = levels[-1]
            if level.subdirs:
                name = level.subdirs.pop()
                child = _open_dir(name, fd)
                if child is None:
                    continue
                _close_unless_top(fd, top_fd)
                fd = child
                path.append(name)
                levels.append(_Level(_identity(fd)))
                levels[-1].subdirs = yield from _enter(path, fd)
                continue
            levels.pop()
            if not levels:
                return
            name = path.pop()
            child, fd = fd, top_fd  # _up closes the child, whatever happens
            fd = _up(child, top_fd, levels[-1].identity, outer=len(levels) == 1)
            yield Leave(fd, name)
    finally:
        _close_unless_top(fd, top_fd)


def remove_tree(parent_fd: int, name: str) -> None:
    """Remove `name` in the directory open at `parent_fd` and all below it: a link or file is
    unlinked itself (never followed), a directory is emptied bottom-up, then removed."""
    try:
        top = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as e:
        if e.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        os.unlink(name, dir_fd=parent_fd)  # a link (even to a directory) or a file
        return
    try:
        for step in walk(top):
            if isinstance(step, Enter):
                for entry in step.names:
                    if not is_dir(entry, step.fd):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(entry, dir_fd=step.fd)
            else:
                os.rmdir(step.name, dir_fd=step.parent_fd)
    finally:
        os.close(top)
    os.rmdir(name, dir_fd=parent_fd)


def is_dir(name: str, dir_fd: int) -> bool:
    """Whether `name` is a directory itself (a link to one is not)."""
    try:
        return stat.S_ISDIR(os.lstat(name, dir_fd=dir_fd).st_mode)
    except FileNotFoundError:
        return False


def _enter(path: list[str], fd: int):
    names = os.listdir(fd)
    yield Enter(path, fd, names)
    # Listed after the caller's turn: a remover has unlinked the files by then.
    return [name for name in names if is_dir(name, fd)]


def _open_dir(name: str, dir_fd: int) -> int | None:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None  # gone, or a link or file put in its place meanwhile: not entered
        raise


def _up(fd: int, top_fd: int, identity: tuple[int, int], outer: bool) -> int:
    """The parent of the directory open at `fd` (which is closed), checked to be the one the
    walk came down from."""
    try:
        parent = top_fd if outer else os.open("..", DIR_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    if _identity(parent) != identity:
        _close_unless_top(parent, top_fd)
        raise TreeChanged(errno.ESTALE, "a directory was moved while it was walked")
    return parent


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _close_unless_top(fd: int, top_fd: int) -> None:
    if fd != top_fd:
        os.close(fd)
