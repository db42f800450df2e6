"""A batch job's notebook is looked for at submission: a missing one is refused with a 400 and
nothing is queued (docs/source/howto/batch-jobs.md), instead of failing once the job runs.

A notebook path is relative to the home folder, and the service looks where the job will see it:

- **In a storage folder the launch mounts** (`folders/<name>/...`, or an automount folder's
  `<name>/...`): in that folder's directory, through the mounts `folders.py` resolved for the
  launch.
- **Else in the user's home**, the account's own (`fgpu_shared/homes.py` picks it as the spawner
  does): on one host, the home volume's directory, its `Mountpoint` from the engine, when that
  directory is on this host (the service runs beside the engine); in Swarm mode, the account's
  folder of the shared home root (`QueueService.home_root`), mounted on the hub's host as on
  every node. A home that does not exist yet (the user's first session ever) holds no notebook:
  refused too.

Every path is walked as storage folders' files are (`store/folder_files.py`): one component at a
time, without following a link and without opening the file; the service runs as root, so a link
a session planted must never take it out of the home. What the service cannot see is let
through, and the job runner then fails at once ("notebook ~/x not found", code 2): a link on the
way (the job follows it, as the session user), a home on another engine or node (Swarm mode
without a shared home root, an engine reached over the network), an engine that does not answer,
or no persistent home at all (`home_volume` empty).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from fgpu_shared.homes import (
    account_tag,
    home_folder_name,
    home_volume_name,
    pick_home_account,
    pick_home_volume,
)
from queue_service.core.errors import Refusal
from queue_service.engine.errors import ENGINE_ERRORS
from queue_service.store.accounts import Account
from queue_service.store.folder_files import FolderFiles

from .folders import MOUNT_DIR

#: A home that does not exist (yet): it holds no notebook.
MISSING = "missing"


@dataclass(frozen=True)
class HomeSettings:
    """Where homes are: QueueService.home_volume and home_root, as the spawner's own
    (FGPUSpawner.home_volume, FGPUSwarmSpawner.home_root); `volumes_here` when sessions' volumes
    are on the service's engine (one host, not a Swarm)."""

    volume: str = "fgpu-home-{username}"
    root: str = ""
    volumes_here: bool = True


class JobFiles:
    """Looks for batch jobs' notebooks (the sessions handler's and the grants handler's)."""

    def __init__(self, settings: HomeSettings, inspect_volume: Callable[[str], dict | None]):
        # engine/volumes.py's inspect_volume_with, on one host.
        self.settings = settings
        self.inspect_volume = inspect_volume

    def home(self, account: Account) -> tuple[FolderFiles, str] | str | None:
        """The account's home as (the files of its parent directory, its name there), MISSING
        when it does not exist, or None when the service cannot read it from here."""
        if self.settings.root:
            return self._shared_home(account)
        if self.settings.volume and self.settings.volumes_here:
            return self._volume_home(account)
        return None

    def _shared_home(self, account: Account) -> tuple[FolderFiles, str] | None:
        root = Path(self.settings.root)
        if not root.is_absolute() or not root.is_dir():
            return None  # not mounted here: the spawner refuses to start sessions anyway
        tag = account_tag(account.created)
        try:
            own = root / home_folder_name(account.name, tag)
            plain = root / home_folder_name(account.name)
        except ValueError:
            return None
        modified = _directory_modified(plain)
        picked = pick_home_account(tag, account.created, _is_directory(own), modified)
        return FolderFiles(root), home_folder_name(account.name, picked)

    def _volume_home(self, account: Account) -> tuple[FolderFiles, str] | str | None:
        template, tag = self.settings.volume, account_tag(account.created)
        names = {home_volume_name(template, account.name, t) for t in ("", tag)}
        try:
            volumes = {name: self.inspect_volume(name) for name in names}
        except ENGINE_ERRORS:  # the engine does not answer: the job goes through
            return None
        volume = volumes[pick_home_volume(template, account.name, account.created, volumes)]
        if volume is None:
            return MISSING  # made at the account's first session
        where = volume.get("Mountpoint") or ""
        if not where.startswith("/") or not _is_directory(Path(where)):
            return None  # an engine elsewhere, or a volume driver without a local directory
        path = Path(where)
        return FolderFiles(path.parent), path.name

    def notebook_refusal(self, account: Account, notebook: str, mounts: list[dict]):
        """Why the job's `notebook` cannot run (a Refusal), or None: it is there, or the service
        cannot tell. `mounts`: the storage folders the launch mounts (Folders.mounts)."""
        parts = tuple(notebook.split("/"))
        for mount in mounts:
            inside = tuple(mount["path"].split("/"))
            if parts[: len(inside)] == inside:
                source = Path(mount["source"])
                found = FolderFiles(source.parent).holds_file(source.name, parts[len(inside) :])
                if found is False:
                    return Refusal(
                        f"notebook {notebook} is not in storage folder {mount['name']} "
                        f"(~/{mount['path']})."
                    )
                return None
        home = self.home(account)
        if home is None:
            return None
        found = False if home == MISSING else home[0].holds_file(home[1], parts)
        if found is not False:
            return None
        hint = ""
        if parts[0] == MOUNT_DIR and len(parts) > 2:
            hint = (
                f" A storage folder appears under ~/{MOUNT_DIR}/ only when the launch names it "
                f'(e.g. "folders": ["{parts[1]}"]).'
            )
        return Refusal(f"notebook {notebook} is not in your home folder.{hint}")


def _is_directory(path: Path) -> bool:
    """Whether `path` is a directory itself (a link to one is not)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _directory_modified(path: Path) -> datetime | None:
    """A directory's modification time, None if it is not one (a link is not)."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return datetime.fromtimestamp(info.st_mtime, UTC) if stat.S_ISDIR(info.st_mode) else None
