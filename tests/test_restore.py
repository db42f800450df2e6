"""`fgpu-hub restore` (fgpu_admin/restore.py) on real SQLite and real PostgreSQL databases: a
round trip, and every archive it must refuse without changing anything."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import pty
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import docker.errors
import pytest
from sqlalchemy import create_engine, text

from fgpu_admin import archive
from fgpu_admin.cli import main
from fgpu_admin.restore import runs_hub
from queue_service.store import state_dir
from queue_service.store.db import open_database
from queue_service.store.models import FolderRecord

from .harness import VENV_BIN
from .hub_state import (
    EDITED_IMAGE,
    GROUP,
    GROUP_QUOTA,
    file_modes,
    fill_home_volume,
    hub_db_rows,
    make_hub_state,
    queue_db_rows,
)

pytestmark = [pytest.mark.docker]


@pytest.fixture
def backed_up(tmp_path, monkeypatch, hub_dbs, capsys):
    """A hub's state (both DBs, state files, a site config), its archive, and what it held."""
    folder = tmp_path / "hub"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.delenv("FGPU_CATALOG_PATH", raising=False)
    monkeypatch.setenv("FGPU_BACKUP_DIR", str(tmp_path / "backups"))
    made = make_hub_state(folder, *hub_dbs)
    (folder / "site_config.py").write_text('load_subconfig("jupyterhub_config.py")\n')
    assert main(["backup"]) == 0
    path = Path(capsys.readouterr().out.strip().splitlines()[-1])
    before = {
        "hub": hub_db_rows(hub_dbs[0]),
        "queue": queue_db_rows(hub_dbs[1]),
        "modes": file_modes(folder),
    }
    capsys.readouterr()  # the models' migration logs
    return folder, path, made, before


def restore(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["restore", *args])
    out, err = capsys.readouterr()
    return code, out, err


def wipe(folder: Path, hub_dbs: tuple[str, str]) -> None:
    """A broken machine: the state directory emptied and the PostgreSQL databases too."""
    for path in folder.iterdir():
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    for url in hub_dbs:
        if url.startswith("postgresql"):
            engine = create_engine(url)
            with engine.begin() as db:
                db.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
            engine.dispose()


def snapshot(folder: Path, hub_dbs) -> dict:
    """Everything a refused restore must leave as it was."""
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    rows = {}
    for url in hub_dbs:
        if url.startswith("postgresql"):
            engine = create_engine(url)
            with engine.connect() as db:
                tables = db.execute(
                    text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
                ).all()
                rows[url] = {
                    t: db.execute(text(f'SELECT count(*) FROM "{t}"')).scalar() for (t,) in tables
                }
            engine.dispose()
    return {"files": files, "rows": rows}


def test_a_restore_brings_back_databases_state_files_and_config(backed_up, capsys, hub_dbs):
    folder, path, made, before = backed_up
    wipe(folder, hub_dbs)
    # The site config is code the hub runs: installed when asked for (test_security_restore).
    code, out, err = restore(capsys, str(path), "--install-config")
    assert code == 0, err
    assert hub_db_rows(hub_dbs[0]) == before["hub"]
    assert hub_db_rows(hub_dbs[0])["groups"][GROUP] == {"fgpu_quota": GROUP_QUOTA}
    assert queue_db_rows(hub_dbs[1]) == before["queue"]
    assert EDITED_IMAGE in before["queue"]["images"]
    assert len(before["queue"]["sessions"]) == len(made["sessions"]) == 5
    for name, content in made["files"].items():
        assert (folder / name).read_text() == content
    assert file_modes(folder) == before["modes"]
    assert file_modes(folder)["jupyterhub_cookie_secret"] == 0o600
    assert (folder / "site_config.py").read_text().startswith("load_subconfig")
    assert "start the hub again with the same command" in out
    assert not [p for p in folder.iterdir() if p.name.startswith(".fgpu-restore")]


