"""`api/folders` (docs/source/explanation/contracts.md, contract 4): storage folders, their
shares and their files.

- `GET api/folders`: your own and those shared with you; `?all=1`: everyone's (admins);
  with `storage_quotas`: each storage quota over your own folders, `{group (null: your own),
  used_bytes, limit_bytes, full, held_by}` (none: no quota; `held_by` "kernel" where a write
  past it fails at once, project_quotas.py, else "measure"); the spawner reads `?user=NAME`'s, for its
  form's folder picker;
- `POST api/folders {name}`; `PATCH api/folders/{id} {name}` (admins also `{owner}`);
  `DELETE api/folders/{id}` (kept in the trash for the grace period);
- `POST api/folders/{id}/shares {user | group, permission: "ro" | "rw"}` (201, or 200 when it
  changes an existing share's permission); `DELETE api/folders/{id}/shares/{share_id}`;
- `GET api/folders/{id}/files/{path}`: a directory's listing as JSON, a page at a time (subdirectories first, by name)
  (`?limit=` entries, `?after=` a name; `next` names the following page's `after`), or a file's
  bytes (always as a download: a file a user put there never runs as a page of this site);
- `PUT api/folders/{id}/files/{path}?offset=N`: upload one chunk of at most `CHUNK_BYTES`, sent as
  `application/octet-stream` and written to disk as it comes; offset 0 starts the file (it
  replaces a file of that name once the chunk is in), each next chunk starts where it ends;
  a chunk that does not come whole leaves the file as it was before it;
- parallel (resumable) uploads: `PUT ...?offset=0&size=S` starts one of a file of `S` bytes
  (its answer says `upload`, an id), then `PUT ...?offset=N&upload=ID` sends each other chunk,
  in any order, several at once, a chunk again if its answer was lost; each answer says
  `received` and `complete`. The chunks go into a hidden part file (`part` in the answer, in
  the same directory) that becomes the file once every byte is in (uploads.py);
- `POST api/folders/{id}/files/{path} {"type": "directory"}`: make a directory;
  `PATCH api/folders/{id}/files/{path} {"to": path}`: rename or move inside the folder;
  `DELETE api/folders/{id}/files/{path}`: remove a file, a link or a directory.

Folders are users': a service's token is refused, but for the spawner's read of one user's. Folders another user cannot see are 404 to
them, never 403, so their names and ids say nothing.
"""

from __future__ import annotations

import asyncio
import os
from urllib.parse import quote

from tornado import web

from queue_service.core import query_args
from queue_service.core.errors import Refusal
from queue_service.store.accounts import Account
from queue_service.store.folders import Reader

from .base import BaseHandler

#: The largest chunk of an upload; the Storage page sends files in chunks of this size.
CHUNK_BYTES = 8 * 1024 * 1024
#: The largest file an upload makes (offsets and sizes past it are refused): 1 PiB.
MAX_FILE_BYTES = 1 << 50
_READ_BYTES = 1024 * 1024
#: Entries in one page of a directory's listing, by default and at most (`?limit=`).
LISTING_DEFAULT = 1000
LISTING_MAX = 5000
_ID = r"([0-9a-f]{32})"
#: The account of a share with a user the hub does not have: no account's key (those are times).
NO_ACCOUNT = "none"


def routes(prefix: str) -> list:
    api = prefix + r"api/folders"
    return [
        (api, FoldersHandler),
        (api + "/" + _ID, FolderHandler),
        (api + "/" + _ID + r"/shares", SharesHandler),
        (api + "/" + _ID + r"/shares/([0-9]+)", ShareHandler),
        (api + "/" + _ID + r"/files/(.*)", FilesHandler),
    ]


class FolderAPIHandler(BaseHandler):
    async def reader(self, with_quotas: bool = False) -> Reader:
        """The caller; `with_quotas` first reads their groups' storage quotas from the hub, for
        what adds bytes (a new folder, an upload), not for every read."""
        person = await self.person()
        if with_quotas:
            await self.refresh_quotas(person)
        return Reader.of(person)

    async def run(self, call, *args):
        """A folder operation off the event loop (it touches the DB and the disk)."""
        return await asyncio.to_thread(call, *args)


