"""A hub's state directory without a running hub: both databases written through their own
models (JupyterHub's ORM, the queue service's migrations and records) and the state files.

Shared by the backup and restore tests and by benchmarks/backup_restore.py, so that both work on
the same kind of state.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import docker.errors
import pytest
from jupyterhub import orm
from sqlalchemy import text

from queue_service.core.status import Status
from queue_service.store import state_dir
from queue_service.store.db import open_database
from queue_service.store.models import ImageRecord, SessionRecord

from .databases import drop_database

GROUP = "course-a"
GROUP_QUOTA = {"fgpu": 1}
EDITED_IMAGE = "edited-image"


def make_hub_state(
    folder: Path,
    hub_url: str,
    queue_url: str,
    users: int = 3,
    finished: int = 5,
    images: tuple[str, ...] = (),
) -> dict:
    """Fill `folder` (the hub's state directory) and the two databases; what was written. User
    names are this call's own (home volumes are named after them on the shared engine)."""
    folder.mkdir(parents=True, exist_ok=True)
    prefix = secrets.token_hex(3)
    names = [f"student-{prefix}-{i:03d}" for i in range(users)]
    _hub_db(hub_url, names)
    session_ids = _queue_db(queue_url, names, finished, images)
    files = {}
    for state_file in state_dir.STATE_FILES:
        path = folder / state_file.name
        path.write_text(secrets.token_hex(16) + "\n")
        path.chmod(0o600 if state_file.secret else 0o644)
        files[state_file.name] = path.read_text()
    return {"users": names, "sessions": session_ids, "files": files}


def _hub_db(url: str, names: list[str]) -> None:
    db = orm.new_session_factory(url)()
    try:
        group = orm.Group(name=GROUP, properties={"fgpu_quota": GROUP_QUOTA})
        db.add(group)
        for name in names:
            user = orm.User(name=name)
            user.groups.append(group)
            db.add(user)
        db.commit()
    finally:
        db.close()
        db.get_bind().dispose()


def _queue_db(url: str, names: list[str], finished: int, images: tuple[str, ...]) -> list[str]:
    make_session = open_database(url)
    start = datetime(2026, 9, 1, tzinfo=UTC)
    ids = []
    with make_session() as db:
        for seq in range(finished):
            began = start + timedelta(minutes=seq)
            record = SessionRecord(
                id=secrets.token_hex(8),
                seq=seq + 1,
                user=names[seq % len(names)],
                server_name=f"s{seq}",
                status=Status.TERMINATED,
                image="python-3.11",
                cpu=1.0,
                mem=1 << 30,
                fgpu=0.5,
                resource_group="default",
                node="node-1",
                grant_json='{"node": "node-1", "gpus": {"GPU-0": 0.5}}',
                reason="stopped by the user",
                end_reason="user",
                created=began,
                scheduled_at=began,
                started=began,
                ended=began + timedelta(hours=1),
            )
            db.add(record)
            ids.append(record.id)
        db.add(ImageRecord(name=EDITED_IMAGE, image="fgpu/python:3.11", display_name="Edited"))
        for index, image in enumerate(images):
            db.add(
                ImageRecord(name=f"private-{index}", image=image, owner=names[0], source="commit")
            )
        db.commit()
    make_session.kw["bind"].dispose()
    return ids


def hub_db_rows(url: str) -> dict:
    """What the tests compare after a restore: users, groups and their properties."""
    db = orm.new_session_factory(url)()
    try:
        return {
            "users": sorted(u.name for u in db.query(orm.User)),
            "groups": {g.name: g.properties for g in db.query(orm.Group)},
        }
    finally:
        db.close()
        db.get_bind().dispose()


def queue_db_rows(url: str) -> dict:
    make_session = open_database(url)
    try:
        with make_session() as db:
            return {
                "sessions": sorted((r.id, r.status) for r in db.query(SessionRecord)),
                "images": sorted(r.name for r in db.query(ImageRecord)),
            }
    finally:
        make_session.kw["bind"].dispose()


def file_modes(folder: Path) -> dict[str, int]:
    return {
        f.name: os.stat(folder / f.name).st_mode & 0o777
        for f in state_dir.STATE_FILES
        if (folder / f.name).exists()
    }


@pytest.fixture
def hub_dbs(db_url, request, monkeypatch):
    """(hub DB URL, queue DB URL) as the hub and fgpu-hub read them from the environment: the
    default SQLite files in the state directory, or two PostgreSQL databases of this test's own
    (FGPU_HUB_DB_URL, FGPU_QUEUE_DB_URL)."""
    monkeypatch.delenv(state_dir.HUB_DB_ENV, raising=False)
    monkeypatch.delenv(state_dir.QUEUE_DB_ENV, raising=False)
    if db_url.startswith("sqlite"):
        yield state_dir.DEFAULT_HUB_DB_URL, state_dir.DEFAULT_QUEUE_DB_URL
        return
    admin = request.getfixturevalue("postgres_admin")
    name = f"fgpu_t_hub_{secrets.token_hex(6)}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    hub_url = admin.url.set(database=name).render_as_string(hide_password=False)
    monkeypatch.setenv(state_dir.HUB_DB_ENV, hub_url)
    monkeypatch.setenv(state_dir.QUEUE_DB_ENV, db_url)
    try:
        yield hub_url, db_url
    finally:
        drop_database(admin, name)


@pytest.fixture
def private_image(docker_engine):
    """A tiny image in the private repository (one file, imported): saved and loaded in a blink."""
    reference = f"fgpu-private/backup-test:{secrets.token_hex(4)}"
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    repository, tag = reference.split(":")
    docker_engine.api.import_image_from_data(data.getvalue(), repository=repository, tag=tag)
    yield reference
    with contextlib.suppress(docker.errors.NotFound):  # a failed restore test may have lost it
        docker_engine.images.remove(reference, force=True)


def fill_home_volume(engine, user: str) -> str:
    """A home volume as the spawner makes it, with a notebook owned by the session user."""
    name = f"fgpu-home-{user}"
    engine.volumes.create(name, labels={"fgpu.user": user, "fgpu.volume": "home"})
    engine.containers.run(
        "fgpu/jupyter-base:py3.11",
        [
            "sh",
            "-c",
            "mkdir -p /h/work && echo '{}' > /h/work/notes.ipynb && chown -R 1000:100 /h/work",
        ],
        user="0",
        volumes={name: {"bind": "/h", "mode": "rw"}},
        remove=True,
    )
    return name
