"""A backup archive's rules, without I/O: its name, its manifest, and the checks a restore makes.

An archive is one gzipped tar. Its members are the databases (`db/`), the state files (`state/`),
the catalog file (`catalog/`), the config (`config/`), and, when asked, private images (`images/`),
home folders (`homes/`) and storage folders' files (`folders/`); `manifest.json` comes last and
names every other member with its SHA-256 and size, the versions that wrote it (fgpu-hub, JupyterHub, both schema revisions), when
and where. A restore reads the whole archive once and checks it against the manifest before it
changes anything (`verify`), and refuses schema revisions this code does not know
(`check_revisions`): those come from a newer fgpu-hub.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath

from fgpu_shared.units import format_size

from .cli import AdminError

FORMAT = "fgpu-hub-backup"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
ARCHIVE_PREFIX = "fgpu-hub-backup-"
ARCHIVE_SUFFIX = ".tar.gz"
_STAMP = "%Y%m%dT%H%M%SZ"
_NAME_RE = re.compile(
    rf"^{re.escape(ARCHIVE_PREFIX)}(\d{{8}}T\d{{6}}Z){re.escape(ARCHIVE_SUFFIX)}$"
)
#: Members live under these folders; anything else in an archive is refused.
MEMBER_FOLDERS = ("db/", "state/", "catalog/", "config/", "images/", "homes/", "folders/")
DATABASES = ("hub", "queue")


class ArchiveError(AdminError):
    """The archive cannot be written or restored: one line that says why."""


class Digest:
    """SHA-256 and size of a member, fed in chunks as it streams by."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self.size = 0

    def update(self, chunk: bytes) -> None:
        self._sha.update(chunk)
        self.size += len(chunk)

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()


# ---------------------------------------------------------------------------------------------
# Names and retention.
# ---------------------------------------------------------------------------------------------


def archive_name(now: datetime) -> str:
    """`fgpu-hub-backup-20261126T041800Z.tar.gz`: sorts by time, and tells retention its age."""
    return f"{ARCHIVE_PREFIX}{now.astimezone(UTC).strftime(_STAMP)}{ARCHIVE_SUFFIX}"


def archived_at(name: str) -> datetime | None:
    """When an archive of that name was made; None for any other file (never deleted)."""
    match = _NAME_RE.match(name)
    if match is None:
        return None
    return datetime.strptime(match.group(1), _STAMP).replace(tzinfo=UTC)


def expired(names: Iterable[str], now: datetime, keep_days: int) -> list[str]:
    """The archives among `names` made more than `keep_days` days before `now`, oldest first."""
    limit = now - timedelta(days=keep_days)
    dated = [(archived_at(name), name) for name in names]
    return [name for made, name in sorted((d, n) for d, n in dated if d) if made < limit]


# ---------------------------------------------------------------------------------------------
# The manifest.
# ---------------------------------------------------------------------------------------------


def build_manifest(
    *,
    created: datetime,
    host: str,
    state_dir: str,
    versions: Mapping[str, str],
    databases: Mapping[str, dict],
    members: Mapping[str, Digest],
    modes: Mapping[str, int],
    files: Iterable[dict],
    images: Iterable[dict] = (),
    homes: Iterable[dict] = (),
    folders: Iterable[dict] = (),
) -> dict:
    """The manifest of an archive whose members were `members` (name → its digest).

    `databases`: {"hub"|"queue": {"kind", "member", "revision"}}; `files`: {"member", "kind",
    "restore_to", ...} for the state, catalog and config files; `images` and `homes`: what the
    hub has of each, `member` set when it is in the archive, else `save_command`.
    """
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created": created.astimezone(UTC).isoformat(timespec="seconds"),
        "host": host,
        "state_dir": state_dir,
        "versions": dict(versions),
        "databases": {name: dict(databases[name]) for name in DATABASES},
        "files": [dict(f) for f in files],
        "images": [dict(i) for i in images],
        "homes": [dict(h) for h in homes],
        "folders": [dict(f) for f in folders],
        "members": {
            name: {"sha256": digest.sha256, "size": digest.size, "mode": modes.get(name, 0o600)}
            for name, digest in sorted(members.items())
        },
    }