class FoldersHandler(FolderAPIHandler):
    query_arguments = {"all": "flag", "user": "text"}

    @web.authenticated
    async def get(self):
        if self.identity().get("kind") == "service":
            await self.get_for_spawn_form()
            return
        everyone = query_args.flag(self.get_argument("all", ""), "all", False)
        # The quotas as the hub has them now: the page shows how full they are.
        reader = await self.reader(with_quotas=True)
        if everyone and not reader.admin:
            self.require_admin("Everyone's folders")
        folders = await self.run(self.folders.visible, reader, everyone)
        quotas = await self.run(self.folders.quotas, reader)
        self.write_json({"folders": folders, "storage_quotas": quotas})

    async def get_for_spawn_form(self) -> None:
        """The spawner's read, for its form's folder picker: `?user=NAME`'s folders (own and
        shared with them) as the hub has that user now. No other service reads folders."""
        if self.identity().get("name") != self.spawner_service:
            raise web.HTTPError(403, "Only users and the hub's spawner read folders.")
        name = self.get_argument("user", "")
        if not name:
            raise web.HTTPError(400, "The spawner must name the user: ?user=NAME.")
        user = await self.from_hub(self.hub.user_now(name))
        reader = Reader.of({**user, "admin": False})
        self.write_json({"folders": await self.run(self.folders.visible, reader, False)})

    @web.authenticated
    async def post(self):
        reader = await self.reader(with_quotas=True)
        name = self.body().get("name")
        self.write_json(await self.run(self.folders.create, reader, name), 201)


class FolderHandler(FolderAPIHandler):
    @web.authenticated
    async def get(self, folder_id):
        reader = await self.reader()
        self.write_json(await self.run(self.folders.store.get, folder_id, reader))

    @web.authenticated
    async def patch(self, folder_id):
        reader, body = await self.reader(), self.body()
        unknown = set(body) - {"name", "owner"}
        if unknown or not body:
            raise web.HTTPError(400, "Change a folder's name (or, as an admin, its owner).")
        folder = None
        if "owner" in body:
            self.require_admin("Handing a folder to another owner")
            account = await self.account_named(body["owner"])
            await self.run(self.folders.store.get, folder_id, reader)
            folder = await self.run(self.folders.give, folder_id, account)
        if "name" in body:
            folder = await self.run(self.folders.rename, reader, folder_id, body["name"])
        self.write_json(folder)

    @web.authenticated
    async def delete(self, folder_id):
        reader = await self.reader()
        await self.run(self.folders.remove, reader, folder_id)
        self.set_status(204)
        self.finish()

    async def account_named(self, name) -> Account:
        if not isinstance(name, str) or not name:
            raise web.HTTPError(400, 'Name the new owner: {"owner": "NAME"}.')
        created = await self.from_hub(self.hub.account_created(name))
        if created is None:
            raise web.HTTPError(400, f"The hub has no user {name!r}.")
        return Account.of({"name": name, "created": created})


class SharesHandler(FolderAPIHandler):
    @web.authenticated
    async def post(self, folder_id):
        reader, body = await self.reader(), self.body()
        await self.run(self.folders.store.get, folder_id, reader)  # 404 before any hub lookup
        target = await self.target(body, reader.admin)
        share, new = await self.run(
            self.folders.share, reader, folder_id, target, body.get("permission")
        )
        self.write_json(share, 201 if new else 200)

    async def target(self, body: dict, admin: bool) -> dict:
        """{"user", "account"} or {"group"}: one of them. Only an admin learns that the hub has
        no such user or group (a 400): anyone else gets the same answer as for one it has, so
        the share endpoint never tells a student who exists. Such a share opens nothing: a user
        share names an account (`NO_ACCOUNT`, none), a group share counts once an admin makes
        that group (docs/source/howto/storage-folders.md)."""
        user, group = body.get("user"), body.get("group")
        if (user is None) == (group is None):
            raise web.HTTPError(400, 'Share with one "user" or one "group".')
        if not isinstance(user or group, str) or not (user or group):
            raise web.HTTPError(400, "Name the user or group as text.")
        if user is not None:
            created = await self.from_hub(self.hub.account_created(user))
            if created is None:
                if admin:
                    raise web.HTTPError(400, f"The hub has no user {user!r}.")
                return {"user": user, "account": NO_ACCOUNT}
            return {"user": user, "account": Account.of({"name": user, "created": created}).key}
        try:
            await self.from_hub(self.hub.group(group))
        except web.HTTPError as e:
            if e.status_code != 404:  # the hub failed or is away: its answer, not "no group"
                raise
            if admin:
                raise web.HTTPError(400, f"The hub has no group {group!r}.") from None
        return {"group": group}


class ShareHandler(FolderAPIHandler):
    @web.authenticated
    async def delete(self, folder_id, share_id):
        reader = await self.reader()
        await self.run(self.folders.unshare, reader, folder_id, int(share_id))
        self.set_status(204)
        self.finish()


class ChunkSink:
    """An upload chunk's way to disk (the base streams the body here): its write, the parallel
    upload it belongs to, and the room the owner's quotas leave (a chunked body has no length
    to check first)."""

    def __init__(self, folders, folder_id: str, write, upload, room: int | None):
        self.folders, self.folder_id = folders, folder_id
        self.chunk, self.upload, self.room = write, upload, room

    def write(self, data: bytes) -> None:
        if self.chunk is None:  # a chunk of an upload already complete: nothing to write
            return
        if self.room is not None and self.chunk.written + len(data) > self.room:
            raise Refusal("The folder's owner has no room left for this chunk.", "full")
        self.chunk.write(data)

    def finish(self) -> int:
        """The chunk came whole; the file's size so far (a parallel upload: bytes in)."""
        if self.chunk is None:
            return self.upload.received_bytes
        return self.folders.finish_chunk(self.folder_id, self.chunk, self.upload)

    def abandon(self) -> None:
        if self.chunk is not None:
            self.folders.abandon_chunk(self.chunk, self.upload)


