"""Where an SFTP path's files are on this host, and what the login may do there: the Storage
page's rules, asked of the same parts.

- The home folder (`/`): the account's own home, found as a batch job's notebook is looked for
  (job_files.py: the home volume's directory on one host, the account's folder of the shared home
  root on a Swarm). The user's own: read and write, no storage quota (homes have none).
- A storage folder (`/folders/<name>`): one of the login's own folders or one shared with them,
  picked by name as a launch picks it (own names first); "rw" for their own and read-write
  shares, read-only otherwise; writes count against the owner's storage quotas (`Folders.room`).

Blocking (the database, the engine's volume list): the SFTP side calls these in a thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from queue_service.core.errors import Refusal
from queue_service.core.sftp_paths import Place
from queue_service.folders import Folders
from queue_service.job_files import MISSING, JobFiles
from queue_service.store.folder_files import FolderFiles
from queue_service.store.folders import Reader, pick_named


@dataclass(frozen=True)
class Spot:
    """A path's files: `parts` under the directory `key` of `files`; `folder` is the storage
    folder's record (None in the home); `read_only` says why writes are refused (None: they are
    not)."""

    files: FolderFiles
    key: str
    parts: tuple[str, ...]
    folder: dict | None = None
    read_only: str | None = None

    def same_area(self, other: Spot) -> bool:
        return self.files.root == other.files.root and self.key == other.key


class FileAreas:
    def __init__(self, folders: Folders, job_files: JobFiles):
        self.folders = folders
        self.job_files = job_files

    def locate(self, reader: Reader, place: Place) -> Spot:
        """The spot of a `home` or `folder` place; a refusal where the login has none."""
        if place.area == "folder":
            folder = self.folder(reader, place.folder)
            files = self.folders.files
            read_only = None
            if folder["permission"] != "rw":
                read_only = f"{folder['name']} is shared with you read-only."
            return Spot(files, folder["id"], place.parts, folder, read_only)
        files, key = self.home(reader)
        return Spot(files, key, place.parts)

    def home(self, reader: Reader) -> tuple[FolderFiles, str]:
        found = self.job_files.home(reader.account)
        if found == MISSING:
            raise Refusal(
                "Your home folder is made with your first session: start one on the Sessions "
                "page once. Your storage folders are under /folders meanwhile.",
                "not_found",
            )
        if found is None:
            raise Refusal(
                "Your home folder is not on this host; your storage folders are under /folders.",
                "not_found",
            )
        return found

    def has_home(self, reader: Reader) -> bool:
        try:
            self.home(reader)
        except Refusal:
            return False
        return True

    def visible(self, reader: Reader) -> list[dict]:
        """The login's folders (own and shared), each name once: their own first."""
        seen, kept = set(), []
        for folder in sorted(self.folders.store.visible(reader), key=lambda f: not f["own"]):
            if folder["name"] not in seen:
                seen.add(folder["name"])
                kept.append(folder)
        return kept

    def folder(self, reader: Reader, name: str) -> dict:
        (folder,) = pick_named(self.folders.store.visible(reader), [name])
        return folder
