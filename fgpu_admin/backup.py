"""Write one archive of the hub's state while it runs: its DBs, state files, catalog and config.

Run it in the hub's state directory (the directory the hub is started from). The hub DB and the
queue DB are copied consistently while the hub writes to them (SQLite's online backup; `pg_dump`
for PostgreSQL); the state files (cookie secrets, node agents' token, deployment id) keep their
modes and the archive itself is readable by its owner alone. Private images and home folders are
large: `--with-images` and `--with-homes` put them in (the Docker engine must answer); without
them the manifest lists them with their sizes and the command that saves them.

The archive is written aside and renamed when whole, so a failed backup (a full disk, say)
leaves no partial archive. Its path is the last line printed. `--keep-days N` then deletes the
archives of that folder that are older than N days.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import secrets
import shutil
import socket
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from queue_service.store import state_dir
from queue_service.store.db_upgrade import libpq_dsn
from queue_service.store.folder_files import archive_directory, tree_size

from . import archive, signing
from .archive import ArchiveError, Digest
from .cli import AdminError

BACKUP_DIR_ENV = "FGPU_BACKUP_DIR"
DEFAULT_BACKUP_DIR = "backups"
#: The service manager's environment file (`fgpu-hub install-service`): DB URLs, site settings.
SERVICE_ENV_FILE = Path("/etc/fgpu-hub/env")
#: The shipped config, beside the packages of this checkout.
PROJECT_CONFIG = Path(__file__).resolve().parent.parent / "jupyterhub_config.py"
#: An image every host has (the sessions' base); home volumes are read and written through a
#: container of it that is created and never started.
HELPER_IMAGE = "fgpu/jupyter-base:py3.11"
HOME_MOUNT = "/fgpu-home"
CHUNK = 1 << 20


def add_arguments(parser) -> None:
    parser.add_argument(
        "--output",
        metavar="FILE",
        help=f"the archive to write (default: ${BACKUP_DIR_ENV} or {DEFAULT_BACKUP_DIR}/"
        "fgpu-hub-backup-<time>.tar.gz in the state directory)",
    )
    parser.add_argument(
        "--with-images", action="store_true", help="include the private images (docker save)"
    )
    parser.add_argument(
        "--with-homes", action="store_true", help="include the home folders (volumes or folders)"
    )
    parser.add_argument(
        "--keep-days",
        type=_days,
        metavar="N",
        help="after the backup, delete this folder's archives older than N days",
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="FILE",
        help="another config file to keep in the archive (repeatable); the state directory's"
        f" *.py files and {SERVICE_ENV_FILE} are kept anyway",
    )
    parser.add_argument(
        "--sign",
        nargs="?",
        const="",
        metavar="KEY",
        help="sign the archive with the site's ed25519 key (KEY, else"
        f" ${signing.KEY_ENV}, else {signing.DEFAULT_KEY}); restore then checks it",
    )
    parser.add_argument(
        "--helper-image",
        default=HELPER_IMAGE,
        help=f"image whose (never started) container reads home volumes (default {HELPER_IMAGE})",
    )


def _days(text: str) -> int:
    import argparse

    try:
        days = int(text)
    except ValueError:
        days = -1
    if days < 0:
        raise argparse.ArgumentTypeError(f"a whole number of days >= 0, not {text!r}")
    return days


def run(args) -> int:
    state = Path.cwd()
    now = datetime.now(UTC)
    output = _output_path(args.output, state, now)
    hub_url, queue_url = state_dir.hub_db_url(), state_dir.queue_db_url()
    for what, url in (("hub", hub_url), ("queue", queue_url)):
        check_database(what, url)
    engine = engine_for(args) if (args.with_images or args.with_homes) else None
    args.signing_key = _signing_key(args.sign)
    written = write_archive(output, state, now, args, hub_url, queue_url, engine)
    for line in archive.not_saved(written):
        print(line)
    if args.keep_days is not None:
        for name in archive.expired(os.listdir(output.parent), now, args.keep_days):
            if name == output.name:
                continue
            try:
                (output.parent / name).unlink()
            except OSError as e:
                print(
                    f"warning: cannot delete {output.parent / name}: {e.strerror}", file=sys.stderr
                )
            else:
                print(f"deleted {output.parent / name} (older than {args.keep_days} days)")
    print(output)
    return 0


def _signing_key(option: str | None):
    """The key `--sign` names, read before anything is written; None without `--sign`."""
    if option is None:
        return None
    path = signing.site_key_path(option)
    if path is None:
        raise AdminError(
            f"--sign: no key at {signing.DEFAULT_KEY}; make one with "
            + signing.MAKE_KEY.format(path=signing.DEFAULT_KEY)
            + f", or name one (--sign FILE or ${signing.KEY_ENV})"
        )
    return signing.signing_key(path)


def _output_path(option: str | None, state: Path, now: datetime) -> Path:
    if option:
        output = Path(option).absolute()
        if output.is_dir():
            raise AdminError(f"--output {option} is a folder; name the archive file")
        return output
    folder = Path(os.environ.get(BACKUP_DIR_ENV) or state / DEFAULT_BACKUP_DIR).absolute()
    return folder / archive.archive_name(now)


# ---------------------------------------------------------------------------------------------
# Writing the archive: aside, then renamed.
# ---------------------------------------------------------------------------------------------


class ArchiveWriter:
    """A gzipped tar whose members are digested as they are written."""

    def __init__(self, fileobj):
        # Closed by close(), once the manifest is in.
        self.tar = tarfile.open(fileobj=fileobj, mode="w:gz", compresslevel=6)  # noqa: SIM115
        self.digests: dict[str, Digest] = {}
        self.modes: dict[str, int] = {}

    def add_file(self, member: str, path: Path, mode: int = 0o600) -> None:
        info = tarfile.TarInfo(archive.check_member_name(member))
        info.size, info.mode, info.mtime = path.stat().st_size, mode, int(path.stat().st_mtime)
        digest = Digest()
        with open(path, "rb") as file:
            self.tar.addfile(info, _Digesting(file, digest))
        self.digests[member], self.modes[member] = digest, mode

    def add_bytes(self, name: str, data: bytes) -> None:
        """A member the manifest does not list (the manifest itself)."""
        import io

        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o600
        info.mtime = int(datetime.now(UTC).timestamp())
        self.tar.addfile(info, io.BytesIO(data))

    def close(self) -> None:
        self.tar.close()


class _Digesting:
    """A file read through a Digest."""

    def __init__(self, file, digest: Digest):
        self.file, self.digest = file, digest

    def read(self, size: int = -1) -> bytes:
        chunk = self.file.read(size)
        self.digest.update(chunk)
        return chunk


def write_archive(output, state, now, args, hub_url, queue_url, engine) -> dict:
    partial = output.with_name(f".{output.name}.partial-{secrets.token_hex(4)}")
    try:
        output.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise ArchiveError(f"cannot write the archive in {output.parent}: {e.strerror}") from None
    try:
        with (
            os.fdopen(fd, "wb") as file,
            tempfile.TemporaryDirectory(dir=output.parent, prefix=".fgpu-backup-") as staging,
        ):
            writer = ArchiveWriter(file)
            manifest = _fill(writer, Path(staging), state, now, args, hub_url, queue_url, engine)
            manifest_data = archive.manifest_bytes(manifest)
            writer.add_bytes(archive.MANIFEST, manifest_data)
            if args.signing_key is not None:
                writer.add_bytes(signing.SIGNATURE, signing.sign(manifest_data, args.signing_key))
            writer.close()
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, output)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        if isinstance(e, AdminError):
            raise ArchiveError(f"backup failed, no archive written: {e}") from None
        if engine_error(e):
            raise ArchiveError(
                f"backup failed, no archive written: the Docker engine refused: {short_error(e)}"
            ) from None
        if isinstance(e, OSError):
            where = f" ({e.filename})" if e.filename else ""
            raise ArchiveError(
                f"backup failed, no archive written: {e.strerror or e}{where}"
            ) from None
        raise
    return manifest


def _fill(writer, staging, state, now, args, hub_url, queue_url, engine) -> dict:
    databases = {}
    for what, url in (("hub", hub_url), ("queue", queue_url)):
        databases[what] = dump_database(what, url, staging)
        # A SQLite file keeps its mode (it holds the hub's hashed tokens); a dump is private.
        source = sqlite_file(url)
        mode = source.stat().st_mode & 0o777 if source is not None else 0o600
        member = databases[what]["member"]
        writer.add_file(member, staging / Path(member).name, mode)
    files = list(_add_files(writer, state, args.config))
    users = [row[0] for row in query(databases["hub"], hub_url, staging, "SELECT name FROM users")]
    # Here, not at the top: it brings the Docker client, which `fgpu-hub --help` does not need.
    from queue_service.private_images import in_private_repository

    catalog = query(databases["queue"], queue_url, staging, "SELECT image FROM images")
    private = sorted({image for (image,) in catalog if in_private_repository(image)})
    images = list(_images(writer, staging, private, engine, args.with_images))
    homes = list(_homes(writer, staging, users, engine, args))
    live = "SELECT id, owner, name, size_bytes FROM folders WHERE deleted IS NULL ORDER BY id"
    folders = list(
        _folders(writer, staging, query(databases["queue"], queue_url, staging, live), args)
    )
    versions = {
        "fgpu-hub": _version("fgpu-hub"),
        "jupyterhub": _version("jupyterhub"),
        "python": sys.version.split()[0],
    }
    return archive.build_manifest(
        created=now,
        host=socket.gethostname(),
        state_dir=str(state),
        versions=versions,
        databases=databases,
        members=writer.digests,
        modes=writer.modes,
        files=files,
        images=images,
        homes=homes,
        folders=folders,
    )


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _add_files(writer, state: Path, extra_configs: Iterable[str]) -> Iterator[dict]:
    for state_file in state_dir.STATE_FILES:
        path = state / state_file.name
        if path.is_file():
            member = f"state/{state_file.name}"
            writer.add_file(member, path, path.stat().st_mode & 0o777)
            yield {"member": member, "kind": "state", "restore_to": state_file.name}
        else:
            print(f"note: no {state_file.name} ({state_file.what}) here", file=sys.stderr)
    catalog = os.environ.get("FGPU_CATALOG_PATH")
    if catalog and Path(catalog).is_file():
        writer.add_file("catalog/catalog.yaml", Path(catalog), Path(catalog).stat().st_mode & 0o777)
        yield {"member": "catalog/catalog.yaml", "kind": "catalog", "source": catalog}
    # The site's config files beside the state (a file that loads jupyterhub_config.py).
    for path in sorted(state.glob("*.py")):
        if path.resolve() == PROJECT_CONFIG:  # a hub started from the checkout itself
            continue
        member = f"config/site/{path.name}"
        writer.add_file(member, path, path.stat().st_mode & 0o777)
        yield {"member": member, "kind": "site-config", "restore_to": path.name}
    others = [PROJECT_CONFIG, SERVICE_ENV_FILE, *map(Path, extra_configs)]
    for index, path in enumerate(others):
        if index >= 2 and not path.is_file():
            raise AdminError(f"--config {path}: no such file")
        if path.is_file():
            member = f"config/other/{index}-{path.name}"
            writer.add_file(member, path, path.stat().st_mode & 0o777)
            yield {"member": member, "kind": "config", "source": str(path.absolute())}


# ---------------------------------------------------------------------------------------------
# The databases.
# ---------------------------------------------------------------------------------------------


def make_url(url: str):
    # Here, not at the top: SQLAlchemy takes a third of a second to import.
    from sqlalchemy.engine import make_url as parse

    return parse(url)


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (relative to the state directory), or None for PostgreSQL."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise AdminError(f"{url} is an in-memory database: nothing to back up or restore")
        return Path(parsed.database).absolute()
    if backend == "postgresql":
        return None
    raise AdminError(f"{url}: only SQLite and PostgreSQL databases are supported")


def check_database(what: str, url: str) -> None:
    path = sqlite_file(url)
    if path is not None and not path.is_file():
        raise AdminError(
            f"no {what} database at {path}: run fgpu-hub backup in the hub's state directory"
            " (where the hub is started)"
        )
    if path is None:
        need_program("pg_dump")
        need_program("psql")


def need_program(program: str) -> None:
    if shutil.which(program) is None:
        raise AdminError(f"{program} is not installed: apt-get install postgresql-client")


def libpq(url: str) -> tuple[str, dict]:
    """A PostgreSQL URL as a libpq connection URI and environment: the password goes in the
    environment, never on a command line that `ps` shows."""
    parsed = make_url(url)
    env = {**os.environ}
    if parsed.password is not None:
        env["PGPASSWORD"] = str(parsed.password)
    return libpq_dsn(parsed), env


def psql(url: str, *args: str, stdin=None) -> str:
    uri, env = libpq(url)
    done = subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", *args, uri],
        env=env,
        stdin=stdin,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise AdminError(f"psql on {make_url(url)!r} failed: {_last_line(done.stderr)}")
    return done.stdout


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def dump_database(what: str, url: str, staging: Path) -> dict:
    """A consistent copy of one DB in `staging`, and its manifest entry (kind, member, revision)."""
    path = sqlite_file(url)
    if path is not None:
        member = f"db/{what}.sqlite"
        copy = staging / f"{what}.sqlite"
        copy_sqlite(path, copy)
        return {"kind": "sqlite", "member": member, "revision": sqlite_revision(copy)}
    member = f"db/{what}.sql"
    before = pg_revision(url)
    uri, env = libpq(url)
    dumped = subprocess.run(
        ["pg_dump", "--no-owner", "--no-privileges", "--format=plain"]
        + ["--file", str(staging / f"{what}.sql"), uri],
        env=env,
        capture_output=True,
        text=True,
    )
    if dumped.returncode != 0:
        raise AdminError(f"pg_dump of the {what} database failed: {_last_line(dumped.stderr)}")
    if pg_revision(url) != before:
        raise AdminError(f"the {what} database was migrated during the backup; run it again")
    return {"kind": "postgresql", "member": member, "revision": before}


def copy_sqlite(source: Path, copy: Path) -> None:
    """SQLite's online backup: one consistent snapshot while the hub goes on writing (WAL), made
    a self-contained file (no -wal beside it) and checked."""
    src = sqlite3.connect(source, timeout=30)
    dst = sqlite3.connect(copy)
    try:
        with dst:
            src.backup(dst)
        dst.execute("PRAGMA journal_mode=DELETE")
        (check,) = dst.execute("PRAGMA quick_check").fetchone()
        if check != "ok":
            raise AdminError(f"{source} is damaged (SQLite quick_check: {check})")
    except sqlite3.DatabaseError as e:
        raise AdminError(f"cannot copy {source}: {e}") from None
    finally:
        src.close()
        dst.close()


def sqlite_revision(path: Path) -> str | None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        try:
            row = db.execute("SELECT version_num FROM alembic_version").fetchone()
        except sqlite3.DatabaseError:
            return None
    return row[0] if row else None


def pg_revision(url: str) -> str | None:
    text = psql(url, "-At", "-c", "SELECT version_num FROM alembic_version")
    return text.strip() or None


def query(database: dict, url: str, staging: Path, sql: str) -> list[tuple]:
    """Rows of `sql` on the copy of a SQLite DB, or on a PostgreSQL DB (tab-separated by psql)."""
    if database["kind"] == "sqlite":
        with contextlib.closing(sqlite3.connect(staging / Path(database["member"]).name)) as db:
            return db.execute(sql).fetchall()
    lines = psql(url, "-At", "-F", "\t", "-c", sql).splitlines()
    return [tuple(line.split("\t")) for line in lines if line]


# ---------------------------------------------------------------------------------------------
# Private images and home folders: in the archive when asked, else listed.
# ---------------------------------------------------------------------------------------------


def engine_for(args):
    """The Docker engine, or an AdminError before anything is written: the images and homes
    asked for cannot be saved without it."""
    from fgpu_shared.engine_client import docker_client_from_env

    try:
        client = docker_client_from_env(timeout=300)
        client.ping()
    except Exception as e:
        wanted = " and ".join(
            option
            for option, on in (
                ("--with-images", args.with_images),
                ("--with-homes", args.with_homes),
            )
            if on
        )
        raise AdminError(
            f"the Docker engine does not answer ({short_error(e)}); {wanted} needs it"
        ) from None
    return client


def engine_error(error: BaseException) -> bool:
    import docker.errors

    return isinstance(error, docker.errors.DockerException)


def short_error(error: Exception) -> str:
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text[:200]


def _quiet_engine():
    """The engine for sizes alone: None (sizes unknown) when it does not answer."""
    from fgpu_shared.engine_client import docker_client_from_env

    try:
        client = docker_client_from_env(timeout=30)
        client.ping()
        return client
    except Exception as e:
        print(
            f"note: no Docker engine ({short_error(e)}); sizes of images and homes unknown",
            file=sys.stderr,
        )
        return None


def _images(writer, staging: Path, references, engine, include: bool) -> Iterator[dict]:
    client = engine if engine is not None else (_quiet_engine() if references else None)
    for reference in references:
        name = reference.split("/", 1)[1].replace(":", "-").replace("/", "-")
        entry = {"name": reference, "size": None, "member": None}
        entry["save_command"] = f"docker save -o {name}.tar {reference}"
        image = _image(client, reference)
        if image is None:
            print(f"note: private image {reference} is not on the engine", file=sys.stderr)
            yield {**entry, "missing": True}
            continue
        entry["size"] = image.attrs.get("Size")
        if include:
            member = f"images/{name}.tar"
            spool = staging / "image.tar"
            _spool(image.save(named=True), spool)
            writer.add_file(member, spool)
            spool.unlink()
            entry["member"] = member
        yield entry


def _image(client, reference: str):
    import docker.errors

    if client is None:
        return None
    try:
        return client.images.get(reference)
    except docker.errors.NotFound:
        return None


def _spool(chunks, path: Path) -> None:
    with open(path, "wb") as file:
        for chunk in chunks:
            file.write(chunk)


def _homes(writer, staging: Path, users, engine, args) -> Iterator[dict]:
    root = os.environ.get("FGPU_SWARM_HOME_ROOT")
    if root:
        yield from _home_folders(writer, staging, Path(root), args.with_homes)
        return
    client = engine if engine is not None else _quiet_engine()
    if client is None:
        return
    volumes = client.volumes.list(filters={"label": "fgpu.volume=home"})
    ours = sorted(
        (v for v in volumes if (v.attrs.get("Labels") or {}).get("fgpu.user") in set(users)),
        key=lambda v: v.name,
    )
    sizes = _volume_sizes(client) if ours else {}
    for volume in ours:
        entry = {
            "name": volume.name,
            "kind": "volume",
            "user": volume.attrs["Labels"]["fgpu.user"],
            "labels": volume.attrs.get("Labels") or {},
            "size": sizes.get(volume.name),
            "member": None,
            "save_command": (
                f'docker run --rm --user 0 -v {volume.name}:/data:ro -v "$PWD":/backup'
                f" {args.helper_image} tar czf /backup/{volume.name}.tar.gz -C /data ."
            ),
        }
        if args.with_homes:
            entry["member"] = f"homes/{volume.name}.tar"
            spool = staging / "home.tar"
            _spool(_volume_tar(client, volume.name, args.helper_image), spool)
            writer.add_file(entry["member"], spool)
            spool.unlink()
        yield entry


def _volume_sizes(client) -> dict[str, int]:
    try:
        return {
            v["Name"]: (v.get("UsageData") or {}).get("Size")
            for v in client.df().get("Volumes") or []
        }
    except Exception:
        return {}


def _volume_tar(client, volume: str, helper_image: str) -> Iterator[bytes]:
    """The volume's files as a tar (owners and modes kept), read through a container that is
    created with it mounted and never started."""
    container = client.containers.create(
        helper_image,
        command=["true"],
        volumes={volume: {"bind": HOME_MOUNT, "mode": "ro"}},
        labels={"fgpu.backup": "1"},
    )
    try:
        stream, _ = container.get_archive(HOME_MOUNT)
        yield from stream
    finally:
        container.remove(force=True)


def _home_folders(writer, staging, root: Path, include: bool) -> Iterator[dict]:
    """Swarm's shared home root: one folder per user."""
    # `.folders` (storage folders) and other dot-directories are no one's home.
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        entry = {
            "name": str(folder),
            "kind": "folder",
            "size": tree_size(folder),
            "member": None,
            "save_command": f"tar czf {folder.name}-home.tar.gz -C {root} {folder.name}",
        }
        if include:
            entry["member"] = f"homes/{folder.name}.tar"
            spool = staging / "home.tar"
            with tarfile.open(spool, "w", format=tarfile.PAX_FORMAT) as tar:
                _note_left_out(archive_directory(folder, tar), f"the home of {folder.name}")
            writer.add_file(entry["member"], spool)
            spool.unlink()
        yield entry


def _note_left_out(left_out: list[str], label: str) -> None:
    for path in left_out:
        print(f"note: left out {path} ({label}): not a file or folder", file=sys.stderr)


def _folders(writer, staging: Path, rows, args) -> Iterator[dict]:
    """The storage folders' files (the live ones: a removed folder's trash is not kept)."""
    from queue_service.store.folder_files import FolderFiles

    root = Path(state_dir.folders_root()).absolute()
    files = FolderFiles(root)
    for folder_id, owner, name, size in rows:
        entry = {
            "name": folder_id,
            "label": f"storage folder {name} of {owner}",
            "size": int(size or 0),
            "member": None,
            "save_command": f"tar czf {folder_id}.tar.gz -C {root} {folder_id}",
        }
        if not (root / folder_id).is_dir():
            print(f"note: {entry['label']} has no files at {root / folder_id}", file=sys.stderr)
            continue
        if args.with_homes:
            entry["member"] = f"folders/{folder_id}.tar"
            spool = staging / "folder.tar"
            with tarfile.open(spool, "w", format=tarfile.PAX_FORMAT) as tar:
                _note_left_out(files.archive(folder_id, tar), entry["label"])
            writer.add_file(entry["member"], spool)
            spool.unlink()
        yield entry