class FilesHandler(FolderAPIHandler):
    query_arguments = {
        "offset": "whole",
        "size": "whole",
        "upload": "text",
        "limit": "whole",
        "after": "text",
    }
    max_body_bytes = CHUNK_BYTES

    def streams_body(self) -> bool:
        return self.request.method == "PUT"

    def body_types(self) -> tuple[str, ...]:
        return (
            ("application/octet-stream",) if self.request.method == "PUT" else ("application/json",)
        )

    @web.authenticated
    async def get(self, folder_id, path):
        reader = await self.reader()
        limit = query_args.whole(
            self.get_argument("limit", ""), "limit", LISTING_DEFAULT, 1, LISTING_MAX
        )
        after = self.get_argument("after", "")
        listing = await self.run(self.folders.listing, reader, folder_id, path, after, limit)
        if listing is not None:
            self.write_json(listing)
            return
        await self.send_file(reader, folder_id, path)

    async def send_file(self, reader: Reader, folder_id: str, path: str) -> None:
        name = path.rstrip("/").rsplit("/", 1)[-1]
        # A user's file is never a page of this site: downloaded, never sniffed or run.
        self.set_header("Content-Type", "application/octet-stream")
        self.set_header("Content-Disposition", f"attachment; filename*=UTF-8''{quote(name)}")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Content-Security-Policy", "sandbox; default-src 'none'")
        fd, size = await self.run(self.folders.open_file, reader, folder_id, path)
        try:
            self.set_header("Content-Length", str(size))
            offset = 0
            while offset < size:  # what was there when opened: a file still growing is cut
                chunk = await asyncio.to_thread(
                    os.pread, fd, min(_READ_BYTES, size - offset), offset
                )
                if not chunk:
                    break
                offset += len(chunk)
                self.write(chunk)
                await self.flush()
        finally:
            os.close(fd)
        self.finish()

    async def open_body(self) -> ChunkSink:
        """Where the chunk goes, once the caller may write it there (folders.open_chunk):
        checked before a byte of it is read."""
        folder_id, path = self.path_args
        self.identity()  # 401 before anything else for a caller the hub does not know
        offset = query_args.whole(self.get_argument("offset", ""), "offset", 0, 0, MAX_FILE_BYTES)
        size = query_args.whole(self.get_argument("size", ""), "size", -1, 0, MAX_FILE_BYTES)
        upload = self.get_argument("upload", "") or None
        if size >= 0 and upload is not None:
            raise web.HTTPError(
                400, "Start a parallel upload (?size=) or send a chunk of one (?upload=), not both."
            )
        length = (
            None
            if "Transfer-Encoding" in self.request.headers
            else int(self.request.headers.get("Content-Length", "0"))
        )
        # A parallel upload's chunk: its quotas were read from the hub when it started.
        reader = await self.reader(with_quotas=upload is None)
        write, parallel, room = await self.run(
            self.folders.open_chunk,
            reader,
            folder_id,
            path,
            offset,
            length,
            None if size < 0 else size,
            upload,
        )
        return ChunkSink(self.folders, folder_id, write, parallel, room)

    @web.authenticated
    async def put(self, folder_id, path):
        sink = await self.body_in() or await self.open_body()  # none yet: an empty body
        try:
            size = await self.run(sink.finish)
        except BaseException:
            await self.run(sink.abandon)
            raise
        status = 201 if sink.chunk is not None and sink.chunk.new else 200
        if sink.upload is not None:
            self.write_json(sink.upload.answer(path), status)
        else:
            self.write_json({"path": path, "size": size}, status)

    @web.authenticated
    async def post(self, folder_id, path):
        reader = await self.reader()
        if self.body() != {"type": "directory"}:
            raise web.HTTPError(400, 'Make a directory with {"type": "directory"}.')
        await self.run(self.folders.make_directory, reader, folder_id, path)
        self.write_json({"path": path, "type": "directory"}, 201)

    @web.authenticated
    async def patch(self, folder_id, path):
        reader, body = await self.reader(), self.body()
        if set(body) != {"to"}:
            raise web.HTTPError(400, 'Rename with {"to": "new/path"}.')
        await self.run(self.folders.rename_path, reader, folder_id, path, body["to"])
        self.write_json({"path": body["to"]})

    @web.authenticated
    async def delete(self, folder_id, path):
        reader = await self.reader()
        await self.run(self.folders.remove_path, reader, folder_id, path)
        self.set_status(204)
        self.finish()
