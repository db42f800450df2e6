"""Walking, measuring and removing a directory tree without recursion and without following links.

A session writes storage folders and homes directly and can make a tree thousands of levels deep
(one `mkdir` per level). `os.fwalk` and `shutil.rmtree` recurse once per level and raise
RecursionError past about a thousand, so this module walks with an explicit stack instead:

- each directory is opened relative to its parent's descriptor with O_NOFOLLOW|O_DIRECTORY, so a
  link (planted, or swapped in meanwhile) is never entered: it is listed with the other names;
- at most `MAX_OPEN` descriptors are held, however deep the tree: when the walk goes deeper, the
  shallowest held descriptor (below the top) is closed, and a frame that needs its descriptor
  again (to open its next child, or to remove a child) re-opens it from the nearest held ancestor,
  one name at a time with the same flags. Holding one descriptor per level would run a deep tree
  into the process's descriptor limit (1,024 by default) and take them from the service's other
  work; re-opening costs one `openat` per level only on the way back up past a closed frame.
  A directory renamed inside the tree meanwhile may be re-opened under its new place: the walk
  then sees another part of the same tree, never anything outside it, as no link is followed.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

#: Descriptors one walk holds at most (besides the caller's top one).
MAX_OPEN = 32
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class _Frame:
    name: str
    fd: int | None
    pending: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Totals:
    """Bytes on disk of the regular files, the number of entries that are not directories, and
    the newest modification time seen (directories included)."""

    bytes: int
    files: int
    modified: float


def _listing(fd: int) -> tuple[list[str], list[str]]:
    """(directories, other names) of an open directory; a link is never a directory here."""
    dirs, others = [], []
    with os.scandir(fd) as entries:
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            (dirs if is_dir else others).append(entry.name)
    return dirs, others


class _Walk:
    """One walk's stack of frames, the top one held by the caller (never closed here)."""

    def __init__(self, top_fd: int):
        self.stack = [_Frame("", top_fd)]

    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.stack[1:])

    def fd_of(self, index: int) -> int:
        """The descriptor of frame `index`, re-opened from its nearest held ancestor if closed."""
        frame = self.stack[index]
        if frame.fd is not None:
            return frame.fd
        start = max(i for i in range(index) if self.stack[i].fd is not None)
        fd = self.stack[start].fd
        for i in range(start + 1, index + 1):
            inner = os.open(self.stack[i].name, DIR_FLAGS, dir_fd=fd)
            if i > start + 1:
                os.close(fd)
            fd = inner
        frame.fd = fd
        self._bound()
        return fd

    def push(self, name: str) -> int | None:
        """Open child `name` of the deepest frame and make it the deepest; None when it is gone
        or is no longer a directory (a link swapped in)."""
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=self.fd_of(len(self.stack) - 1))
        except (FileNotFoundError, NotADirectoryError, OSError):
            return None
        self.stack.append(_Frame(name, fd))
        self._bound()
        return fd

    def pop(self) -> _Frame:
        frame = self.stack.pop()
        if frame.fd is not None:
            os.close(frame.fd)
            frame.fd = None
        return frame

    def close(self) -> None:
        while len(self.stack) > 1:
            self.pop()

    def _bound(self) -> None:
        held = [i for i in range(1, len(self.stack)) if self.stack[i].fd is not None]
        for i in held[: max(0, len(held) - MAX_OPEN)]:
            os.close(self.stack[i].fd)
            self.stack[i].fd = None


def walk(
    top_fd: int, after: Callable[[int, str], None] | None = None
) -> Iterator[tuple[tuple[str, ...], int, list[str], list[str]]]:
    """Top-down: (names from the top, directory descriptor, its directories, its other names)
    for every directory under `top_fd` (itself first). The descriptor is valid until the next
    step. `after(parent_fd, name)` is called once a directory's whole subtree was walked."""
    state = _Walk(top_fd)
    try:
        dirs, others = _listing(top_fd)
        yield (), top_fd, dirs, others
        state.stack[0].pending = list(reversed(dirs))
        while state.stack:
            frame = state.stack[-1]
            if not frame.pending:
                if len(state.stack) == 1:
                    return
                done = state.pop()
                if after is not None:
                    after(state.fd_of(len(state.stack) - 1), done.name)
                continue
            fd = state.push(frame.pending.pop())
            if fd is None:
                continue
            try:
                dirs, others = _listing(fd)
            except OSError:
                dirs, others = [], []
            yield state.names(), fd, dirs, others
            state.stack[-1].pending = list(reversed(dirs))
    finally:
        state.close()


def totals(top_fd: int) -> Totals:
    """Bytes on disk, entries that are not directories, newest change, under `top_fd`."""
    size = files = 0
    newest = os.fstat(top_fd).st_mtime
    for _, fd, _, others in walk(top_fd):
        newest = max(newest, os.fstat(fd).st_mtime)
        for name in others:
            with contextlib.suppress(FileNotFoundError):
                info = os.lstat(name, dir_fd=fd)
                size += info.st_blocks * 512 if stat.S_ISREG(info.st_mode) else 0
                files += 1
                newest = max(newest, info.st_mtime)
    return Totals(size, files, newest)


def remove_tree(parent_fd: int, name: str) -> None:
    """Remove directory `name` of `parent_fd` and everything in it (links removed, never
    followed). Its own name must be a directory, not a link (O_NOFOLLOW refuses one)."""
    top = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    try:
        for _, fd, _, others in walk(top, after=_remove_directory):
            for other in others:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(other, dir_fd=fd)
    finally:
        os.close(top)
    os.rmdir(name, dir_fd=parent_fd)


def _remove_directory(parent_fd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(name, dir_fd=parent_fd)
