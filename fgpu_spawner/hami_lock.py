"""HAMi-core's host-wide lock file, made without following anyone's symbolic links.

The lock folder is `/tmp/vgpulock` by default (HAMi's device plugin uses the same one), a place any
local user can write to first. A plain `touch()` and `chmod(0o666)` there follow a planted link:
`/tmp/vgpulock/lock → /etc/ld.so.preload` would leave a world-writable preload file, then root.
So the folder must be a real folder of the hub's own user that nobody else may write to (then no
one else can put anything in it), and the file is opened with `O_NOFOLLOW` and changed through
its open descriptor, after checking it is a plain file of ours. Anything else is refused with a
message that says what to remove.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

LOCK_FILE_NAME = "lock"
#: Every session user opens the lock file read-write (HAMi-core takes it with lockf).
LOCK_FILE_MODE = 0o666


class UnsafeLockPath(ValueError):
    """The lock folder or file is not what the hub made: someone else could have planted it."""


def make_lock_file(lock_dir: str | os.PathLike) -> Path:
    """`lock_dir/lock`, made or checked: a plain file of the hub's user, mode 0666, in a folder of
    the hub's user that only it writes. Raises `UnsafeLockPath` without changing anything else."""
    folder = Path(lock_dir)
    if not os.path.lexists(folder):
        folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    _check_folder(folder)
    path = folder / LOCK_FILE_NAME
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, LOCK_FILE_MODE)
    except OSError as e:
        raise UnsafeLockPath(
            f"{path} is not a plain file ({e.strerror}): a symbolic link or something else is "
            "in its place. Remove it; the hub makes the file itself."
        ) from None
    try:
        _check_owned_plain(os.fstat(fd), path, "file")
        os.fchmod(fd, LOCK_FILE_MODE)  # through the descriptor: never a link's target
    finally:
        os.close(fd)
    return path


def _check_folder(folder: Path) -> None:
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeLockPath(
            f"HAMi lock folder {folder} is a symbolic link (to {os.readlink(folder)}); "
            "remove it, the hub makes the folder itself."
        )
    _check_owned_plain(info, folder, "folder")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeLockPath(
            f"HAMi lock folder {folder} may be written by others (mode "
            f"{stat.S_IMODE(info.st_mode):o}), who could plant links in it; make it 0755 "
            "(chmod 755) or remove it."
        )


def _check_owned_plain(info: os.stat_result, path: Path, kind: str) -> None:
    is_right_kind = stat.S_ISDIR if kind == "folder" else stat.S_ISREG
    if not is_right_kind(info.st_mode):
        raise UnsafeLockPath(f"HAMi lock {kind} {path} is not a plain {kind}; remove it.")
    if info.st_uid != os.geteuid():
        raise UnsafeLockPath(
            f"HAMi lock {kind} {path} belongs to uid {info.st_uid}, not to the hub's user "
            f"(uid {os.geteuid()}): someone else made it. Remove it; the hub makes it itself."
        )
