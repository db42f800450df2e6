"""The SFTP server of a login: the home folder at `/`, the storage folders under `/folders`
(core/sftp_paths.py), each file reached through the Storage page's file layer
(store/folder_files.py), which opens every path one component at a time and never follows a link.

- **Permissions.** Writes (open to write, mkdir, remove, rename, setstat) need a writable spot:
  never a folder shared read-only, never `/folders` itself (`file_areas.py`).
- **Quotas.** A file open to write may grow a storage folder by what its owner's quotas leave
  (`Folders.room`, as last measured) and no more: a write past it is refused with the Storage
  page's words, and the folder is measured again when the file is closed, as after an upload.
- **Owners.** What is made belongs to the session user (uid 1000), as what the Storage page
  writes: sessions can change it.
- **No links.** `stat` is `lstat` (a link shows as a link), a link is never opened, listed through
  or made, and `..` is refused (`realpath` folds it for a client's `cd`, never above `/`).

Every call runs in a thread of the SSH service's own (the database, the disk): the queue
service's event loop and its threads serve its pages meanwhile. Refusals reach the client as SFTP statuses with the Storage page's message.
"""

from __future__ import annotations

import asyncio
import functools
import os
import stat
import time
from concurrent.futures import Executor

import asyncssh

from queue_service.core.errors import Refusal
from queue_service.core.sftp_paths import FOLDERS, Place, place_of, real_path

from .file_areas import FileAreas, Spot
from .hub_logins import Login, channel_login

#: How a refusal's cause is told to an SFTP client.
_STATUS = {
    "not_found": asyncssh.SFTPNoSuchFile,
    "forbidden": asyncssh.SFTPPermissionDenied,
    "read_only": asyncssh.SFTPPermissionDenied,
}
#: Files one SFTP session holds open at once: the descriptors are the queue service's own, and a
#: session that opened without end would leave the service none (clients open a few at a time).
MAX_OPEN_FILES = 64
_WRITE_FLAGS = asyncssh.FXF_WRITE | asyncssh.FXF_APPEND | asyncssh.FXF_CREAT | asyncssh.FXF_TRUNC


class OpenFile:
    """A file open for a client: its descriptor, where it is, and (open to write) what it may
    still add to its storage folder."""

    def __init__(self, fd: int, spot: Spot, room: int | None, writable: bool):
        self.fd, self.spot, self.room, self.writable = fd, spot, room, writable
        self.size = os.fstat(fd).st_size
        self.grown = 0
        self.written = False


