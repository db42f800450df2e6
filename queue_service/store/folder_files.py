"""The files of storage folders on disk, reached without ever following a link.

Each folder is a directory `<root>/<folder id>`: the id, not the name, so a rename touches only the
record, and a session's mount source names the folder it is (`fgpu.` contract: a mounted folder's
source carries its id). Sessions write these directories as the session user, and a session
may plant a symlink (to `/etc`, to another user's folder) or a FIFO in a folder shared with
others. The service runs as root, so it must never act on such a thing for a caller:

- every path is opened one component at a time from the folder's directory, each with
  `O_NOFOLLOW` (`openat`): a link anywhere on the way is refused, not followed;
- a file is read or written only through a descriptor that `fstat` shows is a regular file
  (a FIFO or device is refused, and `O_NONBLOCK` keeps a FIFO from stalling the open);
- removal, measurement and archiving walk by descriptor (`tree_walk.py`: without recursion and
  with a bounded number of open descriptors, so a tree of any depth a session made is walked),
  so a link swapped in meanwhile is removed or skipped, never entered.

What the service creates belongs to the session user (`owner`), so sessions can change it, and
is closed to every other host user as homes are: the folders root and each folder's directory are
0700 (what the service makes inside, 0700 and 0600), so no other host account can read a
folder, or run a setuid file a session left in one. `close` fixes folders made before.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import logging
import os
import stat
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from queue_service.core.errors import Refusal
from queue_service.store.chunk_writes import ChunkWrite, part_name
from queue_service.store.tree_walk import Enter, TreeChanged, is_dir, remove_tree, walk

log = logging.getLogger(__name__)
#: The session user of the images (jovyan): what the service makes in a folder is theirs.
SESSION_UID, SESSION_GID = 1000, 100
TRASH = ".trash"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class Measure:
    """A folder's size in bytes, its number of files, and when anything in it last changed."""

    bytes: int
    files: int
    modified: float


