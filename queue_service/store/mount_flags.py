"""Whether the folders root sits on a mount with `nosuid,nodev`, read from the kernel's mount
table (`/proc/self/mountinfo`).

Docker 20.10 has no `nosuid` or `nodev` for a bind mount (a `local` volume with
`o=bind,nosuid,nodev` loses them too): a session's bind of a folder takes the flags of the host
mount its directory is on. A site that mounts the folders root `nosuid,nodev` therefore gets
them on every read-write bind of a folder in every session; the service says at start-up when
the root is not on such a mount, and how to make it so. (A read-only bind loses them in runc's
remount, but nothing can be written there; the round's own remount keeps them:
`queue_service/engine/folder_write_stops.py`.)
"""

from __future__ import annotations

import os

WANTED = ("nosuid", "nodev")


def mount_of(path: str, mountinfo: str = "/proc/self/mountinfo") -> tuple[str, set[str]]:
    """The mount point `path` is on, and that mount's per-mount options (`nosuid`, ...)."""
    real = os.path.realpath(path)
    best, options = "/", set()
    with open(mountinfo) as table:
        for line in table:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # `\040` for a space
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, options = point, set(fields[5].split(","))
    return best, options


def missing_flags(path: str) -> tuple[str, list[str]]:
    """The mount point `path` is on, and which of `nosuid,nodev` that mount lacks."""
    point, options = mount_of(path)
    return point, [flag for flag in WANTED if flag not in options]
