"""Parallel uploads under way: which bytes of each file have come whole.

A parallel upload (`PUT api/folders/{id}/files/{path}?offset=0&size=S`, handlers/folders.py)
writes its chunks into a hidden part file (store/chunk_writes.py), each at its own offset, in any
order and several at once; a chunk may come again (its answer was lost, a reverse proxy cut its
request) and is written over. The file is complete, and the part file renamed to it, when the
chunks that came whole cover every byte. Only this record says which did: a chunk cut short
leaves bytes in the part file that nobody counts.

The record lives in the service's memory: after a restart, or `FORGET_AFTER` seconds without a
chunk, an upload is unknown, its next chunk is refused (409, "upload the file again") and its part
file, a hidden file in the folder, is removed by the next upload's look at forgotten ones.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field

from queue_service.core.errors import Refusal

#: Seconds an upload is kept without any chunk coming.
FORGET_AFTER = 3600.0
#: Uploads one account may have under way at once (each holds a part file and a record).
MAX_PER_ACCOUNT = 64


@dataclass
class Upload:
    """One file's parallel upload."""

    id: str
    account: object  # the uploader's store.accounts.Account
    folder_id: str
    parts: tuple[str, ...]
    size: int
    part: str
    #: Byte ranges [start, end) that came whole, merged and in order.
    received: list[tuple[int, int]] = field(default_factory=list)
    complete: bool = False
    #: Whether the part file was (or is being) renamed to the file: done once.
    renamed: bool = False
    touched: float = field(default_factory=time.monotonic)

    def add(self, start: int, end: int) -> None:
        """Count [start, end) as in; `complete` once everything is."""
        ranges = sorted([*self.received, (start, end)])
        merged: list[tuple[int, int]] = []
        for low, high in ranges:
            if merged and low <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], high))
            else:
                merged.append((low, high))
        self.received = merged
        self.complete = merged == [(0, self.size)] or self.size == 0

    @property
    def received_bytes(self) -> int:
        return sum(high - low for low, high in self.received)

    def answer(self, path: str) -> dict:
        return {
            "path": path,
            "size": self.size,
            "upload": self.id,
            "part": "/".join((*self.parts[:-1], self.part)),
            "received": self.received_bytes,
            "complete": self.complete,
        }


class Uploads:
    """The parallel uploads the service knows, by id."""

    def __init__(self):
        self.under_way: dict[str, Upload] = {}
        #: Held for every change: chunks come and finish in several helper threads at once.
        self.lock = threading.Lock()

    def start(
        self, account: object, folder_id: str, parts: tuple[str, ...], size: int, part: str
    ) -> Upload:
        with self.lock:
            mine = sum(u.account == account and not u.complete for u in self.under_way.values())
            if mine >= MAX_PER_ACCOUNT:
                raise Refusal(
                    f"You have {mine} uploads under way; finish or cancel some first.", "conflict"
                )
            upload = Upload(secrets.token_hex(12), account, folder_id, parts, size, part)
            self.under_way[upload.id] = upload
        return upload

    def get(
        self, upload_id: str, account: object, folder_id: str, parts: tuple[str, ...]
    ) -> Upload:
        """The upload `upload_id` of this caller's file; 409 for any other (unknown, forgotten,
        another file's or another user's: the same answer, so an id says nothing)."""
        upload = self.under_way.get(upload_id)
        if upload is None or (upload.account, upload.folder_id, upload.parts) != (
            account,
            folder_id,
            parts,
        ):
            raise Refusal(
                "No such upload of this file is under way (finished long ago, forgotten by a "
                "restart, or another file's): upload the file again from offset 0.",
                "conflict",
            )
        upload.touched = time.monotonic()
        return upload

    def add(self, upload: Upload, start: int, end: int) -> bool:
        """Count [start, end) of `upload` as in; whether this made it complete (once only)."""
        with self.lock:
            upload.add(start, end)
            whole = upload.complete and not upload.renamed
            upload.renamed = upload.renamed or whole
        return whole

    def drop(self, upload: Upload) -> None:
        with self.lock:
            self.under_way.pop(upload.id, None)

    def forgotten(self, now: float | None = None) -> list[Upload]:
        """Uploads without a chunk for `FORGET_AFTER` seconds, taken out of the record."""
        now = time.monotonic() if now is None else now
        with self.lock:
            old = [u for u in self.under_way.values() if now - u.touched > FORGET_AFTER]
            for upload in old:
                del self.under_way[upload.id]
        return old
