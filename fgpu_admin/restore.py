"""Put a backup archive's state back into the current directory; the hub then starts as before.

The whole archive is read and checked first: every member against the manifest's checksum, and
both databases' schema revisions against the migrations this install knows (an archive from a
newer version is refused), and its signature when the site has a backup key (fgpu_admin/
signing.py). The layers inside are checked too, before anything is asked or changed: a home tar
may hold only files and folders of its own folder, owned by the session user once restored
(home_tar.py), and so may a storage folder's, which is unpacked aside and renamed into place;
an image tar may name only the private image the manifest lists (image_tar.py);
a PostgreSQL dump reaches psql with its backslash commands locked (sql_dump.py).
Everything goes only where this site's config says (the state directory, FGPU_CATALOG_PATH,
FGPU_SWARM_HOME_ROOT, home volumes, the folders root), never where the archive says. Existing
state here (a database, a state file, a home, a storage folder, a private image) is overwritten
only after a yes: asked on a terminal, `--yes` otherwise. Site config files (`*.py`, code the hub runs) are asked about on
their own, `--install-config` otherwise. The hub must be stopped.

Then: private images are loaded, home and storage folders filled (when the archive holds them), the
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
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zlib
from pathlib import Path

from queue_service.store import state_dir

from . import archive, home_tar, image_tar, signing, sql_dump
from .archive import ArchiveError, Digest
from .backup import (
    HOME_MOUNT,
    PROJECT_CONFIG,
    copy_sqlite,
    engine_error,
    engine_for,
    make_url,
    need_program,
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
        "--yes",
        action="store_true",
        help="overwrite existing state (databases, state files, homes, private images) here"
        " without asking",
    )
    parser.add_argument(
        "--install-config",
        action="store_true",
        help="install the archive's site config files (*.py: code the hub runs) without asking;"
        " --yes does not do this",
    )
    parser.add_argument(
        "--key",
        metavar="FILE",
        help=f"the site's backup key, to check the archive's signature with (default:"
        f" ${signing.KEY_ENV}, else {signing.DEFAULT_KEY} when it exists)",
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
    key_path = signing.site_key_path(args.key)
    manifest = read_checked(path, key_path)
    archive.check_revisions(manifest, known_revisions())
    refuse_if_hub_runs(state)
    targets = Targets(manifest, state)
    engine = engine_for(_EngineWanted(manifest)) if any(archive.engine_parts(manifest)) else None
    with tempfile.TemporaryDirectory(dir=state, prefix=".fgpu-restore-") as staging:
        replaced_images = unpack_checked(path, manifest, Path(staging), engine)
        ask_first(targets, engine, replaced_images, args)
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


def unpack_checked(path: Path, manifest: dict, staging: Path, engine) -> list[str]:
    """The archive unpacked in `staging`, its inner tars and dumps checked whole before anything
    is asked or changed; the private images a load would replace."""
    try:
        extract(path, manifest, staging)
        replaced_images = check_engine_parts(manifest, staging, engine)
        check_folders(manifest, staging)
        lock_dumps(manifest, staging)
    except OSError as e:  # a full disk, say
        raise AdminError(
            f"cannot unpack the archive here ({e.strerror or e}); nothing changed"
        ) from None
    return replaced_images


def ask_first(targets: Targets, engine, replaced_images: list[str], args) -> None:
    """What would be overwritten (`--yes`), then the site config code (`--install-config`)."""
    existing = targets.existing(engine) + replaced_images
    if existing:
        _confirm(existing, args.yes)
    config = targets.config_to_install()
    if config:
        _confirm_config(config, args.install_config, Path(args.file))


def read_checked(path: Path, key_path: Path | None = None) -> dict:
    """The archive's manifest, once every member was read whole and matched its checksum, and
    its signature matched the site's key (when the site has one)."""
    key = signing.verify_key(key_path) if key_path else None
    seen: dict[str, tuple[str, int]] = {}
    manifest_data = signature_data = None
    for member, chunks in _members(path):
        if member.name == archive.MANIFEST:
            manifest_data = b"".join(chunks)
            continue
        if member.name == signing.SIGNATURE:
            signature_data = b"".join(chunks)
            continue
        digest = Digest()
        for chunk in chunks:
            digest.update(chunk)
        seen[member.name] = (digest.sha256, digest.size)
    if manifest_data is None:
        raise ArchiveError(f"{path} has no manifest: it is truncated or not an fgpu-hub backup")
    try:
        signing.check(manifest_data, signature_data, key, key_path)
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
        "queue": _revisions(queue_package / "store" / "migrations" / "versions"),
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
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if Path(cwd) == state and runs_hub(argv):
            command = " ".join(argv).strip()
            raise AdminError(
                f"a hub runs from this directory (process {proc.name}: {command[:80]});"
                " stop it before restoring"
            )


