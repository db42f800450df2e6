"""Put a backup archive's state back into the current directory; the hub then starts as before.

The whole archive is read and checked first: every member against the manifest's checksum, and
both databases' schema revisions against the migrations this install knows (an archive from a
newer version is refused). Nothing is changed until all of it holds. Existing state here (a
database, a state file, a config file that differs, a home volume) is overwritten only after a
yes: asked on a terminal, `--yes` otherwise. The hub must be stopped.

Then: private images are loaded and home folders filled (when the archive holds them), the
PostgreSQL databases are emptied and loaded in one transaction each, and the files (SQLite
databases, state files with their modes, site config, catalog) are put in place. Started again
with the same command, the hub adopts the sessions whose containers still run (they carry the
restored deployment id) and ends the others as lost (queue_service/reconciler.py).
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import os
import sys
import tarfile
import tempfile
import zlib
from pathlib import Path

from queue_service import state_dir

from . import archive
from .archive import ArchiveError, Digest
from .backup import (
    HOME_MOUNT,
    PROJECT_CONFIG,
    copy_sqlite,
    engine_error,
    engine_for,
    make_url,
    psql,
    short_error,
    sqlite_file,
)
from .cli import AdminError

#: Files of the archive that belong elsewhere (the project's config, the service's env file) are
#: put here for the admin to compare, never over the install's own.
ASIDE_DIR = "restored-config"
CHUNK = 1 << 20
#: Empties the configured PostgreSQL database, in the transaction that loads the dump.
EMPTY_POSTGRES = """
DO $$ DECLARE r record; BEGIN
  FOR r IN SELECT viewname FROM pg_views WHERE schemaname = 'public' LOOP
    EXECUTE format('DROP VIEW IF EXISTS public.%I CASCADE', r.viewname); END LOOP;
  FOR r IN SELECT tablename FROM pg_tables WHERE schemaname = 'public' LOOP
    EXECUTE format('DROP TABLE IF EXISTS public.%I CASCADE', r.tablename); END LOOP;
  FOR r IN SELECT sequence_name FROM information_schema.sequences
           WHERE sequence_schema = 'public' LOOP
    EXECUTE format('DROP SEQUENCE IF EXISTS public.%I CASCADE', r.sequence_name); END LOOP;
  FOR r IN SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
           WHERE n.nspname = 'public' AND t.typtype = 'e' LOOP
    EXECUTE format('DROP TYPE IF EXISTS public.%I CASCADE', r.typname); END LOOP;
END $$;
"""


def add_arguments(parser) -> None:
    parser.add_argument("file", metavar="FILE", help="the archive fgpu-hub backup wrote")
    parser.add_argument(
        "--yes", action="store_true", help="overwrite existing state here without asking"
    )
    parser.add_argument(
        "--helper-image",
        default="fgpu/jupyter-base:py3.11",
        help="image whose (never started) container fills home volumes",
    )


def run(args) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise AdminError(f"{args.file}: no such archive")
    state = Path.cwd()
    manifest = read_checked(path)
    archive.check_revisions(manifest, known_revisions())
    refuse_if_hub_runs(state)
    targets = Targets(manifest, state)
    engine = engine_for(_EngineWanted(manifest)) if any(archive.engine_parts(manifest)) else None
    existing = targets.existing(engine)
    if existing:
        _confirm(existing, args.yes)
    with tempfile.TemporaryDirectory(dir=state, prefix=".fgpu-restore-") as staging:
        try:
            extract(path, manifest, Path(staging))
        except OSError as e:  # a full disk, say
            raise AdminError(
                f"cannot unpack the archive here ({e.strerror or e}); nothing changed"
            ) from None
        try:
            apply(manifest, Path(staging), targets, engine, args.helper_image)
        except OSError as e:
            raise AdminError(
                f"the restore stopped part-way ({e.strerror or e}: {e.filename or ''});"
                " fix that and run it again with --yes"
            ) from None
    _report(path, manifest, targets)
    return 0


# ---------------------------------------------------------------------------------------------
# Checks: nothing is changed until they all pass.
# ---------------------------------------------------------------------------------------------


def read_checked(path: Path) -> dict:
    """The archive's manifest, once every member was read whole and matched its checksum."""
    seen: dict[str, tuple[str, int]] = {}
    manifest_data = None
    for member, chunks in _members(path):
        if member.name == archive.MANIFEST:
            manifest_data = b"".join(chunks)
            continue
        digest = Digest()
        for chunk in chunks:
            digest.update(chunk)
        seen[member.name] = (digest.sha256, digest.size)
    if manifest_data is None:
        raise ArchiveError(f"{path} has no manifest: it is truncated or not an fgpu-hub backup")
    try:
        manifest = archive.parse_manifest(manifest_data)
        archive.verify(manifest, seen)
    except ArchiveError as e:
        raise ArchiveError(f"{path}: {e}") from None
    return manifest