class FolderSFTP(asyncssh.SFTPServer):
    """One SFTP session of a checked login (its `Login`: hub_logins.channel_login)."""

    def __init__(self, chan, areas: FileAreas, measure, threads: Executor):
        super().__init__(chan)
        self.login: Login = channel_login(chan)
        self.areas = areas
        #: Measures a storage folder (by id) after it changed (Folders.measure_after_change).
        self.measure = measure
        self.threads = threads
        self.open_files = 0

    async def _call(self, function, *args):
        """`function(*args)` in the SSH service's own threads (the queue service's stay free for
        its pages and grants during a long transfer), its refusal told as an SFTP status."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.threads, functools.partial(function, *args))
        except Refusal as e:
            raise _status(e) from None

    # -- paths ------------------------------------------------------------------------------

    def realpath(self, path: bytes) -> bytes:
        return os.fsencode(real_path(os.fsdecode(path)))

    async def _spot(self, path: bytes, write: bool = False) -> Spot:
        place = _place(path)
        if place.area == "folders":
            if write:
                raise asyncssh.SFTPPermissionDenied(
                    f"/{FOLDERS} lists your storage folders; make folders on the Storage page."
                )
            raise asyncssh.SFTPPermissionDenied(f"/{FOLDERS} is not a file.")
        spot = await self._call(self.areas.locate, self.login.reader, place)
        if write and spot.read_only:
            raise asyncssh.SFTPPermissionDenied(spot.read_only)
        return spot

    # -- reading ----------------------------------------------------------------------------

    async def lstat(self, path: bytes):
        place = _place(path)
        if place.area == "folders" or (place.area == "home" and not place.parts):
            return _directory_attrs()
        spot = await self._call(self.areas.locate, self.login.reader, place)
        return await self._call(spot.files.lstat, spot.key, spot.parts)

    stat = lstat  # links are never followed

    async def scandir(self, path: bytes):
        place = _place(path)
        reader = self.login.reader
        if place.area == "folders":
            for folder in await self._call(self.areas.visible, reader):
                try:
                    attrs = await self._call(self.areas.folders.files.lstat, folder["id"], ())
                except asyncssh.SFTPError:  # its files missing on this host: listed all the same
                    attrs = _directory_attrs()
                yield _name(folder["name"], attrs)
            return
        if place.area == "home" and not place.parts:
            yield _name(FOLDERS, _directory_attrs())
            if not await self._call(self.areas.has_home, reader):
                return
        spot = await self._call(self.areas.locate, reader, place)
        for name, info in await self._call(spot.files.stats, spot.key, spot.parts):
            if not (name == FOLDERS and not spot.parts and spot.folder is None):
                yield _name(name, info)

    def readlink(self, path: bytes):
        raise asyncssh.SFTPPermissionDenied("Links are not followed here.")

    # -- files ------------------------------------------------------------------------------

    async def open(self, path: bytes, pflags: int, attrs):
        if self.open_files >= MAX_OPEN_FILES:
            raise asyncssh.SFTPFailure(f"At most {MAX_OPEN_FILES} files are open at once.")
        opened = await self._open(path, pflags)
        self.open_files += 1
        return opened

    async def _open(self, path: bytes, pflags: int) -> OpenFile:
        writable = bool(pflags & _WRITE_FLAGS)
        spot = await self._spot(path, write=writable)
        if not writable:
            fd, _ = await self._call(spot.files.open_file, spot.key, spot.parts)
            return OpenFile(fd, spot, None, False)
        create, new = bool(pflags & asyncssh.FXF_CREAT), bool(pflags & asyncssh.FXF_EXCL)
        truncate = bool(pflags & asyncssh.FXF_TRUNC)
        fd = await self._call(spot.files.open_to_write, spot.key, spot.parts, create, truncate, new)
        try:
            room = await self._call(self._room, spot)
            return OpenFile(fd, spot, room, True)
        except BaseException:
            os.close(fd)
            raise

    def _room(self, spot: Spot) -> int | None:
        if spot.folder is None:
            return None
        return self.areas.folders.room(spot.folder, self.login.reader)

    async def read(self, file_obj: OpenFile, offset: int, size: int) -> bytes:
        return await self._call(os.pread, file_obj.fd, size, offset)

    async def write(self, file_obj: OpenFile, offset: int, data: bytes) -> int:
        if not file_obj.writable:
            raise asyncssh.SFTPPermissionDenied("The file is open to read only.")
        growth = max(0, offset + len(data) - file_obj.size)
        if file_obj.room is not None and file_obj.grown + growth > file_obj.room:
            refusal = await self._call(
                self.areas.folders.refusal_to_add,
                file_obj.spot.folder,
                self.login.reader,
                file_obj.grown + growth,
            )
            raise asyncssh.SFTPFailure(str(refusal))
        written = await self._call(os.pwrite, file_obj.fd, data, offset)
        file_obj.size = max(file_obj.size, offset + written)
        file_obj.grown += growth
        file_obj.written = True
        return written

    async def fstat(self, file_obj: OpenFile):
        return os.fstat(file_obj.fd)

    async def fsetstat(self, file_obj: OpenFile, attrs) -> None:
        if not file_obj.writable:
            raise asyncssh.SFTPPermissionDenied("The file is open to read only.")
        await self._call(_set_attrs, file_obj.fd, attrs)

    async def setstat(self, path: bytes, attrs) -> None:
        spot = await self._spot(path, write=True)
        info = await self._call(spot.files.lstat, spot.key, spot.parts)
        if stat.S_ISREG(info.st_mode):  # a directory's modes and times are left as they are
            fd, _ = await self._call(spot.files.open_file, spot.key, spot.parts)
            try:
                await self._call(_set_attrs, fd, attrs)
            finally:
                os.close(fd)

    lsetstat = setstat

    async def close(self, file_obj: OpenFile) -> None:
        os.close(file_obj.fd)
        self.open_files -= 1
        if file_obj.written and file_obj.spot.folder is not None:
            await self._measured(file_obj.spot)

    async def _measured(self, spot: Spot) -> None:
        if spot.folder is not None:
            await self._call(self.measure, spot.folder["id"])

    # -- directories and names ----------------------------------------------------------------

    async def mkdir(self, path: bytes, attrs) -> None:
        spot = await self._spot(path, write=True)
        await self._call(spot.files.make_directory, spot.key, spot.parts)

    async def rmdir(self, path: bytes) -> None:
        spot = await self._spot(path, write=True)
        await self._call(spot.files.remove_directory, spot.key, spot.parts)
        await self._measured(spot)

    async def remove(self, path: bytes) -> None:
        spot = await self._spot(path, write=True)
        await self._call(spot.files.remove_file, spot.key, spot.parts)
        await self._measured(spot)

    async def rename(self, oldpath: bytes, newpath: bytes) -> None:
        source = await self._spot(oldpath, write=True)
        target = await self._spot(newpath, write=True)
        if not source.same_area(target):
            raise asyncssh.SFTPFailure(
                "Files move within one folder (or the home); copy them to another."
            )
        await self._call(source.files.rename, source.key, source.parts, target.parts)

    posix_rename = rename

    def symlink(self, oldpath: bytes, newpath: bytes):
        raise asyncssh.SFTPPermissionDenied("Links are not made here.")

    def link(self, oldpath: bytes, newpath: bytes):
        raise asyncssh.SFTPPermissionDenied("Links are not made here.")


def _place(path: bytes) -> Place:
    try:
        return place_of(os.fsdecode(path))
    except Refusal as e:
        raise _status(e) from None


def _status(refusal: Refusal) -> asyncssh.SFTPError:
    return _STATUS.get(refusal.cause, asyncssh.SFTPFailure)(str(refusal))


def _set_attrs(fd: int, attrs) -> None:
    """A client's modes (the permission bits alone: never setuid) and times, on an open file."""
    if attrs.permissions is not None:
        os.fchmod(fd, attrs.permissions & 0o777)
    if attrs.atime is not None and attrs.mtime is not None:
        os.utime(fd, (attrs.atime, attrs.mtime))


def _directory_attrs() -> asyncssh.SFTPAttrs:
    """What `/` without a home and `/folders` look like: directories of the session user."""
    now = int(time.time())
    return asyncssh.SFTPAttrs(
        type=asyncssh.FILEXFER_TYPE_DIRECTORY,
        permissions=stat.S_IFDIR | 0o755,
        uid=1000,
        gid=100,
        atime=now,
        mtime=now,
    )


def _name(name: str, attrs) -> asyncssh.SFTPName:
    if isinstance(attrs, os.stat_result):
        attrs = asyncssh.SFTPAttrs.from_local(attrs)
    return asyncssh.SFTPName(os.fsencode(name), attrs=attrs)