def test_the_old_database_leaves_nothing_in_the_restored_one(backed_up, capsys, hub_dbs):
    folder, path, _, before = backed_up
    if hub_dbs[1].startswith("sqlite"):
        # The file is replaced whole; a WAL left by the old one must not be replayed into it.
        db = sqlite3.connect(folder / "fgpu_queue.sqlite")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA wal_autocheckpoint=0")
        db.execute("DELETE FROM sessions")
        db.commit()
        stale = (folder / "fgpu_queue.sqlite-wal").read_bytes()
        db.close()
        (folder / "fgpu_queue.sqlite-wal").write_bytes(stale)
    else:
        # PostgreSQL is emptied first, in the transaction that loads the dump.
        engine = create_engine(hub_dbs[1])
        with engine.begin() as db:
            db.execute(text("CREATE TABLE leftover (x int)"))
            db.execute(text("DELETE FROM sessions"))
        engine.dispose()
    code, out, _ = restore(capsys, str(path), "--yes")
    assert code == 0, out
    assert queue_db_rows(hub_dbs[1]) == before["queue"]
    if hub_dbs[1].startswith("postgresql"):
        engine = create_engine(hub_dbs[1])
        with engine.connect() as db:
            assert db.execute(text("SELECT to_regclass('public.leftover')")).scalar() is None
        engine.dispose()


def test_existing_state_is_not_overwritten_without_yes(backed_up, hub_dbs):
    folder, path, _, _ = backed_up
    before = snapshot(folder, hub_dbs)
    done = _cli(folder, "restore", str(path))  # stdin is no terminal
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: this directory already holds a hub's state (")
    assert line.endswith("run again with --yes to overwrite it")
    assert snapshot(folder, hub_dbs) == before


def _cli(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "fgpu-hub"), *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def refused(capsys, path: Path, folder: Path, hub_dbs, expected: str) -> None:
    """A restore of `path` exits 1 with one line saying `expected`, and changes nothing."""
    before = snapshot(folder, hub_dbs)
    code, out, err = restore(capsys, str(path), "--yes")
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    line = err.strip()
    assert line.startswith("error: ") and expected in line, line
    assert snapshot(folder, hub_dbs) == before


def test_a_truncated_archive_is_refused(backed_up, capsys, hub_dbs, tmp_path):
    folder, path, _, _ = backed_up
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])
    refused(capsys, cut, folder, hub_dbs, "is truncated or damaged")
    # Cut at a member boundary, the archive still lacks its manifest.
    data = gzip.decompress(path.read_bytes())
    head = tmp_path / "head.tar.gz"
    head.write_bytes(gzip.compress(data[:1024]))
    refused(capsys, head, folder, hub_dbs, "truncated or damaged")


def test_one_changed_byte_is_refused(backed_up, capsys, hub_dbs, tmp_path):
    folder, path, _, _ = backed_up
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    changed = tmp_path / "changed.tar.gz"
    changed.write_bytes(bytes(data))
    refused(capsys, changed, folder, hub_dbs, "truncated or damaged")
    # The same change inside a member of a well-formed archive: its checksum tells.
    repacked = tmp_path / "repacked.tar.gz"
    members = _read(path)
    secret = members["state/jupyterhub_cookie_secret"]
    members["state/jupyterhub_cookie_secret"] = bytes([secret[0] ^ 0x01]) + secret[1:]
    _write(repacked, members)
    refused(capsys, repacked, folder, hub_dbs, "state/jupyterhub_cookie_secret fails its checksum")


def _read(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def _write(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_an_archive_from_a_newer_schema_is_refused(tmp_path, monkeypatch, hub_dbs, capsys):
    folder = tmp_path / "hub"
    folder.mkdir()
    monkeypatch.chdir(folder)
    make_hub_state(folder, *hub_dbs)
    engine = create_engine(hub_dbs[1])
    with engine.begin() as db:  # as a newer fgpu-hub's migration leaves it
        db.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    engine.dispose()
    assert main(["backup", "--output", str(tmp_path / "newer.tar.gz")]) == 0
    capsys.readouterr()
    wipe(folder, hub_dbs)
    refused(
        capsys,
        tmp_path / "newer.tar.gz",
        folder,
        hub_dbs,
        "its queue database is at schema revision '0099', which this install does not know",
    )
    assert list(folder.iterdir()) == []


def test_a_running_hub_is_not_restored_over(backed_up, capsys, hub_dbs):
    folder, path, _, _ = backed_up
    hub = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "jupyterhub"], cwd=folder
    )
    try:
        refused(capsys, path, folder, hub_dbs, f"a hub runs from this directory (process {hub.pid}")
    finally:
        hub.kill()
        hub.wait()


