"""What a session keeps between sessions: Docker mounts for the home volume and group data folders.

Pure: user name + groups + settings → a list of `docker.types.Mount` (plain dicts for the engine's
API, built without any call to it). The spawner gathers the inputs, prepares the group folders on
the host, and passes the mounts to `container_spec.build_container_spec`.

- **Home.** Each user gets a named volume (`fgpu-home-{username}`) at the image's home folder. A
  new volume is filled from the image's own home folder, ownership included, so it belongs to the
  session user (uid 1000, gid 100) from the start. Notebooks and `pip install --user` packages
  (`~/.local`) therefore outlive the container, and a session committed to an image never carries
  a home folder in it: `docker commit` leaves volumes out.
- **Group data.** With a host folder configured, each of the user's hub groups that has a safe name
  gets `<folder>/<group>` mounted at `~/data/<group>`: read-only for students, read-write for
  members of a writer group (`instructors`).
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from docker.types import Mount
from escapism import escape

LABEL_USER = "fgpu.user"
LABEL_VOLUME = "fgpu.volume"
# Docker volume names allow [a-zA-Z0-9][a-zA-Z0-9_.-]*; '_' escapes everything else, itself included.
_VOLUME_SAFE = set(string.ascii_letters + string.digits + "-.")
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


def volume_safe(name: str) -> str:
    """`name` as a Docker volume name component: distinct names stay distinct."""
    return escape(name, safe=_VOLUME_SAFE, escape_char="_")


def home_volume_name(template: str, username: str) -> str:
    return template.format(username=volume_safe(username))


def data_groups(groups: Iterable[str]) -> list[str]:
    """The groups that get a data folder: sorted, and only names that are one safe path part."""
    return sorted(group for group in set(groups) if _GROUP_FOLDER_RE.match(group))


def home_mount(settings: StorageSettings, username: str) -> Mount:
    labels = {**settings.labels, LABEL_USER: username, LABEL_VOLUME: "home"}
    return Mount(
        target=settings.home_path,
        source=home_volume_name(settings.home_volume, username),
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


def session_mounts(settings: StorageSettings, username: str, groups: Iterable[str]) -> list[Mount]:
    """Every storage mount of one session; an empty setting turns its part off."""
    mounts = [home_mount(settings, username)] if settings.home_volume else []
    if settings.group_data_dir:
        mounts += group_data_mounts(settings, groups)
    return mounts
