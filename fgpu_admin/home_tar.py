"""A home folder's tar from an archive, checked member by member before any of it is written.

A backup writes each home as a tar of one folder (`alice/...` for a Swarm home folder,
`fgpu-home/...` for a volume read through the helper container). A restore trusts none of it:
every member must be a regular file or a directory inside that one folder (no hard links, devices,
pipes or sockets), and its owner becomes the session user, whatever the archive says. A symbolic
link inside the folder (a virtualenv's `bin/python`, say: homes hold many) is left out, never
written (it could point out of the folder or make a later member write through it), and named in
the restore's output; the rest of the home is restored. `safe_copy` writes the checked members
into a new tar with those owners, and that copy is what is extracted or sent to the engine.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterable
from pathlib import Path

from .archive import ArchiveError

#: Permission bits a restored file may keep: no set-user-id, set-group-id or sticky bit.
MODE_BITS = 0o777


def session_owner() -> tuple[int, int]:
    """The uid and gid the session containers run as (the spawner's `run_as` default): the owner
    of every restored home file."""
    from fgpu_spawner.container_spec import ContainerContext

    uid, gid = ContainerContext.__dataclass_fields__["run_as"].default.split(":")
    return int(uid), int(gid)


def member_problem(member: tarfile.TarInfo, top: str) -> str | None:
    """Why `member` may not be restored into the folder `top`, or None when it may."""
    name = member.name.rstrip("/")
    parts = name.split("/")
    if name != top and (parts[0] != top or any(p in ("", ".", "..") for p in parts)):
        return f"{member.name!r} is outside its folder {top!r}"
    if "\\" in name:
        return f"{member.name!r} has a backslash in its name"
    if not (member.isreg() or member.isdir() or member.issym()):
        return f"{member.name!r} is a {_kind(member)}, not a file or folder"
    return None


def left_out(member: tarfile.TarInfo) -> str | None:
    """Why a member that passed `member_problem` is still not written (a symbolic link), or
    None."""
    if member.issym():
        return f"{member.name} ({_kind(member)})"
    return None


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"symbolic link to {member.linkname!r}"
    if member.islnk():
        return f"hard link to {member.linkname!r}"
    if member.isdev():
        return "device or pipe"
    return "special member"


def check_members(
    members: Iterable[tarfile.TarInfo], top: str, home: str, kind: str = "home"
) -> None:
    """An ArchiveError naming the first member of home `home` that `member_problem` refuses."""
    for member in members:
        problem = member_problem(member, top)
        if problem:
            raise ArchiveError(f"{kind} {home}: {problem}; nothing restored")


def safe_copy(source: Path, copy: Path, top: str, home: str, kind: str = "home") -> list[str]:
    """`source` checked whole, then written to `copy` with the session user as every owner,
    without its symbolic links: those, for the restore's output. A storage folder's tar (`kind`
    "storage folder") is checked and owned the same way."""
    uid, gid = session_owner()
    with _open(source) as tar:
        members = tar.getmembers()
        check_members(members, top, home, kind)
        skipped = []
        with tarfile.open(copy, "w", format=tarfile.PAX_FORMAT) as out:
            for member in members:
                why = left_out(member)
                if why:
                    skipped.append(why)
                    continue
                clean = member.replace(
                    uid=uid, gid=gid, uname="", gname="", mode=member.mode & MODE_BITS, deep=False
                )
                out.addfile(clean, tar.extractfile(member) if member.isreg() else None)
    return skipped


def _open(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path)
    except tarfile.TarError as e:
        raise ArchiveError(f"{path.name}: not a readable home tar ({e})") from None
