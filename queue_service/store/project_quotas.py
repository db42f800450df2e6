"""Kernel project quotas on the folders root: a write past a storage quota fails in the session.

Measured quotas (folders.py) refuse uploads and new folders and mount an over-quota folder
read-only at the next launch; a session can still write past the quota until then. Where the
folders root is on XFS or ext4 mounted with project quotas (`prjquota`), the kernel holds the
limit instead: each owner account has a project id (store/folders.py `project_of`), every folder
directory of the owner carries that id with the inherit flag, so whatever a session writes in it
counts under it, and the project's hard block limit is the owner's own storage quota. A write past
it fails with EDQUOT ("Disk quota exceeded") at once. A hub group's quota, over several owners'
folders, has no kernel form: it stays measured.

Two kernel interfaces, as `xfs_io -c chproj` and `xfs_quota` use them:

- the FS_IOC_FSGETXATTR / FS_IOC_FSSETXATTR ioctls set a directory's project id and the
  PROJINHERIT flag (new files and directories below take the id);
- `xfs_quota -x -c 'limit -p bhard=N id' <mount point>` sets the project's limit (xfsprogs drives
  XFS and ext4 alike).

`support_reason` says why a root cannot have them (docs/source/howto/storage-folders.md says how
a site chooses); `QueueService.project_quotas` turns them off.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from queue_service.store.tree_walk import Enter, is_dir, walk

#: struct fsxattr (linux/fs.h): xflags, extsize, nextents, projid, cowextsize, pad[8].
FSXATTR = struct.Struct("IIIII8s")
FS_IOC_FSGETXATTR = 0x801C581F  # _IOR('X', 31, struct fsxattr)
FS_IOC_FSSETXATTR = 0x401C5820  # _IOW('X', 32, struct fsxattr)
FS_XFLAG_PROJINHERIT = 0x00000200
#: The project a directory has when nobody set one: counted under no owner's limit.
NO_PROJECT = 0
QUOTA_FILE_SYSTEMS = ("xfs", "ext4")
#: The mount options that turn project quota accounting and enforcement on.
PROJECT_QUOTA_OPTIONS = ("prjquota", "pquota", "pqnoenforce", "prjjquota")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo: where, which file system, with which options."""

    point: str
    fs_type: str
    options: frozenset[str]


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a mountinfo text (proc(5)); its octal escapes (`\\040` for a space) read."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 10:
            continue
        separator = fields.index("-")
        point = _unescape(fields[4])
        # Per-mount options (field 6) and the file system's own (after the type and source).
        options = set(fields[5].split(",")) | set(fields[separator + 3].split(","))
        mounts.append(Mount(point, fields[separator + 1], frozenset(options)))
    return mounts


def mount_of(path: str | Path, mounts: list[Mount]) -> Mount | None:
    """The mount that holds `path` (resolved): the one with the longest mount point above it."""
    resolved = os.path.realpath(path)
    above = [m for m in mounts if _is_within(resolved, m.point)]
    return max(above, key=lambda m: len(m.point), default=None)


def support_reason(mount: Mount | None, has_tool: bool) -> str | None:
    """Why project quotas cannot hold the limits on this mount; None when they can."""
    if mount is None:
        return "its mount could not be found"
    if mount.fs_type not in QUOTA_FILE_SYSTEMS:
        return f"it is on {mount.fs_type}, which has no project quotas (XFS and ext4 do)"
    if not mount.options & set(PROJECT_QUOTA_OPTIONS):
        return f"its {mount.fs_type} file system at {mount.point} is not mounted with prjquota"
    if not has_tool:
        return "xfs_quota (the xfsprogs package) is not installed"
    return None


def with_project(raw: bytes, project: int) -> bytes:
    """A struct fsxattr as read, with `project` as its project id and the inherit flag set
    (cleared for NO_PROJECT, so that nothing below takes an id again); its other flags kept."""
    xflags, extsize, nextents, _, cowextsize, pad = FSXATTR.unpack(raw)
    if project == NO_PROJECT:
        xflags &= ~FS_XFLAG_PROJINHERIT
    else:
        xflags |= FS_XFLAG_PROJINHERIT
    return FSXATTR.pack(xflags, extsize, nextents, project, cowextsize, pad)


def project_of_fd(fd: int) -> int:
    """The project id of an open file or directory."""
    return FSXATTR.unpack(fcntl.ioctl(fd, FS_IOC_FSGETXATTR, bytes(FSXATTR.size)))[3]


def set_project_fd(fd: int, project: int) -> None:
    raw = fcntl.ioctl(fd, FS_IOC_FSGETXATTR, bytes(FSXATTR.size))
    wanted = with_project(raw, project)
    if wanted != raw:  # the measure round re-tags every file: only those that differ are written
        fcntl.ioctl(fd, FS_IOC_FSSETXATTR, wanted)


def limit_command(mount_point: str, project: int, limit_bytes: int | None) -> list[str]:
    """The xfs_quota call that sets a project's hard block limit (None or 0: no limit)."""
    return [
        "xfs_quota",
        "-x",
        "-c",
        f"limit -p bhard={int(limit_bytes or 0)} {int(project)}",
        mount_point,
    ]


def _run(command: list[str]) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=30)


class ProjectQuotas:
    """The project ids of the folder directories under one root, and their owners' limits."""

    def __init__(
        self,
        root: str | Path,
        mounts: list[Mount] | None = None,
        run: Callable[[list[str]], None] = _run,
    ):
        self.root = Path(root)
        if mounts is None:
            mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
        self.mount = mount_of(self.root, mounts)
        self.run = run
        # What was last set for each project, so a limit read on every page is set once.
        self._limits: dict[int, int | None] = {}

    @property
    def reason(self) -> str | None:
        """Why this root cannot have project quotas; None when it can."""
        return support_reason(self.mount, shutil.which("xfs_quota") is not None)

    def assign(self, directory: str | Path, project: int) -> None:
        """Give a folder's directory, and everything already in it, `project`: what sessions
        write there from now on counts under that project's limit. Walked by descriptor, never
        following a link a session planted, however deep (tree_walk.py)."""
        top = os.open(directory, _DIR_FLAGS)
        try:
            for step in walk(top):
                if isinstance(step, Enter):
                    set_project_fd(step.fd, project)
                    for name in step.names:
                        if not is_dir(name, step.fd):  # a directory is tagged on its own visit
                            self._set_project_at(name, step.fd, project)
        finally:
            os.close(top)

    @staticmethod
    def project_of(directory: str | Path) -> int:
        fd = os.open(directory, _DIR_FLAGS)
        try:
            return project_of_fd(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _set_project_at(name: str, dir_fd: int, project: int) -> None:
        # A link, FIFO or device is left as it is (the ioctl needs an open descriptor; opening
        # one of those would follow it or block).
        with contextlib.suppress(OSError):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
            try:
                if _regular_or_directory(os.fstat(fd).st_mode):
                    set_project_fd(fd, project)
            finally:
                os.close(fd)

    def limit(self, project: int, limit_bytes: int | None) -> None:
        """Set the project's hard limit (None: none), unless it is set so already."""
        if self._limits.get(project, -1) == limit_bytes:
            return
        self.run(limit_command(self.mount.point, project, limit_bytes))
        self._limits[project] = limit_bytes


def _regular_or_directory(mode: int) -> bool:
    return stat.S_ISREG(mode) or stat.S_ISDIR(mode)


def _is_within(path: str, point: str) -> bool:
    return point == "/" or path == point or path.startswith(point.rstrip("/") + "/")


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal.group(1), 8)), field)