class FolderFiles:
    """The directories of every folder, under one root."""

    def __init__(self, root: str | Path, owner: tuple[int, int] = (SESSION_UID, SESSION_GID)):
        self.root = Path(root)
        self.owner = owner

    def source(self, folder_id: str) -> str:
        """The host path a session's bind mount of this folder starts from."""
        return str(self.root / folder_id)

    def make(self, folder_id: str) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.root / folder_id
        path.mkdir(mode=0o700)
        self._give(os.open(path, _DIR_FLAGS))

    def close(self, folder_id: str) -> None:
        """Close the folders root and a folder's directory to other host users (0700), as
        `make` makes them now; what a session made inside keeps its modes (the closed
        directory already keeps everyone else out)."""
        for fd in (os.open(self.root, _DIR_FLAGS), self._open_folder(folder_id)):
            try:
                if os.fstat(fd).st_mode & 0o077:
                    os.fchmod(fd, 0o700)
            finally:
                os.close(fd)

    def unmake(self, folder_id: str) -> None:
        """Remove a folder's directory made a moment ago, while it is still empty."""
        os.rmdir(self.root / folder_id)

    @staticmethod
    def trash_name(folder_id: str, now: float | None = None) -> str:
        """The name a folder's directory is kept under in the trash: its id and when."""
        return f"{folder_id}.{int(now if now is not None else time.time())}"

    def trash(self, folder_id: str, now: float | None = None, name: str = "") -> str:
        """Move the folder's directory aside (kept for a grace period); its trash name."""
        (self.root / TRASH).mkdir(mode=0o700, exist_ok=True)
        name = name or self.trash_name(folder_id, now)
        with contextlib.suppress(FileNotFoundError):  # nothing written yet: nothing to keep
            os.rename(self.root / folder_id, self.root / TRASH / name)
        return name

    def purge_trash(self, older_than: float) -> list[str]:
        """Remove what was trashed before `older_than` (a time.time()); the names removed. One
        that cannot be removed (a tree moved while it was removed) is logged and left for the
        next purge; the others are removed all the same."""
        trash = self.root / TRASH
        if not trash.is_dir():
            return []
        removed = []
        fd = os.open(trash, _DIR_FLAGS)
        try:
            for name in os.listdir(fd):
                stamp = name.rpartition(".")[2]
                if not (stamp.isdigit() and int(stamp) < older_than):
                    continue
                try:
                    remove_tree(fd, name)
                except OSError as e:
                    log.warning("Could not purge %s: %s", name, e)
                    continue
                removed.append(name)
        finally:
            os.close(fd)
        return removed

    # -- reading ---------------------------------------------------------------------------

    def listing(
        self, folder_id: str, parts: tuple[str, ...], after: str = "", limit: int = 1000
    ) -> tuple[list[dict], str | None]:
        """One page of a directory's entries, directories first, each kind by name: the first
        `limit` after the entry named `after` (name, kind, size and modification time; links
        shown as links, never followed), and the name to ask the next page after (None on the
        last). Only the names of a large directory are held, once (their kinds come with the
        names); only the page's entries are looked at. A directory named `after` that went away
        meanwhile is taken for a file of that name."""
        with self._directory(folder_id, parts) as fd:
            with os.scandir(fd) as scan:
                keys = sorted(
                    (not entry.is_dir(follow_symlinks=False), entry.name) for entry in scan
                )
            start = _start_after(keys, after) if after else 0
            page = [name for _, name in keys[start : start + limit]]
            more = start + limit < len(keys)
            entries = [entry for name in page if (entry := _entry(name, fd)) is not None]
        return entries, (page[-1] if more and page else None)

    def is_directory(self, folder_id: str, parts: tuple[str, ...]) -> bool:
        with self._parent(folder_id, parts) as parent:
            if not parts:
                return True
            info = _lstat(parts[-1], parent)
            return stat.S_ISDIR(info.st_mode)

    def holds_file(self, folder_id: str, parts: tuple[str, ...]) -> bool | None:
        """Whether a regular file is at `parts`, looked for link-free and without opening it:
        False when nothing is there (the folder's own directory missing included) or something
        else is (a directory, a FIFO); None when the answer is hidden: a link on the way or at
        the end, never followed (a session may have planted it), or a directory this process
        may not read."""
        if not parts:
            return False
        try:
            with self._parent(folder_id, parts) as parent:
                info = os.lstat(parts[-1], dir_fd=parent)
        except FileNotFoundError:
            return False
        except Refusal as e:  # from the walk: missing, a link, or not a directory
            return {"not_found": False, "forbidden": None}.get(e.cause, False)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EACCES, errno.EPERM):
                return None  # the folder's own directory is a link, or closed to this process
            raise
        if stat.S_ISLNK(info.st_mode):
            return None
        return stat.S_ISREG(info.st_mode)

    def open_file(self, folder_id: str, parts: tuple[str, ...]) -> tuple[int, int]:
        """(descriptor, size) of a regular file, open for reading; the caller closes it."""
        if not parts:
            raise Refusal("That is the folder itself, not a file.", "invalid")
        with self._parent(folder_id, parts) as parent:
            fd = _open(parts[-1], _READ_FLAGS, parent)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise Refusal(f"{'/'.join(parts)} is not a file.", "invalid")
        except BaseException:
            os.close(fd)
            raise
        return fd, info.st_size

    def lstat(self, folder_id: str, parts: tuple[str, ...]) -> os.stat_result:
        """What is at `parts` (a link itself, never what it points to), reached link-free."""
        with self._parent(folder_id, parts) as parent:
            if not parts:
                return os.fstat(parent)
            return _lstat(parts[-1], parent)

    def stats(self, folder_id: str, parts: tuple[str, ...]) -> list[tuple[str, os.stat_result]]:
        """Every entry of the directory at `parts` with what it is (links as links), by name."""
        with self._directory(folder_id, parts) as fd:
            found = []
            for name in sorted(os.listdir(fd)):
                with contextlib.suppress(FileNotFoundError):  # gone since it was listed
                    found.append((name, os.lstat(name, dir_fd=fd)))
        return found

    def measure(self, folder_id: str) -> Measure:
        """Bytes, files and the newest change in the folder, walking without following links."""
        total = files = 0
        with self._directory(folder_id, ()) as fd:
            newest = os.fstat(fd).st_mtime
            for step in walk(fd):
                if not isinstance(step, Enter):
                    continue
                newest = max(newest, os.fstat(step.fd).st_mtime)
                for name in step.names:
                    with contextlib.suppress(FileNotFoundError):
                        info = os.lstat(name, dir_fd=step.fd)
                        if stat.S_ISDIR(info.st_mode):
                            continue
                        total += info.st_blocks * 512 if stat.S_ISREG(info.st_mode) else 0
                        files += 1
                        newest = max(newest, info.st_mtime)
        return Measure(total, files, newest)

    def archive(self, folder_id: str, tar: tarfile.TarFile) -> list[str]:
        """Add the folder to `tar` as `<folder id>/...`: its directories and regular files with
        their owners, modes and times, each opened link-free (a backup runs as root, and a link
        a session planted must not bring `/etc` into the archive, and so into the folder at the
        restore). Links, FIFOs and devices are left out: their paths, for the admin."""
        with self._directory(folder_id, ()) as fd:
            left_out = archive_tree(fd, folder_id, tar)
        return left_out

    # -- writing ---------------------------------------------------------------------------

    def write(self, folder_id: str, parts: tuple[str, ...], data: bytes, offset: int) -> int:
        """Write `data` at `offset` of a file: 0 makes it anew (replacing one that exists), and a
        later chunk must start where the file ends now. The file's size after it."""
        chunk = self.open_chunk(folder_id, parts, offset)
        try:
            chunk.write(data)
        except BaseException:
            chunk.abandon()
            raise
        chunk.finish(rename=chunk.part is not None)
        return chunk.position

    def free_bytes(self) -> int:
        """Bytes the disk of the folders still has for the service's writes."""
        info = os.statvfs(self.root)
        return info.f_bavail * info.f_frsize

    def open_chunk(
        self,
        folder_id: str,
        parts: tuple[str, ...],
        offset: int,
        part: str | None = None,
        new_size: int | None = None,
    ) -> ChunkWrite:
        """Where an upload's chunk at `offset` goes (chunk_writes.py), reached link-free:
        - no `part`: a sequential upload's; offset 0 starts a new part file, renamed over the
          file once the chunk is in; a later chunk goes in place and must start where the file
          ends now;
        - `part` and `new_size`: a parallel upload's start: the part file `part`, made now with
          the file's whole size (sparse until its chunks come);
        - `part` alone: a parallel upload's chunk, into its part file."""
        if not parts:
            raise Refusal("Name a file to upload to, inside the folder.", "invalid")
        with self._parent(folder_id, parts) as parent:
            if part is None and offset > 0:
                fd, made = self._continued(parts, offset, parent), None
            elif part is None or new_size is not None:
                self._refuse_non_file(parts, parent)
                made = part or part_name()
                fd = _open(made, _WRITE_FLAGS | os.O_CREAT | os.O_EXCL, parent, 0o600)
                try:
                    self._chown(fd)
                    if new_size:
                        os.ftruncate(fd, new_size)
                except BaseException:
                    os.close(fd)
                    os.unlink(made, dir_fd=parent)
                    raise
            else:
                fd, made = self._part_file(part, parent), None
            chunk = ChunkWrite(
                fd, os.dup(parent), offset, parts[-1], made or part, made is not None
            )
        return chunk

    def _continued(self, parts: tuple[str, ...], offset: int, parent: int) -> int:
        """The file a sequential upload's chunk continues, if it ends where the chunk starts."""
        fd = _open(parts[-1], _WRITE_FLAGS, parent)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise Refusal(f"{'/'.join(parts)} is not a file.", "invalid")
            if info.st_size != offset:
                raise Refusal(
                    f"The file holds {info.st_size} bytes; the next chunk starts there, "
                    f"not at {offset}.",
                    "conflict",
                )
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _part_file(self, part: str, parent: int) -> int:
        try:
            fd = _open(part, _WRITE_FLAGS, parent)
        except Refusal:
            raise Refusal(
                "The upload's part file is gone (removed meanwhile); upload the file again.",
                "conflict",
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise Refusal(
                "The upload's part file is not a file; upload the file again.", "conflict"
            )
        return fd

    def _refuse_non_file(self, parts: tuple[str, ...], parent: int) -> None:
        """An upload replaces a file, never a directory, a link or anything else at its name."""
        try:
            info = os.lstat(parts[-1], dir_fd=parent)
        except FileNotFoundError:
            return
        name = "/".join(parts)
        if stat.S_ISDIR(info.st_mode):
            raise Refusal(f"{name!r} is a directory.", "invalid")
        if stat.S_ISLNK(info.st_mode):
            raise Refusal(f"{name!r} is a link; links are not followed.", "forbidden")
        if not stat.S_ISREG(info.st_mode):
            raise Refusal(f"{name} is not a file.", "invalid")

    def open_to_write(
        self, folder_id: str, parts: tuple[str, ...], create: bool, truncate: bool, new: bool
    ) -> int:
        """A descriptor of the regular file at `parts`, open to read and write (`create` makes
        it when missing, `new` refuses one that exists, `truncate` empties it); what is made
        belongs to the session user. The caller closes it."""
        if not parts:
            raise Refusal("Name a file to write, inside the folder.", "invalid")
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        made = False
        with self._parent(folder_id, parts) as parent:
            if not new:
                try:
                    fd = _open(parts[-1], flags, parent)
                except Refusal as e:
                    if not (create and e.cause == "not_found"):
                        raise
                    new = True
            if new:
                try:
                    fd = _open(parts[-1], flags | os.O_CREAT | os.O_EXCL, parent, 0o600)
                except FileExistsError:
                    raise Refusal(f"{'/'.join(parts)} exists already.", "conflict") from None
                made = True
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise Refusal(f"{'/'.join(parts)} is not a file.", "invalid")
            if truncate and not made:
                os.ftruncate(fd, 0)
            if made:
                self._chown(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def remove_directory(self, folder_id: str, parts: tuple[str, ...]) -> None:
        """Remove the empty directory at `parts` (a link or file there is refused)."""
        if not parts:
            raise Refusal("The folder itself is not removed here.", "invalid")
        with self._parent(folder_id, parts) as parent:
            if not stat.S_ISDIR(_lstat(parts[-1], parent).st_mode):
                raise Refusal(f"{'/'.join(parts)} is not a directory.", "invalid")
            try:
                os.rmdir(parts[-1], dir_fd=parent)
            except OSError as e:
                if e.errno != errno.ENOTEMPTY:
                    raise
                raise Refusal(f"{'/'.join(parts)} is not empty.", "conflict") from None

    def remove_file(self, folder_id: str, parts: tuple[str, ...]) -> None:
        """Remove the file (or link, itself) at `parts`; a directory is refused."""
        if not parts:
            raise Refusal("The folder itself is not removed here.", "invalid")
        with self._parent(folder_id, parts) as parent:
            if stat.S_ISDIR(_lstat(parts[-1], parent).st_mode):
                raise Refusal(f"{'/'.join(parts)} is a directory.", "invalid")
            os.unlink(parts[-1], dir_fd=parent)

    def make_directory(self, folder_id: str, parts: tuple[str, ...]) -> None:
        if not parts:
            raise Refusal("The folder itself exists already.", "conflict")
        with self._parent(folder_id, parts) as parent:
            try:
                os.mkdir(parts[-1], 0o700, dir_fd=parent)
            except FileExistsError:
                raise Refusal(f"{'/'.join(parts)} exists already.", "conflict") from None
            self._give(_open(parts[-1], _DIR_FLAGS, parent))

    def rename(self, folder_id: str, parts: tuple[str, ...], new_parts: tuple[str, ...]) -> None:
        if not parts or not new_parts:
            raise Refusal("Rename the folder itself on its own (PATCH folders/{id}).", "invalid")
        with self._parent(folder_id, parts) as source, self._parent(folder_id, new_parts) as to:
            _lstat(parts[-1], source)
            if _exists(new_parts[-1], to):
                raise Refusal(f"{'/'.join(new_parts)} exists already.", "conflict")
            os.rename(parts[-1], new_parts[-1], src_dir_fd=source, dst_dir_fd=to)

    def remove(self, folder_id: str, parts: tuple[str, ...]) -> None:
        """Remove a file, a link (itself) or a directory with everything in it."""
        if not parts:
            raise Refusal("Delete the folder itself on its own (DELETE folders/{id}).", "invalid")
        with self._parent(folder_id, parts) as parent:
            info = _lstat(parts[-1], parent)
            if stat.S_ISDIR(info.st_mode):
                _remove_directory(parent, parts)
            else:
                os.unlink(parts[-1], dir_fd=parent)

    # -- walking ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _directory(self, folder_id: str, parts: tuple[str, ...]) -> Iterator[int]:
        """A descriptor of the directory at `parts`, reached link-free."""
        fd = self._open_folder(folder_id)
        try:
            for part in parts:
                inner = _open(part, _DIR_FLAGS, fd)
                os.close(fd)
                fd = inner
            yield fd
        finally:
            os.close(fd)

    def _parent(self, folder_id: str, parts: tuple[str, ...]):
        return self._directory(folder_id, parts[:-1])

    def _open_folder(self, folder_id: str) -> int:
        try:
            return os.open(self.root / folder_id, _DIR_FLAGS)
        except FileNotFoundError:
            raise Refusal("The folder's files are missing on this host.", "not_found") from None

    def _give(self, fd: int) -> None:
        try:
            self._chown(fd)
        finally:
            os.close(fd)

    def _chown(self, fd: int) -> None:
        if os.geteuid() == 0:  # a service not run as root makes files its own user's
            os.fchown(fd, *self.owner)


def _remove_directory(parent: int, parts: tuple[str, ...]) -> None:
    try:
        remove_tree(parent, parts[-1])
    except TreeChanged:
        raise Refusal(
            f"{'/'.join(parts)} changed while it was removed (moved inside it); try again.",
            "conflict",
        ) from None
    except OSError as e:
        if e.errno != errno.ENOTEMPTY:
            raise
        raise Refusal(
            f"{'/'.join(parts)} was written to while it was removed; try again.", "conflict"
        ) from None


def _open(name: str, flags: int, dir_fd: int, mode: int = 0o777) -> int:
    try:
        return os.open(name, flags, mode, dir_fd=dir_fd)
    except FileNotFoundError:
        raise Refusal(f"There is no {name!r} here.", "not_found") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refusal(f"{name!r} is a link; links are not followed.", "forbidden") from None
        if e.errno == errno.ENOTDIR:
            # O_DIRECTORY meets a link before O_NOFOLLOW does: say which it is.
            if stat.S_ISLNK(_lstat(name, dir_fd).st_mode):
                raise Refusal(f"{name!r} is a link; links are not followed.", "forbidden") from None
            raise Refusal(f"{name!r} is not a directory.", "invalid") from None
        if e.errno == errno.EISDIR:
            raise Refusal(f"{name!r} is a directory.", "invalid") from None
        if e.errno == errno.ENXIO:  # a FIFO without a writer, opened to write
            raise Refusal(f"{name!r} is not a file.", "invalid") from None
        raise


def _lstat(name: str, dir_fd: int) -> os.stat_result:
    try:
        return os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        raise Refusal(f"There is no {name!r} here.", "not_found") from None


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _start_after(keys: list[tuple[bool, str]], after: str) -> int:
    """Where the page after the entry named `after` starts among the sorted (is file, name)."""
    here = bisect.bisect_left(keys, (False, after))
    is_directory = here < len(keys) and keys[here] == (False, after)
    return bisect.bisect_right(keys, (not is_directory, after))


def _entry(name: str, dir_fd: int) -> dict | None:
    """A listing's entry for `name`; None when it went away since the directory was read."""
    try:
        info = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    return {
        "name": name,
        "type": _kind(info.st_mode),
        "size": info.st_size if stat.S_ISREG(info.st_mode) else None,
        "modified": info.st_mtime,
    }


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    return "link" if stat.S_ISLNK(mode) else "other"


def archive_directory(path: str | Path, tar: tarfile.TarFile) -> list[str]:
    """Add the directory at `path` to `tar` under its own name (as `archive_tree`)."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        return archive_tree(fd, Path(path).name, tar)
    finally:
        os.close(fd)


def tree_size(path: str | Path) -> int:
    """The bytes of the regular files under the directory at `path`, links not followed."""
    fd = os.open(path, _DIR_FLAGS)
    total = 0
    try:
        for step in walk(fd):
            if isinstance(step, Enter):
                for name in step.names:
                    with contextlib.suppress(FileNotFoundError):
                        info = os.lstat(name, dir_fd=step.fd)
                        total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    finally:
        os.close(fd)
    return total


def archive_tree(fd: int, prefix: str, tar: tarfile.TarFile) -> list[str]:
    """Add the directory open at `fd` to `tar` as `prefix/...`: its directories and regular
    files with their owners, modes and times, each opened link-free. Links, FIFOs and devices
    are left out: their paths, for the admin."""
    left_out = []
    for step in walk(fd):
        if not isinstance(step, Enter):
            continue
        top = "/".join([prefix, *step.path])
        tar.addfile(_tar_info(top, os.fstat(step.fd)))
        for name in step.names:
            if is_dir(name, step.fd):
                continue
            if not _archive_file(f"{top}/{name}", name, step.fd, tar):
                left_out.append(f"{top}/{name}")
    return left_out


def _archive_file(member: str, name: str, dir_fd: int, tar: tarfile.TarFile) -> bool:
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError:  # a link (ELOOP), or gone meanwhile
        return False
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return False
        tar.addfile(_tar_info(member, info), _Exactly(file, info.st_size))
    return True


def _tar_info(member: str, info: os.stat_result) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(member)
    entry.type = tarfile.DIRTYPE if stat.S_ISDIR(info.st_mode) else tarfile.REGTYPE
    entry.size = info.st_size if entry.type == tarfile.REGTYPE else 0
    entry.mode, entry.mtime = stat.S_IMODE(info.st_mode), int(info.st_mtime)
    entry.uid, entry.gid = info.st_uid, info.st_gid
    return entry


class _Exactly:
    """A file read as exactly `size` bytes: a session may shorten it while the backup reads it,
    and a tar member must hold the size its header says (the rest is zeros)."""

    def __init__(self, file, size: int):
        self.file, self.left = file, size

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        chunk = self.file.read(size)
        chunk += bytes(size - len(chunk))
        self.left -= size
        return chunk