def manifest_bytes(manifest: Mapping) -> bytes:
    return (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()


def parse_manifest(data: bytes) -> dict:
    """The manifest, or an ArchiveError naming what is wrong with it."""
    try:
        manifest = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArchiveError(f"its manifest is not JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArchiveError("it is not an fgpu-hub backup (its manifest names another format)")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ArchiveError(
            f"it is in backup format {version!r}, newer than this fgpu-hub reads"
            f" ({FORMAT_VERSION}): restore it with the fgpu-hub version that wrote it"
        )
    for key, kind in (("members", dict), ("databases", dict), ("files", list)):
        if not isinstance(manifest.get(key), kind):
            raise ArchiveError(f"its manifest has no valid {key!r}")
    for name in DATABASES:
        database = manifest["databases"].get(name)
        if not isinstance(database, dict) or database.get("member") not in manifest["members"]:
            raise ArchiveError(f"its manifest names no {name} database member")
    for name in manifest["members"]:
        check_member_name(name)
    return manifest


def check_member_name(name: str) -> str:
    """A member name that stays inside its folder when extracted: no absolute path, no `..`."""
    parts = name.split("/")
    if (
        not name.startswith(MEMBER_FOLDERS)
        or any(part in ("", ".", "..") for part in parts)
        or "\\" in name
    ):
        raise ArchiveError(f"it holds a member with an unsafe name: {name!r}")
    return name


#: One path part: what a home folder, a state file or a site config file is named.
_PLAIN_NAME_RE = re.compile(r"^[A-Za-z0-9_@][A-Za-z0-9_.@+-]{0,254}$")
#: Docker's volume name grammar.
_VOLUME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$")


def home_folder(home: Mapping, root: str | None) -> Path:
    """Where a Swarm home folder goes back: under the root this site's config names
    (FGPU_SWARM_HOME_ROOT), by its last name part; never the root the archive names."""
    if not root:
        raise ArchiveError(
            f"it holds home folder {home.get('name')!r}, and this site names no"
            " FGPU_SWARM_HOME_ROOT: set it to where this hub keeps its home folders"
        )
    name = PurePosixPath(str(home.get("name", ""))).name
    if not _PLAIN_NAME_RE.match(name):
        raise ArchiveError(f"it holds a home folder with an unsafe name: {home.get('name')!r}")
    return Path(root) / name


def check_volume_name(name: object) -> str:
    if not isinstance(name, str) or not _VOLUME_RE.match(name):
        raise ArchiveError(f"it holds a home volume with an unsafe name: {name!r}")
    return name


def file_name(entry: Mapping, state_names: frozenset[str]) -> str:
    """The name a state file or site config file is restored under, in the state directory:
    a state file one of `state_names`, a site config file one plain `*.py` name."""
    name = entry.get("restore_to")
    if entry.get("kind") == "state":
        allowed = name in state_names
    else:
        allowed = (
            isinstance(name, str) and bool(_PLAIN_NAME_RE.match(name)) and name.endswith(".py")
        )
    if not allowed:
        raise ArchiveError(
            f"it would restore {entry.get('member')!r} to {name!r}, not a state file"
        )
    return name


def verify(manifest: Mapping, seen: Mapping[str, tuple[str, int]]) -> None:
    """Every member the manifest names was read whole with its checksum, and nothing else was
    there. `seen`: member name → (sha256, size) as read from the archive."""
    expected = manifest["members"]
    missing = sorted(set(expected) - set(seen))
    if missing:
        raise ArchiveError(f"it lacks {len(missing)} member(s) its manifest lists: {missing[0]}")
    extra = sorted(set(seen) - set(expected))
    if extra:
        raise ArchiveError(f"it holds a member its manifest does not list: {extra[0]}")
    for name, (sha256, size) in sorted(seen.items()):
        entry = expected[name]
        if size != entry.get("size") or sha256 != entry.get("sha256"):
            raise ArchiveError(f"{name} fails its checksum: the archive was changed or damaged")


def check_revisions(manifest: Mapping, known: Mapping[str, Iterable[str]]) -> None:
    """Refuse databases whose schema revision this code does not know (a newer fgpu-hub's or
    JupyterHub's): the hub would refuse them, or migrate them wrongly. `known`: database →
    every revision of this install's migrations."""
    for name in DATABASES:
        revision = manifest["databases"][name].get("revision")
        if revision not in set(known[name]):
            raise ArchiveError(
                f"its {name} database is at schema revision {revision!r}, which this install"
                " does not know: it comes from a newer version; install that version"
                f" ({manifest.get('versions', {}).get('fgpu-hub', '?')}) and restore again"
            )


_REVISION_RE = re.compile(r"""^revision\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""", re.MULTILINE)


def revision_of(script: str) -> str | None:
    """The revision id an alembic migration script declares (`revision = "0007"`): read from
    its text, as alembic reads it, without importing every migration of JupyterHub's."""
    match = _REVISION_RE.search(script)
    return match.group(1) if match else None


def engine_parts(manifest: Mapping) -> tuple[list[dict], list[dict]]:
    """The images and home folders in the archive (they need the Docker engine to restore)."""
    included = [i for i in manifest.get("images", []) if i.get("member")]
    homes = [h for h in manifest.get("homes", []) if h.get("member")]
    return included, homes


def not_saved(manifest: Mapping) -> list[str]:
    """One line per image or home folder that the archive lists without holding it."""
    lines = []
    for kind in ("images", "homes", "folders"):
        for part in manifest.get(kind, []):
            if not part.get("member"):
                name = part.get("label") or part["name"]
                lines.append(
                    f"not in the archive: {name} ({format_size(part.get('size') or 0)});"
                    f" save it with: {part['save_command']}"
                )
    return lines


#: A storage folder's id (a uuid4's hex): its directory's name under the folders root.
_FOLDER_ID_RE = re.compile(r"^[0-9a-f]{32}$")


def saved_folders(manifest: Mapping) -> list[dict]:
    """The storage folders whose files the archive holds, each id checked: it names the directory
    a restore writes under this site's folders root."""
    folders = [f for f in manifest.get("folders", []) if f.get("member")]
    for folder in folders:
        if not isinstance(folder.get("name"), str) or not _FOLDER_ID_RE.match(folder["name"]):
            raise ArchiveError(
                f"it holds a storage folder with an unsafe id: {folder.get('name')!r}"
            )
    return folders
