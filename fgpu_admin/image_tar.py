"""A private image's `docker save` tar from an archive: the names a load would give, checked first.

`docker load` tags what the tar itself names, not what the archive's manifest says: its
`manifest.json` (`RepoTags`), the older `repositories` file, and an OCI `index.json`'s name
annotations. An archive that named a catalog image there would replace it on the engine. So a
restore reads every name the tar carries and loads it only when they are exactly the one name
the manifest lists, and that name is in the private repository (the only images a backup saves).
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from .archive import ArchiveError

#: The OCI annotations an engine may tag a loaded image with.
_NAME_ANNOTATIONS = ("io.containerd.image.name", "org.opencontainers.image.ref.name")


def names_in(path: Path) -> set[str]:
    """Every image name a `docker load` of the tar at `path` could tag."""
    return _names(_name_files(path))


def image_id(path: Path) -> str | None:
    """The id of the image the tar holds (its config's digest), to tell whether the engine
    already has that very image under the name."""
    entries = _as_list(_name_files(path)["manifest.json"])
    config = str(entries[0].get("Config", "")) if entries else ""
    digest = config.rsplit("/", 1)[-1].removesuffix(".json")
    return f"sha256:{digest}" if digest else None


_NAME_FILES = ("manifest.json", "repositories", "index.json")


def _name_files(path: Path) -> dict:
    """The JSON files of the tar that name images, read."""
    try:
        with tarfile.open(path) as tar:
            files = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isreg()}
            if "manifest.json" not in files:
                raise ArchiveError(f"{path.name} is not a `docker save` tar (no manifest.json)")
            return {n: json.load(tar.extractfile(files[n])) for n in _NAME_FILES if n in files}
    except (tarfile.TarError, ValueError) as e:
        raise ArchiveError(f"{path.name} is not a readable image tar ({e})") from None


def _names(read: dict) -> set[str]:
    names: set[str] = set()
    for entry in _as_list(read.get("manifest.json")):
        names.update(entry.get("RepoTags") or [])
    for repository, tags in _as_dict(read.get("repositories")).items():
        names.update(f"{repository}:{tag}" for tag in _as_dict(tags))
    for entry in _as_list(_as_dict(read.get("index.json")).get("manifests")):
        annotations = _as_dict(entry.get("annotations") if isinstance(entry, dict) else None)
        names.update(annotations[key] for key in _NAME_ANNOTATIONS if key in annotations)
    return {str(name) for name in names}


def _as_list(value) -> list:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _as_dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def check_names(found: set[str], listed: str, private: bool) -> None:
    """Refuse an image tar that would tag anything but `listed`, or a name outside the private
    repository (`private`: whether `listed` is in it)."""
    if not private:
        raise ArchiveError(
            f"it lists image {listed!r}, which is not a private image: a backup saves only those"
        )
    others = sorted(found - {listed})
    if others:
        raise ArchiveError(
            f"its image {listed} would also be loaded as {others[0]!r}; nothing restored"
        )
