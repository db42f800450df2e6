"""`fgpu-hub backup` (fgpu_admin/backup.py) on real SQLite and real PostgreSQL databases, and the
real Docker engine for private images and home volumes."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import tarfile
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from fgpu_admin import archive
from fgpu_admin.cli import main
from queue_service.store import state_dir
from queue_service.store.db import alembic_config

from .harness import VENV_BIN, wait_until
from .hub_state import file_modes, fill_home_volume, make_hub_state

pytestmark = [pytest.mark.docker]


@pytest.fixture
def state(tmp_path, monkeypatch, hub_dbs):
    """A hub's state directory with both databases filled; the current directory."""
    folder = tmp_path / "hub"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.delenv("FGPU_BACKUP_DIR", raising=False)
    monkeypatch.delenv("FGPU_CATALOG_PATH", raising=False)
    made = make_hub_state(folder, *hub_dbs)
    return folder, made


@pytest.fixture
def sqlite_state(tmp_path, monkeypatch):
    """The same on the default SQLite files, for what does not depend on the kind of database."""
    folder = tmp_path / "hub"
    folder.mkdir()
    monkeypatch.chdir(folder)
    for name in (
        "FGPU_BACKUP_DIR",
        "FGPU_CATALOG_PATH",
        state_dir.HUB_DB_ENV,
        state_dir.QUEUE_DB_ENV,
    ):
        monkeypatch.delenv(name, raising=False)
    made = make_hub_state(folder, state_dir.DEFAULT_HUB_DB_URL, state_dir.DEFAULT_QUEUE_DB_URL)
    return folder, made


def backup(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["backup", *args])
    out, err = capsys.readouterr()
    return code, out, err


def members_of(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def test_a_backup_holds_both_databases_the_state_files_and_a_manifest(state, capsys, hub_dbs):
    folder, made = state
    (folder / "site_config.py").write_text('load_subconfig("jupyterhub_config.py")\n')
    code, out, _ = backup(capsys)
    assert code == 0
    path = Path(out.strip().splitlines()[-1])  # the archive's path is the last line
    assert path.parent == folder / "backups" and path.name.startswith("fgpu-hub-backup-")
    assert os.stat(path).st_mode & 0o777 == 0o600
    members = members_of(path)
    manifest = json.loads(members.pop(archive.MANIFEST))
    archive.verify(manifest, {n: _sha_size(data) for n, data in members.items()})
    assert manifest["versions"]["fgpu-hub"] == "0.1.0"
    assert manifest["versions"]["jupyterhub"].startswith("6.")
    # The queue's schema as this checkout's migrations leave it.
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert manifest["databases"]["queue"]["revision"] == head
    assert manifest["databases"]["hub"]["revision"] == "f460b0348206"
    assert manifest["host"] and manifest["created"].startswith(str(datetime.now(UTC).year))
    for name, content in made["files"].items():
        assert members[f"state/{name}"].decode() == content
        assert manifest["members"][f"state/{name}"]["mode"] == file_modes(folder)[name]
    assert manifest["members"]["state/jupyterhub_cookie_secret"]["mode"] == 0o600
    assert "config/site/site_config.py" in members
    assert any(m.endswith("-jupyterhub_config.py") for m in members)
    # The databases' copies hold what the hub wrote.
    queue = manifest["databases"]["queue"]
    if queue["kind"] == "sqlite":
        copy = folder.parent / "copy.sqlite"
        copy.write_bytes(members[queue["member"]])
        with sqlite3.connect(copy) as db:
            ids = {row[0] for row in db.execute("SELECT id FROM sessions")}
        assert ids == set(made["sessions"])
    else:
        dump = members[queue["member"]].decode()
        assert all(session_id in dump for session_id in made["sessions"])
        assert made["users"][0] in members[manifest["databases"]["hub"]["member"]].decode()


def _sha_size(data: bytes) -> tuple[str, int]:
    digest = archive.Digest()
    digest.update(data)
    return digest.sha256, digest.size


def test_a_backup_while_the_hub_writes_is_consistent(tmp_path, monkeypatch, capsys):
    """SQLite's online backup takes one snapshot while another connection goes on writing."""
    folder = tmp_path / "hub"
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(state_dir.HUB_DB_ENV, raising=False)
    monkeypatch.delenv(state_dir.QUEUE_DB_ENV, raising=False)
    make_hub_state(folder, f"sqlite:///{folder}/jupyterhub.sqlite", f"sqlite:///{folder}/q.sqlite")
    monkeypatch.setenv(state_dir.QUEUE_DB_ENV, f"sqlite:///{folder}/q.sqlite")
    monkeypatch.chdir(folder)
    stop = threading.Event()
    written = []

    def write() -> None:
        with sqlite3.connect(folder / "q.sqlite", timeout=30) as db:
            db.execute("PRAGMA journal_mode=WAL")
            while not stop.is_set():
                db.execute(
                    "INSERT INTO usage_days (day, user, account, resource_group, cpu_hours,"
                    " mem_gib_hours, fgpu_hours) VALUES (?, 'u', '', 'default', 1, 1, 1)",
                    ((datetime(2020, 1, 1) + timedelta(days=len(written))).date(),),
                )
                db.commit()
                written.append(1)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        # The backup starts once the writer is writing (on a loaded machine the thread may not
        # have run yet), so that it always copies while another connection goes on writing.
        wait_until(lambda: written, 30, "the writer's first row")
        code, out, _ = backup(capsys)
    finally:
        stop.set()
        writer.join()
    assert code == 0
    copy = tmp_path / "copy.sqlite"
    copy.write_bytes(members_of(Path(out.strip().splitlines()[-1]))["db/queue.sqlite"])
    with sqlite3.connect(copy) as db:
        (count,) = db.execute("SELECT count(*) FROM usage_days").fetchone()
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert 0 < count <= len(written)


def test_a_full_disk_leaves_no_partial_archive_and_says_why(state, capsys, tmp_path):
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12k", "tmpfs", str(tiny)], check=True)
    try:
        code, out, err = backup(capsys, "--output", str(tiny / "hub.tar.gz"))
        assert code == 1
        assert err.startswith("error: backup failed, no archive written: ")
        assert "No space left on device" in err or "database or disk is full" in err
        assert len(err.strip().splitlines()) == 1 and out == ""
        assert os.listdir(tiny) == []  # no archive, no partial file, no staging folder
    finally:
        subprocess.run(["umount", str(tiny)], check=True)


def test_an_output_that_cannot_be_written_is_refused(sqlite_state, capsys, tmp_path):
    code, out, err = backup(capsys, "--output", "/proc/fgpu-backup.tar.gz")
    assert code == 1 and out == ""
    assert err.startswith("error: cannot write the archive in /proc")
    code, out, err = backup(capsys, "--output", "/proc/no-such/folder/hub.tar.gz")
    assert code == 1 and out == "" and "cannot write the archive in /proc/no-such" in err
    code, _, err = backup(capsys, "--output", str(tmp_path))
    assert code == 1 and "is a folder" in err


def test_keep_days_deletes_only_older_archives_of_the_folder(sqlite_state, capsys, monkeypatch):
    folder, _ = sqlite_state
    backups = folder / "kept"
    backups.mkdir()
    monkeypatch.setenv("FGPU_BACKUP_DIR", str(backups))
    now = datetime.now(UTC)
    old = archive.archive_name(now - timedelta(days=8))
    recent = archive.archive_name(now - timedelta(days=2))
    for name in (old, recent, "notes.txt"):
        (backups / name).write_text("x")
    code, out, _ = backup(capsys, "--keep-days", "7")
    assert code == 0
    written = Path(out.strip().splitlines()[-1])
    assert sorted(os.listdir(backups)) == sorted([recent, "notes.txt", written.name])
    assert f"deleted {backups / old}" in out


def test_bad_keep_days_and_a_missing_database_get_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv(state_dir.HUB_DB_ENV, raising=False)
    monkeypatch.delenv(state_dir.QUEUE_DB_ENV, raising=False)
    done = _cli(tmp_path, "backup", "--keep-days", "soon")
    assert done.returncode == 2 and "a whole number of days >= 0, not 'soon'" in done.stderr
    done = _cli(tmp_path, "backup")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"error: no hub database at {tmp_path / 'jupyterhub.sqlite'}: run fgpu-hub backup in"
        " the hub's state directory (where the hub is started)"
    ]
    assert os.listdir(tmp_path) == []


