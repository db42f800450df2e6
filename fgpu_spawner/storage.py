"""What a session keeps between sessions: Docker mounts for the home volume and group data folders.

Pure: user name + groups + settings → a list of `docker.types.Mount` (plain dicts for the engine's
API, built without any call to it). The spawner gathers the inputs, prepares the group folders on
the host, and passes the mounts to `container_spec.build_container_spec`.

- **Home.** Each user gets a named volume (`fgpu-home-{username}`) at the image's home folder. A
  new volume is filled from the image's own home folder, ownership included, so it belongs to the
  session user (uid 1000, gid 100) from the start. Notebooks and `pip install --user` packages
  (`~/.local`) therefore outlive the container, and a session committed to an image never carries
  a home folder in it: `docker commit` leaves volumes out.
- **Accounts.** A home volume belongs to one hub account, not to a name: it is labelled with its
  owner's creation time (`fgpu.account`). When a user is deleted and a new one of the same name
  appears, the old volume is kept untouched and the new account gets a volume of its own, named
  with its creation time (`fgpu-home-alice_u20261123T211411123456Z`). `pick_home_volume` decides
  from what the engine says about both names; the spawner asks it. These names live in
  `fgpu_shared/homes.py`, which the queue service reads homes by too.
- **Storage folders.** The folders a session mounts (chosen at launch, and its owner's
  automount folders) are binds of their directories, as the queue service resolved them:
  `folder_mounts`.
- **Group data.** With a host folder configured, each of the user's hub groups that has a safe name
  gets `<folder>/<group>` mounted at `~/data/<group>`: read-only for students, read-write for
  members of a writer group (`instructors`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from docker.types import Mount

from fgpu_shared.homes import (  # noqa: F401 (the spawner's names for them)
    LABEL_ACCOUNT,
    account_tag,
    belongs_to_account,
    home_volume_name,
    pick_home_volume,
    volume_safe,
)

LABEL_USER = "fgpu.user"
LABEL_VOLUME = "fgpu.volume"
# A group folder name must stay one path component on the host and in the container.
_GROUP_FOLDER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class StorageSettings:
    """The spawner's storage traits, as plain values."""

    home_volume: str = "fgpu-home-{username}"
    home_path: str = "/home/jovyan"
    group_data_dir: str = ""
    group_data_path: str = "/home/jovyan/data"
    group_data_writers: tuple[str, ...] = ("instructors",)
    labels: Mapping[str, str] = field(default_factory=dict)


def data_groups(groups: Iterable[str]) -> list[str]:
    """The groups that get a data folder: sorted, and only names that are one safe path part."""
    return sorted(group for group in set(groups) if _GROUP_FOLDER_RE.match(group))


def home_mount(
    settings: StorageSettings, username: str, volume: str = "", account: str = ""
) -> Mount:
    """The home volume mount: `volume` (from `pick_home_volume`), or the user's plain one. Its
    labels mark a volume the engine creates for it; an existing one keeps its own."""
    labels = {**settings.labels, LABEL_USER: username, LABEL_VOLUME: "home"}
    if account:
        labels[LABEL_ACCOUNT] = account
    return Mount(
        target=settings.home_path,
        source=volume or home_volume_name(settings.home_volume, username),
        type="volume",
        labels=labels,
    )


def group_data_mounts(settings: StorageSettings, groups: Iterable[str]) -> list[Mount]:
    groups = set(groups)
    writer = bool(groups & set(settings.group_data_writers))
    root = settings.group_data_dir.rstrip("/")
    target = settings.group_data_path.rstrip("/")
    return [
        Mount(
            target=f"{target}/{group}",
            source=f"{root}/{group}",
            type="bind",
            read_only=not writer,
        )
        for group in data_groups(groups)
    ]


def folder_mounts(home_path: str, folders: Iterable[Mapping]) -> list[Mount]:
    """Binds of the storage folders the queue service resolved for this session (folders.py):
    each at `<home>/<its path>`, read-only as a bind for a read-only share, so that nothing in
    the session can write it, whatever it does to permissions."""
    home = home_path.rstrip("/")
    return [
        Mount(
            target=f"{home}/{folder['path']}",
            source=folder["source"],
            type="bind",
            read_only=bool(folder["read_only"]),
        )
        for folder in folders
    ]


def session_mounts(
    settings: StorageSettings,
    username: str,
    groups: Iterable[str],
    home_volume: str = "",
    account: str = "",
) -> list[Mount]:
    """Every storage mount of one session; an empty setting turns its part off."""
    mounts = [home_mount(settings, username, home_volume, account)] if settings.home_volume else []
    if settings.group_data_dir:
        mounts += group_data_mounts(settings, groups)
    return mounts