#: What a cut or damaged gzip or tar raises while it is read.
_DAMAGED = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile)


def _members(path: Path):
    """(member, its chunks) in archive order; a damaged or cut archive is an ArchiveError."""
    try:
        # gzip's own reader checks the CRC at the end; tarfile's stream reader does not.
        with gzip.open(path, "rb") as packed, tarfile.open(fileobj=packed, mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    raise ArchiveError(f"{path} holds {member.name!r}, which is not a file")
                yield member, _chunks(tar.extractfile(member), path)
            # Read to the end: what follows the tar's end mark is checked too.
            while packed.read(CHUNK):
                pass
    except _DAMAGED as e:
        raise _damaged(path, e) from None


def _chunks(file, path: Path):
    try:
        while chunk := file.read(CHUNK):
            yield chunk
    except _DAMAGED as e:
        raise _damaged(path, e) from None


def _damaged(path: Path, error: Exception) -> ArchiveError:
    return ArchiveError(f"{path} is truncated or damaged ({error or type(error).__name__})")


def known_revisions() -> dict[str, set[str]]:
    """Every schema revision this install's migrations know, for the queue DB and the hub DB."""
    # Found, not imported: importing jupyterhub takes a second.
    (hub_package,) = importlib.util.find_spec("jupyterhub").submodule_search_locations
    queue_package = Path(__file__).resolve().parent.parent / "queue_service"
    return {
        "queue": _revisions(queue_package / "migrations" / "versions"),
        "hub": _revisions(Path(hub_package) / "alembic" / "versions"),
    }


def _revisions(folder: Path) -> set[str]:
    found = (archive.revision_of(path.read_text()) for path in folder.glob("*.py"))
    return {revision for revision in found if revision}


def refuse_if_hub_runs(state: Path) -> None:
    """A hub (or its queue service) running from this directory would write over the restore."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if Path(cwd) == state and ("jupyterhub" in command or "queue_service" in command):
            raise AdminError(
                f"a hub runs from this directory (process {proc.name}: {command.strip()[:80]});"
                " stop it before restoring"
            )


class _EngineWanted:
    """What `engine_for` names in its message: the parts of the archive that need the engine."""

    def __init__(self, manifest: dict):
        images, homes = archive.engine_parts(manifest)
        self.with_images, self.with_homes = bool(images), bool(homes)


class Targets:
    """Where each part of the archive goes in this directory (and this environment's DBs)."""

    def __init__(self, manifest: dict, state: Path):
        self.manifest, self.state = manifest, state
        self.databases = {
            "hub": state_dir.hub_db_url(),
            "queue": state_dir.queue_db_url(),
        }
        self.files: dict[str, Path] = {}
        for entry in manifest["files"]:
            if not _same_as_installed(entry, manifest):
                self.files[entry["member"]] = self._file_target(entry)

    def _file_target(self, entry: dict) -> Path:
        kind = entry.get("kind")
        if kind in ("state", "site-config"):
            return self.state / Path(entry["restore_to"]).name
        if kind == "catalog":
            configured = os.environ.get("FGPU_CATALOG_PATH")
            return Path(configured) if configured else self.state / "catalog.yaml"
        return self.state / ASIDE_DIR / Path(entry["member"]).name

    def existing(self, engine) -> list[str]:
        """What the restore would overwrite here."""
        found = []
        for what, url in self.databases.items():
            kind = self.manifest["databases"][what]["kind"]
            path = sqlite_file(url)
            if (path is None) != (kind == "postgresql"):
                raise AdminError(
                    f"the archive's {what} database is {kind}, and this hub's"
                    f" ({_safe_url(url)}) is not:"
                    f" set {'FGPU_HUB_DB_URL' if what == 'hub' else 'FGPU_QUEUE_DB_URL'} to match"
                )
            if path is not None and path.exists():
                found.append(path.name)
            elif path is None and psql(url, "-At", "-c", _ANY_TABLE).strip():
                found.append(f"the {what} database {_safe_url(url)}")
        for target in self.files.values():
            if target.exists() and target.parent.name != ASIDE_DIR:
                found.append(
                    str(
                        target.relative_to(self.state)
                        if target.is_relative_to(self.state)
                        else target
                    )
                )
        _, homes = archive.engine_parts(self.manifest)
        for home in homes:
            if home.get("kind") == "volume" and _volume_exists(engine, home["name"]):
                found.append(f"home volume {home['name']}")
            elif (
                home.get("kind") == "folder"
                and _home_root(home).joinpath(Path(home["name"]).name).exists()
            ):
                found.append(f"home folder {_home_root(home) / Path(home['name']).name}")
        return found


def _same_as_installed(entry: dict, manifest: dict) -> bool:
    """The project's own config, unchanged since the backup: nothing to compare."""
    if entry.get("source") != str(PROJECT_CONFIG) or not PROJECT_CONFIG.is_file():
        return False
    digest = Digest()
    digest.update(PROJECT_CONFIG.read_bytes())
    return digest.sha256 == manifest["members"][entry["member"]]["sha256"]


_ANY_TABLE = "SELECT 1 FROM pg_tables WHERE schemaname = 'public' LIMIT 1"


def _safe_url(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _volume_exists(engine, name: str) -> bool:
    import docker.errors

    try:
        engine.volumes.get(name)
        return True
    except docker.errors.NotFound:
        return False


def _confirm(existing: list[str], yes: bool) -> None:
    listed = ", ".join(existing[:6]) + (
        f" and {len(existing) - 6} more" if len(existing) > 6 else ""
    )
    if yes:
        print(f"overwriting {listed}", file=sys.stderr)
        return
    if not sys.stdin.isatty():
        raise AdminError(
            f"this directory already holds a hub's state ({listed}); run again with --yes to overwrite it"
        )
    answer = input(f"Overwrite {listed}? [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise AdminError("nothing restored")


# ---------------------------------------------------------------------------------------------
# Extracting and putting in place.
# ---------------------------------------------------------------------------------------------


def extract(path: Path, manifest: dict, staging: Path) -> None:
    """Every listed member into `staging`, checked again as it is written (the file may have
    changed since it was read)."""
    for member, chunks in _members(path):
        if member.name == archive.MANIFEST:
            for _ in chunks:
                pass
            continue
        archive.check_member_name(member.name)
        target = staging / member.name
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        digest = Digest()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as file:
            for chunk in chunks:
                digest.update(chunk)
                file.write(chunk)
        expected = manifest["members"].get(member.name, {})
        if (digest.sha256, digest.size) != (expected.get("sha256"), expected.get("size")):
            raise ArchiveError(f"{path}: {member.name} changed while it was restored")


def apply(manifest: dict, staging: Path, targets: Targets, engine, helper_image: str) -> None:
    # First what the engine takes: a refusal there leaves the databases and files as they were.
    try:
        _restore_engine_parts(manifest, staging, engine, helper_image)
    except Exception as e:
        if not engine_error(e):
            raise
        raise AdminError(
            f"the Docker engine refused ({short_error(e)}); the databases and files are unchanged"
        ) from None
    for what, url in targets.databases.items():
        database = manifest["databases"][what]
        mode = manifest["members"][database["member"]].get("mode", 0o600) & 0o777
        _restore_database(url, staging / database["member"], mode)
    for member, target in targets.files.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = staging / member
        os.chmod(staged, manifest["members"][member].get("mode", 0o600) & 0o777)
        if target.parent == staging.parent:
            os.replace(staged, target)
        else:  # another file system, maybe: copied, then renamed there
            aside = target.with_name(f".{target.name}.restoring")
            with open(staged, "rb") as src, open(aside, "wb") as dst:
                while chunk := src.read(CHUNK):
                    dst.write(chunk)
            os.chmod(aside, manifest["members"][member].get("mode", 0o600) & 0o777)
            os.replace(aside, target)


def _restore_engine_parts(manifest: dict, staging: Path, engine, helper_image: str) -> None:
    images, homes = archive.engine_parts(manifest)
    for image in images:
        with open(staging / image["member"], "rb") as file:
            engine.images.load(file)
        print(f"loaded {image['name']}", file=sys.stderr)
    for home in homes:
        _restore_home(engine, home, staging / home["member"], helper_image)


def _home_root(home: dict) -> Path:
    """Where a Swarm home folder goes back: this hub's shared home root, else where it was."""
    return Path(os.environ.get("FGPU_SWARM_HOME_ROOT") or Path(home["name"]).parent)


def _restore_database(url: str, staged: Path, mode: int) -> None:
    path = sqlite_file(url)
    if path is None:
        with open(staged, "rb") as dump:
            psql(url, "--single-transaction", "-c", EMPTY_POSTGRES, "-f", "-", stdin=dump)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f".{path.name}.restoring")
    copy_sqlite(staged, aside)
    # A WAL left from the old database would be replayed into the restored one.
    for suffix in ("-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{path}{suffix}")
    os.chmod(aside, mode)
    os.replace(aside, path)


def _restore_home(engine, home: dict, staged: Path, helper_image: str) -> None:
    if home.get("kind") == "folder":
        with tarfile.open(staged) as tar:
            tar.extractall(_home_root(home), filter="tar")
        return
    labels = home.get("labels") or {}
    with contextlib.suppress(Exception):
        engine.volumes.create(home["name"], labels=labels)
    container = engine.containers.create(
        helper_image,
        command=["true"],
        volumes={home["name"]: {"bind": HOME_MOUNT, "mode": "rw"}},
        labels={"fgpu.restore": "1"},
    )
    try:
        with open(staged, "rb") as data:
            container.put_archive("/", data)
    finally:
        container.remove(force=True)
    print(f"filled home volume {home['name']}", file=sys.stderr)


def _report(path: Path, manifest: dict, targets: Targets) -> None:
    databases = manifest["databases"]
    print(
        f"restored {path} (made {manifest['created']} on {manifest['host']} by fgpu-hub"
        f" {manifest['versions'].get('fgpu-hub')}): hub DB at {databases['hub']['revision']},"
        f" queue DB at {databases['queue']['revision']}"
    )
    for member, target in targets.files.items():
        if target.parent.name == ASIDE_DIR:
            print(f"kept for comparison, not installed: {target} ({member})")
        elif member.startswith("catalog/") and not os.environ.get("FGPU_CATALOG_PATH"):
            print(f"the catalog file is at {target}: set FGPU_CATALOG_PATH={target} for the hub")
    for line in archive.not_saved(manifest):
        print(line)
    print("start the hub again with the same command as before")