def runs_hub(argv: list[str]) -> bool:
    """Whether a command line runs JupyterHub (its program, wherever installed) or the queue
    service (`-m queue_service`): a word of an argument is not enough (a test run names
    tests/test_queue_service.py, and was taken for a hub)."""
    if "jupyterhub" in (os.path.basename(arg) for arg in argv):
        return True
    return any(
        arg == "-m" and nxt == "queue_service" for arg, nxt in zip(argv, argv[1:], strict=False)
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
        self.site_config: list[str] = []
        for entry in manifest["files"]:
            if _same_as_installed(entry, manifest):
                continue
            target = self._file_target(entry)
            if entry.get("kind") == "site-config" and _same_file(target, entry, manifest):
                continue
            self.files[entry["member"]] = target
            if entry.get("kind") == "site-config":
                self.site_config.append(entry["member"])
        _, homes = archive.engine_parts(manifest)
        # Refused here, before anything is read further: a home that would go elsewhere.
        self.homes = {home["member"]: home_target(home) for home in homes}
        # Where this site's service keeps storage folders, never where the archive says.
        self.folders_root = Path(state_dir.folders_root()).absolute()
        self.folders = archive.saved_folders(manifest)

    def _file_target(self, entry: dict) -> Path:
        kind = entry.get("kind")
        if kind in ("state", "site-config"):
            return self.state / archive.file_name(entry, STATE_FILE_NAMES)
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
        for member, target in self.files.items():
            if member in self.site_config:
                continue  # asked on its own: config_to_install
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
            if home.get("kind") == "volume" and _home_volume_exists(engine, home["name"]):
                found.append(f"home volume {home['name']}")
            elif home.get("kind") == "folder" and self.homes[home["member"]].exists():
                found.append(f"home folder {self.homes[home['member']]}")
        for folder in self.folders:
            if os.path.lexists(self.folders_root / folder["name"]):
                found.append(f"storage folder {folder['name']}")
        return found

    def config_to_install(self) -> list[str]:
        """The site config files (code the hub runs) the restore would install, each with
        whether it replaces one here."""
        listed = []
        for member in self.site_config:
            target = self.files[member]
            listed.append(
                f"{target.name} ({'replaces the one here' if target.exists() else 'new'})"
            )
        return listed


#: The only names a state file of the archive may be restored under.
STATE_FILE_NAMES = frozenset(f.name for f in state_dir.STATE_FILES)


def _same_file(target: Path, entry: dict, manifest: dict) -> bool:
    """A config file here with the archived content: nothing to install, nothing to ask."""
    if not target.is_file():
        return False
    digest = Digest()
    digest.update(target.read_bytes())
    return digest.sha256 == manifest["members"][entry["member"]]["sha256"]


def home_target(home: dict) -> Path:
    """Where a home goes back: a folder under this site's FGPU_SWARM_HOME_ROOT, never a root the
    archive names; a volume by its (checked) name."""
    if home.get("kind") == "folder":
        return archive.home_folder(home, os.environ.get("FGPU_SWARM_HOME_ROOT"))
    if home.get("kind") == "volume":
        return Path(archive.check_volume_name(home["name"]))
    raise ArchiveError(f"it holds home {home.get('name')!r} of unknown kind {home.get('kind')!r}")


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


def _home_volume_exists(engine, name: str) -> bool:
    """Whether the engine has the volume; one that is not a home volume (a group's data, say)
    is never written into."""
    import docker.errors

    try:
        volume = engine.volumes.get(name)
    except docker.errors.NotFound:
        return False
    if (volume.attrs.get("Labels") or {}).get(HOME_LABEL) != "home":
        raise ArchiveError(
            f"it would fill volume {name}, which is not a home volume here; nothing restored"
        )
    return True


#: The label every home volume carries (fgpu_spawner/storage.py), and a restored one gets.
HOME_LABEL = "fgpu.volume"


def _confirm(existing: list[str], yes: bool) -> None:
    listed = ", ".join(existing[:6]) + (
        f" and {len(existing) - 6} more" if len(existing) > 6 else ""
    )
    _ask(
        yes,
        f"overwriting {listed}",
        f"this directory already holds a hub's state ({listed}); run again with --yes to overwrite it",
        f"Overwrite {listed}? [y/N] ",
    )


def _confirm_config(config: list[str], install: bool, path: Path) -> None:
    """Site config files are code the hub runs: installed only when the admin says so, apart
    from --yes."""
    listed = ", ".join(config)
    _ask(
        install,
        f"installing site config {listed}",
        f"the archive holds site config files, code the hub runs: {listed}; read them"
        f" (tar xzf {path} config/site) and run again with --install-config to install them",
        f"Install site config {listed} (code the hub runs)? [y/N] ",
    )


def _ask(given: bool, saying: str, without_terminal: str, question: str) -> None:
    """Go on when the flag gave the answer (saying so), or when the admin says yes on a
    terminal; refuse otherwise (without a terminal, with what to run instead)."""
    if given:
        print(saying, file=sys.stderr)
        return
    if not sys.stdin.isatty():
        raise AdminError(without_terminal)
    if input(question).strip().lower() not in ("y", "yes"):
        raise AdminError("nothing restored")


# ---------------------------------------------------------------------------------------------
# Extracting and putting in place.
# ---------------------------------------------------------------------------------------------


def extract(path: Path, manifest: dict, staging: Path) -> None:
    """Every listed member into `staging`, checked again as it is written (the file may have
    changed since it was read)."""
    for member, chunks in _members(path):
        if member.name in (archive.MANIFEST, signing.SIGNATURE):
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
    for folder in targets.folders:
        _restore_folder(folder, _safe(staging / folder["member"]), targets.folders_root)
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


def check_engine_parts(manifest: dict, staging: Path, engine) -> list[str]:
    """Check the images' and homes' inner tars (nothing loaded, nothing written outside
    `staging`); each home gets a checked copy with the session user as owner (`SAFE_SUFFIX`).
    Returns the private images the load would replace on the engine, for the question."""
    from queue_service.private_images import in_private_repository

    images, homes = archive.engine_parts(manifest)
    replaced = []
    for image in images:
        staged = staging / image["member"]
        image_tar.check_names(
            image_tar.names_in(staged), image["name"], in_private_repository(image["name"])
        )
        if _other_image_there(engine, image["name"], image_tar.image_id(staged)):
            replaced.append(f"image {image['name']}")
    for home in homes:
        staged = staging / home["member"]
        top = Path(HOME_MOUNT).name if home["kind"] == "volume" else home_target(home).name
        _note_links(home_tar.safe_copy(staged, _safe(staged), top, home["name"]), home["name"])
        if home["kind"] == "folder":
            _check_folder_destination(_safe(staged), home_target(home).parent)
    return replaced


def check_folders(manifest: dict, staging: Path) -> None:
    """Each storage folder's tar checked as a home's is (its own files and folders only), and
    copied with the session user as owner."""
    for folder in archive.saved_folders(manifest):
        staged = staging / folder["member"]
        skipped = home_tar.safe_copy(
            staged, _safe(staged), folder["name"], folder["name"], "storage folder"
        )
        _note_links(skipped, f"storage folder {folder.get('label') or folder['name']}")


def _note_links(skipped: list[str], what: str) -> None:
    for member in skipped:
        print(f"note: left out {member} of {what}: links are not restored", file=sys.stderr)


SAFE_SUFFIX = ".checked"


def _safe(staged: Path) -> Path:
    return staged.with_name(staged.name + SAFE_SUFFIX)


def _other_image_there(engine, name: str, image_id: str | None) -> bool:
    import docker.errors

    try:
        return engine.images.get(name).id != image_id
    except docker.errors.ImageNotFound:
        return False


def _check_folder_destination(checked: Path, root: Path) -> None:
    """Every member against the folder as it is now: a link a user made in their home (work ->
    /etc) would make a file of the archive land outside the root. Refused before any is written."""
    with tarfile.open(checked) as tar:
        for member in tar:
            try:
                tarfile.data_filter(member, str(root))
            except tarfile.FilterError as e:
                raise ArchiveError(
                    f"home {member.name.split('/')[0]}: {e}; nothing restored"
                ) from None


def _restore_engine_parts(manifest: dict, staging: Path, engine, helper_image: str) -> None:
    images, homes = archive.engine_parts(manifest)
    for image in images:
        with open(staging / image["member"], "rb") as file:
            engine.images.load(file)
        print(f"loaded {image['name']}", file=sys.stderr)
    for home in homes:
        _restore_home(engine, home, _safe(staging / home["member"]), helper_image)


def lock_dumps(manifest: dict, staging: Path) -> None:
    """Each PostgreSQL dump's copy for psql, its backslash commands locked (sql_dump.py)."""
    key = secrets.token_hex(16)
    for database in manifest["databases"].values():
        if database.get("kind") == "postgresql":
            _need_psql_lock()
            staged = staging / database["member"]
            sql_dump.locked_copy(staged, _locked(staged), key, database["member"])


def _need_psql_lock() -> None:
    need_program("psql")
    version = subprocess.run(["psql", "--version"], capture_output=True, text=True).stdout
    if not sql_dump.knows_restrict(version):
        raise AdminError(
            f"{version.strip() or 'psql'} cannot lock a dump's backslash commands (\\restrict:"
            " 13.22, 14.19, 15.14, 16.10, 17.6 and later): update postgresql-client; nothing changed"
        )


def _locked(staged: Path) -> Path:
    return staged.with_name(staged.name + ".locked")


def _restore_database(url: str, staged: Path, mode: int) -> None:
    path = sqlite_file(url)
    if path is None:
        with open(_locked(staged), "rb") as dump:
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


def _restore_home(engine, home: dict, checked: Path, helper_image: str) -> None:
    """One home from its checked copy (`check_engine_parts`)."""
    if home.get("kind") == "folder":
        owner = home_tar.session_owner()
        with tarfile.open(checked) as tar:
            tar.extractall(
                home_target(home).parent,
                numeric_owner=True,
                filter=lambda member, root: _as_session_user(member, root, owner),
            )
        return
    labels = {**(home.get("labels") or {}), HOME_LABEL: "home"}
    with contextlib.suppress(Exception):
        engine.volumes.create(home["name"], labels=labels)
    container = engine.containers.create(
        helper_image,
        command=["true"],
        volumes={home["name"]: {"bind": HOME_MOUNT, "mode": "rw"}},
        labels={"fgpu.restore": "1"},
    )
    try:
        with open(checked, "rb") as data:
            container.put_archive("/", data)
    finally:
        container.remove(force=True)
    print(f"filled home volume {home['name']}", file=sys.stderr)


def _restore_folder(folder: dict, checked: Path, root: Path) -> None:
    """One storage folder, unpacked in a new directory of the root that no session mounts, then
    renamed into place: nothing is written through a folder as it is now (a link a session made
    there, say). A folder of that id already here goes to the trash, kept for the grace period."""
    from queue_service.store.folder_files import FolderFiles

    root.mkdir(parents=True, exist_ok=True)
    aside = Path(tempfile.mkdtemp(dir=root, prefix=".restoring-"))
    owner = home_tar.session_owner()
    try:
        with tarfile.open(checked) as tar:
            tar.extractall(
                aside,
                numeric_owner=True,
                filter=lambda member, where: _as_session_user(member, where, owner),
            )
        if os.path.lexists(root / folder["name"]):
            kept = FolderFiles(root).trash(folder["name"])
            print(f"storage folder {folder['name']} here kept as .trash/{kept}", file=sys.stderr)
        os.rename(aside / folder["name"], root / folder["name"])
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    print(f"filled storage folder {folder.get('label') or folder['name']}", file=sys.stderr)


def _as_session_user(member: tarfile.TarInfo, root: str, owner: tuple[int, int]):
    """tarfile's own checks for data (no link or file outside `root`), then the owner."""
    uid, gid = owner
    member = tarfile.data_filter(member, root)
    return member.replace(uid=uid, gid=gid, uname="", gname="", deep=False)


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
