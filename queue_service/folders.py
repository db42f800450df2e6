"""Storage folders: who may do what with a folder and its files (`Folders`), over the records
(`store/folders.py`) and the directories on disk (`store/folder_files.py`).

- **Own folders.** A user makes, renames and removes their folders. A removed folder's directory
  is kept in the trash for `grace` seconds, then purged (`purge`).
- **Shares.** The owner shares a folder with a user or a hub group, "ro" or "rw". Reading a
  folder's files needs any access; writing, uploading and removing files needs "rw".
- **Admins** see every folder and may rename, remove or hand over any; their file access is
  the owner's.
- **Nothing half-made.** A name or path is checked before anything is touched, a folder's
  directory and record are made together or not at all, and a refused write leaves the disk
  as it was.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from fgpu_shared.units import format_size
from queue_service.core.errors import Refusal
from queue_service.core.folder_names import folder_name, path_parts, permission
from queue_service.store.accounts import Account
from queue_service.store.chunk_writes import ChunkWrite, part_name
from queue_service.store.folder_files import FolderFiles
from queue_service.store.folders import FolderStore, Reader, pick_named
from queue_service.store.project_quotas import NO_PROJECT, ProjectQuotas
from queue_service.uploads import Upload, Uploads

#: Where a chosen folder appears in a session, under its home folder: `~/folders/<name>`.
#: Automount folders appear at `~/<name>` (`~/.local`, `~/.cache`).
MOUNT_DIR = "folders"
log = logging.getLogger(__name__)
#: How long a removed folder's files are kept before they are purged (seconds).
DEFAULT_GRACE = 7 * 24 * 3600


class Folders:
    def __init__(
        self,
        store: FolderStore,
        files: FolderFiles,
        grace: float = DEFAULT_GRACE,
        storage_limits: Callable[[frozenset[str]], list[tuple[str | None, int]]] = lambda g: [],
        members: Callable[[str], tuple[str, ...]] = lambda group: (),
        projects: ProjectQuotas | None = None,
        groups_of: Callable[[str], tuple[str, ...]] = lambda user: (),
    ):
        """`storage_limits(groups)`: the storage quotas over a user of these groups, (None,
        bytes) for the user's own and (group, bytes) for a group's over its members' folders
        (quotas.py); `members(group)`: the group's members; `projects`: the kernel's project
        quotas, where the folders root has them (None: the quotas are measured only);
        `groups_of(user)`: a user's hub groups as last seen (an owner's, for a sharer's write)."""
        self.store, self.files, self.grace = store, files, grace
        self.storage_limits, self.members, self.groups_of = storage_limits, members, groups_of
        self.projects = projects
        self._session_mounts: dict[str, list[dict]] = {}
        #: Why the last measure round could not measure a folder (its id: the reason), for the
        #: admins' view of everyone's folders.
        self.problems: dict[str, str] = {}
        #: Parallel uploads under way (uploads.py).
        self.uploads = Uploads()

    # -- storage quotas ---------------------------------------------------------------------

    def quotas(self, reader: Reader) -> list[dict]:
        """Each storage quota over the reader's own folders, with what it holds now (as last
        measured): `group` None for the user's own quota. Empty: no storage quota."""
        figures = []
        for group, limit in self.storage_limits(reader.groups):
            if group is None:
                used = self.store.used_by(reader.account)
            else:
                used = self.store.used_by(owners=self.members(group))
            # A group's quota, over several owners' folders, has no kernel form.
            held_by = "kernel" if self.projects is not None and group is None else "measure"
            figures.append(
                {
                    "group": group,
                    "used_bytes": used,
                    "limit_bytes": limit,
                    "full": used >= limit,
                    "held_by": held_by,
                }
            )
        self._hold_in_kernel(reader, figures)
        return figures

    def _hold_in_kernel(self, reader: Reader, figures: list[dict]) -> None:
        """The reader's own quota as their project's hard limit: read wherever the quotas are
        (the Storage page, a launch, a new folder), so a changed group property takes hold at
        the owner's next visit."""
        if self.projects is None:
            return
        own = next((q["limit_bytes"] for q in figures if q["group"] is None), None)
        self.projects.limit(self.store.project_of(reader.account), own)

    def _tag(self, folder_id: str, account: Account | None) -> None:
        """Count the folder's directory (and all in it) under the account's project (None: no
        project, as in the trash, where nothing is counted)."""
        if self.projects is not None:
            project = NO_PROJECT if account is None else self.store.project_of(account)
            self.projects.assign(self.files.source(folder_id), project)

    def over_quota(
        self, reader: Reader, adding: int = 0, asker: Reader | None = None
    ) -> str | None:
        """Why `adding` more bytes in the reader's own folders would pass a storage quota (or
        why they are past one already, with `adding` 0); None while there is room. Told to
        `asker` (the reader by default): another writer is told whose quota it is."""
        own = asker is None or asker.account == reader.account
        for quota in self.quotas(reader):
            used, limit, group = quota["used_bytes"], quota["limit_bytes"], quota["group"]
            if used + adding > limit or (adding == 0 and quota["full"]):
                if group is not None:
                    whose, scope = f"The folders of group {group} hold", "its"
                elif own:
                    whose, scope = "Your folders hold", "your"
                else:
                    name = reader.account.name
                    whose, scope = f"The folders of {name} (this folder's owner) hold", "their"
                fix = "remove files to make room" if own else "files must be removed first"
                return (
                    f"{whose} {format_size(used)} of {scope} storage quota of "
                    f"{format_size(limit)}; {fix}."
                )
        return None

    def _refuse_past_quota(
        self, reader: Reader, adding: int, asker: Reader | None = None, cause: str = "quota"
    ) -> None:
        reason = self.over_quota(reader, adding, asker)
        if reason:
            raise Refusal(reason, cause)

    def owner_past_quota(self, folder: dict, reader: Reader) -> str | None:
        """Why nobody may write the folder now: its owner's folders are past a storage quota
        (told to `reader`, who may be a sharer); None while there is room."""
        return self.over_quota(self._owner_of(folder, reader), 0, asker=reader)

    def room(self, folder: dict, reader: Reader) -> int | None:
        """Bytes the storage quotas of the folder's owner leave for writes to it, as last
        measured (None: no quota): what `write` lets a writer add, counted per file by SFTP."""
        rooms = [
            q["limit_bytes"] - q["used_bytes"] for q in self.quotas(self._owner_of(folder, reader))
        ]
        return min(rooms) if rooms else None

    def refusal_to_add(self, folder: dict, reader: Reader, adding: int) -> Refusal:
        """The refusal of a write that would add `adding` bytes past the owner's quota."""
        reason = self.over_quota(self._owner_of(folder, reader), adding, reader)
        return Refusal(reason or "The folder's owner has no room left.", "full")

    # -- folders ------------------------------------------------------------------------------

    def visible(self, reader: Reader, everyone: bool) -> list[dict]:
        folders = self.store.visible(reader, everyone=everyone and reader.admin)
        if everyone and reader.admin:
            for folder in folders:
                folder["problem"] = self.problems.get(folder["id"])
        return folders

    def create(self, reader: Reader, name) -> dict:
        name = folder_name(name)
        self._refuse_past_quota(reader, 0)
        account = reader.account
        folder_id = uuid.uuid4().hex
        self.files.make(folder_id)
        try:
            self._tag(folder_id, account)
            return self.store.create(account, name, folder_id)
        except BaseException:
            self.files.unmake(folder_id)  # made a moment ago, still empty
            raise

    def rename(self, reader: Reader, folder_id: str, name) -> dict:
        return self.store.rename(folder_id, folder_name(name), reader)

    def remove(self, reader: Reader, folder_id: str) -> dict:
        # The record first: a folder the reader may not remove is refused before anything moves.
        trash_name = self.files.trash_name(folder_id)
        folder = self.store.remove(folder_id, reader, trash_name=trash_name)
        with contextlib.suppress(FileNotFoundError):  # (a directory already gone)
            self._tag(folder_id, None)  # a removed folder no longer fills its owner's quota
        self.files.trash(folder_id, name=trash_name)
        return folder

    def purge(self, now: float | None = None) -> list[str]:
        """Purge what was removed longer than the grace period ago (what cannot be is logged
        and tried again next time)."""
        return self.files.purge_trash((now if now is not None else time.time()) - self.grace)

    def share(self, reader: Reader, folder_id: str, target: dict, access) -> tuple[dict, bool]:
        return self.store.share(folder_id, reader, target, permission(access))

    def unshare(self, reader: Reader, folder_id: str, share_id: int) -> None:
        self.store.unshare(folder_id, share_id, reader)

    def give(self, folder_id: str, account: Account) -> dict:
        folder = self.store.give(folder_id, account)
        self._tag(folder_id, account)
        return folder

    def mounts(self, reader: Reader, keys, courses=()) -> list[dict]:
        """What a session of the reader mounts: the folders named (by id or name), the
        reader's own automount folders and those of `courses` (course folder ids,
        course_folders.py) the reader may see, each with its directory (`source`), where it
        appears under the session's home folder (`path`) and whether it is read-only."""
        visible = self.store.visible(reader)  # read once: the grant path runs this per spawn
        chosen = pick_named(visible, keys)
        automount = [f for f in visible if f["own"] and f["automount"]]
        # A course's folder mounts where a chosen one would (~/folders/NAME), never over the
        # home, and gives way to a folder of that name the reader chose.
        taken = {f["name"] for f in chosen if not f["automount"]}
        automount += [
            f
            for f in visible
            if f["id"] in set(courses) and not f["own"] and f["name"] not in taken
        ]
        # A folder whose owner is past a storage quota is mounted read-only for every writer,
        # sharers included: the owner's quota bounds what anyone puts in it.
        past: dict[str, str | None] = {}

        def owner_past(folder: dict) -> str | None:
            if folder["permission"] != "rw":
                return None
            if folder["owner"] not in past:
                past[folder["owner"]] = self.owner_past_quota(folder, reader)
            return past[folder["owner"]]

        mounts = {}
        for folder in [*chosen, *automount]:
            path = folder["name"] if folder["automount"] else f"{MOUNT_DIR}/{folder['name']}"
            if path in mounts and mounts[path]["id"] != folder["id"]:
                raise Refusal(
                    f"Two folders named {folder['name']!r} would meet at ~/{path}; mount one "
                    "of them, by its id.",
                    "invalid",
                )
            mounts[path] = {
                "id": folder["id"],
                "name": folder["name"],
                "owner": folder["owner"],
                "source": self.files.source(folder["id"]),
                "path": path,
                "read_only": folder["permission"] != "rw" or bool(owner_past(folder)),
                "note": owner_past(folder),
            }
        return list(mounts.values())

    def note_session_mounts(self, session_id: str, mounts: list[dict]) -> None:
        self.store.record_session_mounts(session_id, mounts)
        self._session_mounts[session_id] = sorted((_shown(m) for m in mounts), key=_path)

    def session_mounts(self, session_ids) -> dict[str, list[dict]]:
        """What each of these (active) sessions mounts; read from memory, as the Sessions page
        polls it; what a restart forgot is read from the DB once."""
        missing = [i for i in session_ids if i not in self._session_mounts]
        if missing:
            found = self.store.session_mounts(missing)
            self._session_mounts.update({i: found.get(i, []) for i in missing})
        return {i: self._session_mounts[i] for i in session_ids}

    def remembered_mounts(self, session_ids) -> dict[str, list[dict]] | None:
        """`session_mounts` from memory alone; None when some must be read from the DB."""
        try:
            return {i: self._session_mounts[i] for i in session_ids}
        except KeyError:
            return None

    def forget_session_mounts(self, active_ids) -> None:
        """Keep in memory only the mounts of sessions still active."""
        active = set(active_ids)
        for session_id in [i for i in self._session_mounts if i not in active]:
            del self._session_mounts[session_id]

    # -- files --------------------------------------------------------------------------------

    def listing(
        self, reader: Reader, folder_id: str, path: str, after: str = "", limit: int = 1000
    ) -> dict | None:
        """One page of the directory at `path`, subdirectories first, by name, as {folder, path, entries, next} (`next`:
        the name to ask the following page after, None on the last); None when `path` is a file."""
        folder, parts = self._reach(reader, folder_id, path, "ro")
        if not self.files.is_directory(folder_id, parts):
            return None
        entries, following = self.files.listing(folder_id, parts, after, limit)
        return {
            "folder": folder["id"],
            "path": "/".join(parts),
            "entries": entries,
            "next": following,
        }

    def open_file(self, reader: Reader, folder_id: str, path: str) -> tuple[int, int]:
        """(descriptor, size) of the file at `path`, open for reading; the caller closes it."""
        _, parts = self._reach(reader, folder_id, path, "ro")
        return self.files.open_file(folder_id, parts)

    def write(self, reader: Reader, folder_id: str, path: str, data: bytes, offset: int) -> int:
        """A sequential upload's chunk, whole in memory (the API streams it: `open_chunk`)."""
        write, _, _ = self.open_chunk(reader, folder_id, path, offset, len(data))
        try:
            write.write(data)
        except BaseException:
            self.abandon_chunk(write, None)
            raise
        return self.finish_chunk(folder_id, write, None)

    def open_chunk(
        self,
        reader: Reader,
        folder_id: str,
        path: str,
        offset: int,
        length: int | None,
        size: int | None = None,
        upload_id: str | None = None,
    ) -> tuple[ChunkWrite | None, Upload | None, int | None]:
        """Where an upload's chunk of `length` bytes (None: not said, a chunked body) at
        `offset` goes, once the caller may write there and the owner's quotas have room:
        (the chunk's write, None for a chunk of a parallel upload already complete; the
        parallel upload, if it is one; the bytes the quotas leave, None for no quota). `size`
        starts a parallel upload of a file of `size` bytes; `upload_id` names one under way."""
        folder, parts = self._reach(reader, folder_id, path, "rw")
        owner = self._owner_of(folder, reader)
        # Counted against the owner's quotas; a writer of a shared folder fills the owner's.
        adding, upload = length or 0, None
        if upload_id is not None:
            upload = self.uploads.get(upload_id, reader.account, folder_id, parts)
            _refuse_past_end(offset, length, upload.size)
            if upload.complete:
                return None, upload, None
        elif size is not None:
            if offset != 0:
                raise Refusal(
                    "A parallel upload starts at offset 0 (?offset=0&size=S); its other "
                    "chunks name it (?upload=ID).",
                    "invalid",
                )
            _refuse_past_end(offset, length, size)
            free = self.files.free_bytes()
            if size > free:  # refused at once, not when the disk fills halfway
                raise Refusal(
                    f"The disk has room for {format_size(free)}; the file is {format_size(size)}.",
                    "full",
                )
            adding = size
        self._refuse_past_quota(owner, adding, reader, "full")
        if upload is not None:
            write = self.files.open_chunk(folder_id, parts, offset, part=upload.part)
        elif size is not None:
            self._forget_old_uploads()
            upload = self.uploads.start(reader.account, folder_id, parts, size, part_name())
            try:
                write = self.files.open_chunk(folder_id, parts, 0, upload.part, new_size=size)
            except BaseException:
                self.uploads.drop(upload)
                raise
        else:
            write = self.files.open_chunk(folder_id, parts, offset)
        return write, upload, self.room(folder, reader)

    def finish_chunk(self, folder_id: str, write: ChunkWrite, upload: Upload | None) -> int:
        """The chunk came whole: a sequential upload's first chunk becomes the file, a parallel
        upload's counts, and its last makes the file whole. The file's size so far."""
        if upload is None:
            write.finish(rename=write.part is not None)
            self.measure_after_change(folder_id)
            return write.position
        rename = self.uploads.add(upload, write.start, write.position)
        try:
            write.finish(rename)
        except Refusal:
            self.uploads.drop(upload)
            self._remove_part(upload)
            raise
        if rename:  # the whole size was checked against the quotas at the start
            self.measure_after_change(folder_id)
        return upload.received_bytes

    def abandon_chunk(self, write: ChunkWrite, upload: Upload | None) -> None:
        """The chunk did not come whole: the disk as it was before it (chunk_writes.py)."""
        write.abandon()
        if upload is not None and write.new:  # the upload's first chunk: no upload at all
            self.uploads.drop(upload)

    def _forget_old_uploads(self) -> None:
        for upload in self.uploads.forgotten():
            self._remove_part(upload)

    def _remove_part(self, upload: Upload) -> None:
        with contextlib.suppress(Refusal, OSError):
            self.files.remove(upload.folder_id, (*upload.parts[:-1], upload.part))

    def make_directory(self, reader: Reader, folder_id: str, path: str) -> None:
        _, parts = self._reach(reader, folder_id, path, "rw")
        self.files.make_directory(folder_id, parts)
        self.measure_after_change(folder_id)

    def rename_path(self, reader: Reader, folder_id: str, path: str, to: str) -> None:
        _, parts = self._reach(reader, folder_id, path, "rw")
        if not isinstance(to, str):
            raise Refusal('Say the new path as text: {"to": "..."}.', "invalid")
        self.files.rename(folder_id, parts, path_parts(to))
        self.measure_after_change(folder_id)

    def remove_path(self, reader: Reader, folder_id: str, path: str) -> None:
        _, parts = self._reach(reader, folder_id, path, "rw")
        self.files.remove(folder_id, parts)
        self.measure_after_change(folder_id)

    def _owner_of(self, folder: dict, reader: Reader) -> Reader:
        if folder["own"]:
            return reader
        return self._owner_reader(Account(folder["owner"], self.store.account_of(folder["id"])))

    def _owner_reader(self, account: Account) -> Reader:
        # The owner's groups as the service last saw them (their own last request): their
        # groups' quotas bound the folder for every writer too.
        return Reader(account, frozenset(self.groups_of(account.name)))

    def measure_all(self) -> int:
        """Measure every folder (sessions write them directly); how many were measured."""
        ids = self.store.all_ids()
        for folder_id in ids:
            # One folder that cannot be measured (its directory missing, a tree moved while it
            # was walked, a disk error) never stops the round for the others: the admins see it.
            try:
                self._keep_tagged(folder_id)
                self.files.close(folder_id)  # made open before folders were closed
                self.measure(folder_id)
            except Exception as e:
                self.problems[folder_id] = _problem(e)
                log.warning("Could not measure storage folder %s: %s", folder_id, e)
            else:
                self.problems.pop(folder_id, None)
        return len(ids)

    def stop_writes_past_quota(
        self, users: dict[str, str], stop: Callable[[str, str], bool]
    ) -> list[tuple[str, str]]:
        """For each active session (`users`: session id to its user) that mounts read-write a
        folder whose owner is now past a storage quota: `stop(session_id, source)` its writes
        (folder_write_stops.py; False where it cannot), and record the mount read-only with
        the reason, which the session's page shows. The (session, folder) pairs stopped."""
        stopped = []
        for session_id, mounts in self.session_mounts(list(users)).items():
            changed = False
            for mount in mounts:
                if mount["read_only"]:
                    continue
                owner = self._owner_reader(self.store.owner_account(mount["id"]))
                user = users[session_id]
                asker = owner if owner.account.name == user else Reader(Account(user, ""))
                reason = self.over_quota(owner, 0, asker=asker)
                if reason and stop(session_id, self.files.source(mount["id"])):
                    mount.update(read_only=True, note=f"Writes stopped: {reason}")
                    stopped.append((session_id, mount["id"]))
                    changed = True
            if changed:
                self.note_session_mounts(session_id, mounts)
        return stopped

    def _keep_tagged(self, folder_id: str) -> None:
        """Under project quotas, every file and directory of a folder is counted under its
        owner's project, each round: the files belong to the session user, who may set a file's
        project id (to 0, or to another user's) to slip the quota; the round sets it back."""
        if self.projects is None:
            return
        project = self.store.project_of(self.store.owner_account(folder_id))
        self.projects.assign(self.files.source(folder_id), project)

    def measure_after_change(self, folder_id: str) -> None:
        """Measure a folder the request just changed: the change is made, so a measure that
        fails (a session moving a tree meanwhile) is the round's to redo, not the request's."""
        try:
            self.measure(folder_id)
        except OSError as e:
            log.warning("Could not measure storage folder %s after a change: %s", folder_id, e)

    def measure(self, folder_id: str) -> None:
        found = self.files.measure(folder_id)
        modified = datetime.fromtimestamp(found.modified, UTC)
        self.store.record_measure(folder_id, found.bytes, found.files, modified)

    def _reach(self, reader: Reader, folder_id: str, path: str, needs: str):
        """The folder and the path's parts, if the reader may `needs` ("ro" or "rw") there."""
        parts = path_parts(path)
        folder = self.store.get(folder_id, reader)
        may = "rw" if reader.admin else folder["permission"]
        if needs == "rw" and may != "rw":
            raise Refusal(f"{folder['name']} is shared with you read-only.", "forbidden")
        return folder, parts


def _refuse_past_end(offset: int, length: int | None, size: int) -> None:
    if offset > size or (length is not None and offset + length > size):
        end = offset + (length or 0)
        raise Refusal(
            f"The chunk ends at byte {end}, past the end of the file ({size} bytes).", "invalid"
        )


def _problem(error: Exception) -> str:
    """What an admin reads about a folder the round could not measure."""
    if isinstance(error, Refusal):
        return str(error)
    return f"Not measured: {error.__class__.__name__}: {error}"


def _shown(mount: dict) -> dict:
    """A mount as a session's record shows it: not where its files are on the host."""
    return {key: mount.get(key) for key in ("id", "name", "owner", "path", "read_only", "note")}


def _path(mount: dict) -> str:
    return mount["path"]