def _cli(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "fgpu-hub"), *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_private_images_are_listed_and_saved_when_asked(
    tmp_path, monkeypatch, capsys, private_image, docker_engine
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(state_dir.HUB_DB_ENV, raising=False)
    monkeypatch.delenv(state_dir.QUEUE_DB_ENV, raising=False)
    make_hub_state(
        tmp_path,
        "sqlite:///jupyterhub.sqlite",
        "sqlite:///fgpu_queue.sqlite",
        images=(private_image,),
    )
    code, out, _ = backup(capsys)
    assert code == 0
    lines = out.strip().splitlines()
    (listed,) = [line for line in lines if private_image in line]
    assert listed.startswith(f"not in the archive: {private_image} (")
    assert "docker save -o backup-test-" in listed
    manifest = json.loads(members_of(Path(lines[-1]))[archive.MANIFEST])
    assert manifest["images"][0]["size"] == docker_engine.images.get(private_image).attrs["Size"]

    code, out, _ = backup(capsys, "--with-images")
    assert code == 0
    members = members_of(Path(out.strip().splitlines()[-1]))
    saved = [name for name in members if name.startswith("images/")]
    assert len(saved) == 1
    with tarfile.open(fileobj=io.BytesIO(members[saved[0]])) as tar:
        assert "manifest.json" in tar.getnames()  # a `docker save` archive
    assert private_image not in out  # nothing left to list


def test_with_images_and_no_engine_fails_before_writing(sqlite_state, capsys, monkeypatch):
    folder, _ = sqlite_state
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")
    code, out, err = backup(capsys, "--with-images")
    assert code == 1 and out == ""
    assert err.startswith("error: the Docker engine does not answer (")
    assert err.rstrip().endswith("--with-images needs it")
    assert not (folder / "backups").exists()


def test_home_volumes_are_listed_and_saved_when_asked(tmp_path, monkeypatch, capsys, docker_engine):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(state_dir.HUB_DB_ENV, raising=False)
    monkeypatch.delenv(state_dir.QUEUE_DB_ENV, raising=False)
    made = make_hub_state(tmp_path, "sqlite:///jupyterhub.sqlite", "sqlite:///fgpu_queue.sqlite")
    volume = fill_home_volume(docker_engine, made["users"][0])
    try:
        code, out, _ = backup(capsys)
        assert code == 0
        assert f"not in the archive: {volume} (" in out
        code, out, _ = backup(capsys, "--with-homes")
        assert code == 0
        members = members_of(Path(out.strip().splitlines()[-1]))
        with tarfile.open(fileobj=io.BytesIO(members[f"homes/{volume}.tar"])) as tar:
            notebook = tar.getmember("fgpu-home/work/notes.ipynb")
            assert (notebook.uid, notebook.gid) == (1000, 100)
            assert tar.extractfile(notebook).read() == b"{}\n"
    finally:
        docker_engine.volumes.get(volume).remove(force=True)