@pytest.mark.parametrize(
    ("argv", "is_hub"),
    [
        (["/srv/venv/bin/python3", "/srv/venv/bin/jupyterhub", "-f", "config.py"], True),
        (["jupyterhub"], True),
        (["/usr/bin/python3", "-m", "queue_service", "--QueueService.engine_class=docker"], True),
        # A test run beside the hub's folder names its modules: not a hub.
        (
            [".venv/bin/pytest", "tests/test_queue_service.py", "tests/test_jupyterhub_config.py"],
            False,
        ),
        (["vim", "jupyterhub_config.py"], False),
        (["grep", "-r", "queue_service", "."], False),
    ],
)
def test_only_a_hub_or_its_queue_service_counts_as_a_running_hub(argv, is_hub):
    assert runs_hub(argv) is is_hub


def test_not_an_archive(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    code, _, err = restore(capsys, "notes.txt")
    assert code == 1 and "notes.txt is truncated or damaged" in err
    code, _, err = restore(capsys, "missing.tar.gz")
    assert code == 1 and err == "error: missing.tar.gz: no such archive\n"
    assert os.listdir(tmp_path) == ["notes.txt"]


def test_images_and_homes_come_back_and_need_the_engine(
    tmp_path, monkeypatch, capsys, private_image, docker_engine
):
    folder = tmp_path / "hub"
    folder.mkdir()
    monkeypatch.chdir(folder)
    for name in (state_dir.HUB_DB_ENV, state_dir.QUEUE_DB_ENV, "FGPU_CATALOG_PATH"):
        monkeypatch.delenv(name, raising=False)
    urls = (state_dir.DEFAULT_HUB_DB_URL, state_dir.DEFAULT_QUEUE_DB_URL)
    made = make_hub_state(folder, *urls, images=(private_image,))
    volume = fill_home_volume(docker_engine, made["users"][0])
    try:
        out = tmp_path / "full.tar.gz"
        assert main(["backup", "--with-images", "--with-homes", "--output", str(out)]) == 0
        capsys.readouterr()
        wipe(folder, urls)
        docker_engine.images.remove(private_image, force=True)
        docker_engine.volumes.get(volume).remove(force=True)

        # Without an engine the archive is refused whole.
        monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")
        refused(capsys, out, folder, urls, "the Docker engine does not answer (")
        assert list(folder.iterdir()) == []
        monkeypatch.delenv("DOCKER_HOST")

        code, _, err = restore(capsys, str(out))
        assert code == 0, err
        assert docker_engine.images.get(private_image)
        listing = docker_engine.containers.run(
            "fgpu/jupyter-base:py3.11",
            ["stat", "-c", "%u:%g %n", "/h/work/notes.ipynb"],
            volumes={volume: {"bind": "/h", "mode": "ro"}},
            remove=True,
        )
        assert listing.decode().strip() == "1000:100 /h/work/notes.ipynb"
        assert docker_engine.volumes.get(volume).attrs["Labels"]["fgpu.user"] == made["users"][0]
        assert json.loads(_read(out)[archive.MANIFEST])["images"][0]["member"]
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            docker_engine.volumes.get(volume).remove(force=True)


def test_the_known_revisions_are_alembics_own():
    """Read from the scripts' text (fast), they are what alembic itself finds."""
    import jupyterhub
    from alembic.script import ScriptDirectory

    from fgpu_admin.restore import known_revisions
    from queue_service.store.db import MIGRATIONS_DIR

    def walked(folder) -> set[str]:
        return {script.revision for script in ScriptDirectory(str(folder)).walk_revisions()}

    known = known_revisions()
    assert known["queue"] == walked(MIGRATIONS_DIR) and "0007" in known["queue"]
    assert known["hub"] == walked(Path(jupyterhub.__file__).with_name("alembic"))


def test_the_catalog_file_comes_back_where_the_hub_reads_it(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "hub"
    folder.mkdir()
    monkeypatch.chdir(folder)
    for name in (state_dir.HUB_DB_ENV, state_dir.QUEUE_DB_ENV):
        monkeypatch.delenv(name, raising=False)
    catalog = tmp_path / "site" / "catalog.yaml"
    catalog.parent.mkdir()
    catalog.write_text("images: []\n")
    monkeypatch.setenv("FGPU_CATALOG_PATH", str(catalog))
    make_hub_state(folder, state_dir.DEFAULT_HUB_DB_URL, state_dir.DEFAULT_QUEUE_DB_URL)
    assert main(["backup", "--output", str(tmp_path / "hub.tar.gz")]) == 0
    wipe(folder, ())
    catalog.unlink()
    capsys.readouterr()
    code, _, err = restore(capsys, str(tmp_path / "hub.tar.gz"))
    assert code == 0, err
    assert catalog.read_text() == "images: []\n"
    # Where no catalog is configured, it is put beside the state, for FGPU_CATALOG_PATH to name.
    monkeypatch.delenv("FGPU_CATALOG_PATH")
    code, out, err = restore(capsys, str(tmp_path / "hub.tar.gz"), "--yes")
    assert code == 0, err
    assert (folder / "catalog.yaml").read_text() == "images: []\n"
    assert f"set FGPU_CATALOG_PATH={folder / 'catalog.yaml'}" in out


def test_a_full_disk_stops_the_restore_before_it_changes_anything(
    backed_up, capsys, tmp_path, hub_dbs
):
    folder, path, _, _ = backed_up
    before = snapshot(folder, hub_dbs)
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12k", "tmpfs", str(tiny)], check=True)
    try:
        os.chdir(tiny)
        code, out, err = restore(capsys, str(path), "--yes")  # PostgreSQL holds a hub already
        assert code == 1 and out == ""
        assert err.endswith(
            "error: cannot unpack the archive here (No space left on device); nothing changed\n"
        )
        assert os.listdir(tiny) == []
        assert snapshot(folder, hub_dbs)["rows"] == before["rows"]
    finally:
        os.chdir(tmp_path)
        subprocess.run(["umount", str(tiny)], check=True)


def test_swarm_home_folders_come_back_with_their_owners(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "hub"
    folder.mkdir()
    monkeypatch.chdir(folder)
    for name in (state_dir.HUB_DB_ENV, state_dir.QUEUE_DB_ENV, "FGPU_CATALOG_PATH"):
        monkeypatch.delenv(name, raising=False)
    homes = tmp_path / "shared-homes"
    (homes / "alice" / "work").mkdir(parents=True)
    (homes / "alice" / "work" / "notes.ipynb").write_text("{}\n")
    os.chown(homes / "alice" / "work" / "notes.ipynb", 1000, 100)
    monkeypatch.setenv("FGPU_SWARM_HOME_ROOT", str(homes))
    make_hub_state(folder, state_dir.DEFAULT_HUB_DB_URL, state_dir.DEFAULT_QUEUE_DB_URL)
    assert main(["backup"]) == 0
    out = capsys.readouterr().out
    assert f"not in the archive: {homes / 'alice'} (3 B); save it with: tar czf" in out
    assert main(["backup", "--with-homes", "--output", str(tmp_path / "homes.tar.gz")]) == 0
    capsys.readouterr()
    wipe(folder, ())
    code, _, err = restore(capsys, str(tmp_path / "homes.tar.gz"))
    assert code == 1 and f"home folder {homes / 'alice'}" in err  # it is still there
    shutil.rmtree(homes / "alice")
    code, _, err = restore(capsys, str(tmp_path / "homes.tar.gz"))
    assert code == 0, err
    notebook = homes / "alice" / "work" / "notes.ipynb"
    assert notebook.read_text() == "{}\n"
    assert (notebook.stat().st_uid, notebook.stat().st_gid) == (1000, 100)


def add_folder(queue_url: str, owner: str, name: str) -> str:
    """A storage folder's record, as the service writes it; its id."""
    folder_id = secrets.token_hex(16)
    make_session = open_database(queue_url)
    with make_session() as db:
        db.add(FolderRecord(id=folder_id, owner=owner, name=name, size_bytes=6))
        db.commit()
    make_session.kw["bind"].dispose()
    return folder_id


def test_storage_folders_come_back_with_owners_and_modes_and_never_through_links(
    tmp_path, monkeypatch, capsys, docker_engine
):
    folder = tmp_path / "hub"
    monkeypatch.chdir(tmp_path)
    for name in (state_dir.HUB_DB_ENV, state_dir.QUEUE_DB_ENV, "FGPU_CATALOG_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("FGPU_SWARM_HOME_ROOT", raising=False)
    folder.mkdir()
    monkeypatch.chdir(folder)
    make_hub_state(folder, state_dir.DEFAULT_HUB_DB_URL, state_dir.DEFAULT_QUEUE_DB_URL, users=1)
    folder_id = add_folder(state_dir.DEFAULT_QUEUE_DB_URL, "alice", "data")
    files = folder / state_dir.DEFAULT_FOLDERS_ROOT / folder_id
    (files / "raw").mkdir(parents=True)
    (files / "raw" / "a.csv").write_text("1,2,3\n")
    os.chmod(files / "raw" / "a.csv", 0o640)
    os.chown(files / "raw" / "a.csv", 1000, 100)
    secret = tmp_path / "secret"
    secret.write_text("not for the archive\n")
    (files / "planted").symlink_to(secret)  # what a session may leave in a shared folder
    (files / "planted-dir").symlink_to(tmp_path)
    os.mkfifo(files / "pipe")

    assert main(["backup"]) == 0
    out = capsys.readouterr().out
    assert (
        f"not in the archive: storage folder data of alice (6 B); save it with: tar czf {folder_id}"
        in out
    )
    out_path = tmp_path / "with-folders.tar.gz"
    assert main(["backup", "--with-homes", "--output", str(out_path)]) == 0
    err = capsys.readouterr().err
    for left_out in ("planted", "planted-dir", "pipe"):
        assert f"left out {folder_id}/{left_out} (storage folder data of alice)" in err
    with tarfile.open(out_path) as outer:
        member = outer.extractfile(f"folders/{folder_id}.tar")
        with tarfile.open(fileobj=member) as inner:
            names = inner.getnames()
        assert sorted(names) == [folder_id, f"{folder_id}/raw", f"{folder_id}/raw/a.csv"]

    # The folder here now holds a link where the file goes: the restore must not write through it.
    wipe(folder, ())
    files.mkdir(parents=True)
    (files / "raw").symlink_to(tmp_path)
    code, _, err = restore(capsys, str(out_path))
    assert code == 1 and f"storage folder {folder_id}" in err  # asked first: it exists
    code, _, err = restore(capsys, str(out_path), "--yes")
    assert code == 0, err
    restored = files / "raw" / "a.csv"
    assert restored.read_text() == "1,2,3\n"
    info = restored.lstat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (1000, 100, 0o640)
    assert not (files / "raw").is_symlink() and not (tmp_path / "a.csv").exists()
    assert secret.read_text() == "not for the archive\n"
    (kept,) = (folder / state_dir.DEFAULT_FOLDERS_ROOT / ".trash").iterdir()
    assert kept.name.startswith(f"{folder_id}.") and (kept / "raw").is_symlink()
    assert sorted(p.name for p in (folder / state_dir.DEFAULT_FOLDERS_ROOT).iterdir()) == sorted(
        [folder_id, ".trash"]
    )  # nothing left of the restore's own directory


def test_on_a_terminal_the_restore_asks_first(backed_up, hub_dbs):
    folder, path, _, _ = backed_up
    before = snapshot(folder, hub_dbs)
    for answer, code in (("n", 1), ("y", 0)):
        returncode, out, err = restore_on_a_terminal(path, folder, answer)
        assert returncode == code, err
        if answer == "n":
            assert err.strip().endswith("error: nothing restored")
            assert snapshot(folder, hub_dbs) == before
        else:
            assert "start the hub again" in out


def restore_on_a_terminal(archive: Path, cwd: Path, answer: str) -> tuple[int, str, str]:
    """`fgpu-hub restore` with a terminal as its input, answering its question with `answer`:
    (exit code, stdout, stderr)."""
    main_side, terminal = pty.openpty()
    process = subprocess.Popen(
        [str(VENV_BIN / "fgpu-hub"), "restore", str(archive)],
        cwd=cwd,
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.write(main_side, f"{answer}\n".encode())
    out, err = process.communicate(timeout=120)
    os.close(main_side)
    os.close(terminal)
    return process.returncode, out, err
