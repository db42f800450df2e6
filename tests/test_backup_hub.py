"""Back up a running hub, lose its state directory, restore it, start it again: everything is back.

One cycle on the real stack (JupyterHub, the queue service, real containers, simulated GPUs): a
session running on the one GPU, a request waiting behind it, a finished session, a group quota,
a catalog edit, a storage folder with a file (its data saved with `--with-homes`) and a private
image (listed, not saved). The backup is taken while all of that runs; the hub is stopped, its
directory wiped, the archive restored there with `fgpu-hub restore`, and the hub started again
with the same command. The running session is adopted (same container), the rest is as it was,
and ending the running session lets the waiting one start by itself.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from .harness import VENV_BIN, QueueUser, containers_with, relaunch, running_hub

pytestmark = [pytest.mark.docker, pytest.mark.hub]
SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "256M", "fgpu": 1}
QUOTA = {"fgpu": 2, "sessions": 3}
EDITED = "Python 3.11 (restored from a backup)"
CHAPTER = b"# Chapter 1\n\nWritten before the disk died.\n"
OCTETS = {"Content-Type": "application/octet-stream"}
# The spawn of the waiting request dies with the hub; the service issues it again once it has
# seen no spawn waiting on it for this long (the default 120 s is for storms of stops).
EXTRA = """
c.QueueService.respawn_grace = 5
"""


def by_status(sessions: list[dict], status: str) -> list[dict]:
    return [s for s in sessions if s["status"] == status]


def fgpu_hub(*args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "fgpu-hub"), *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_hub_comes_back_from_its_backup(tmp_path, docker_engine, request):
    env = {"FGPU_SIMULATED_GPUS": "1x8GiB", "FGPU_UNITS_PER_GPU": "1"}
    with running_hub(tmp_path / "hub", env=env, extra_config=EXTRA) as hub:
        admin = QueueUser(hub, "admin")
        student = QueueUser(hub, f"student-{secrets.token_hex(4)}")
        group = f"course-{secrets.token_hex(3)}"
        assert hub.request("POST", f"groups/{group}").status_code == 201
        quota = {"fgpu_quota": QUOTA}
        assert hub.request("PUT", f"groups/{group}/properties", json=quota).status_code == 200
        members = {"users": [student.name]}
        assert hub.request("POST", f"groups/{group}/users", json=members).status_code == 200
        edit = admin.call("PATCH", "images/python-3.11", json={"display_name": EDITED})
        assert edit.status_code == 200, edit.text
        made = student.call("POST", "folders", json={"name": "thesis"})
        assert made.status_code == 201, made.text
        folder = made.json()
        upload = f"folders/{folder['id']}/files/chapter1.md?offset=0"
        put = student.call("PUT", upload, data=CHAPTER, headers=OCTETS)
        assert put.status_code in (200, 201), put.text

        # Three sessions of the one GPU: the first runs and ends, the second then runs and the
        # third waits behind it.
        response = student.call("POST", "sessions", json={**SESSION, "count": 3})
        assert response.status_code == 201, response.text
        first = by_status(student.wait_for(lambda s: len(by_status(s, "RUNNING")) == 1), "RUNNING")
        assert student.call("DELETE", f"sessions/{first[0]['id']}").status_code == 200
        sessions = student.wait_for(
            lambda s: len(s) == 2 and len(by_status(s, "RUNNING")) == 1, timeout=120
        )
        (running,) = by_status(sessions, "RUNNING")
        (pending,) = by_status(sessions, "PENDING")
        (container,) = containers_with({"fgpu.session_id": running["id"]})
        # A private image of the running session (left out of the archive, listed instead).
        tag = f"t{secrets.token_hex(3)}"
        commit = admin.call("POST", f"sessions/{running['id']}/image", json={"tag": tag})
        assert commit.status_code == 201, commit.text
        private = commit.json()["image"]
        request.addfinalizer(lambda: docker_engine.images.remove(private, force=True))

        # The backup, while all of that runs.
        backups = tmp_path / "backups"
        made = fgpu_hub(
            "backup",
            "--with-homes",
            cwd=hub.workdir,
            env={**hub.env, "FGPU_BACKUP_DIR": str(backups)},
        )
        assert made.returncode == 0, made.stderr
        archive = Path(made.stdout.strip().splitlines()[-1])
        assert f"not in the archive: {private} (" in made.stdout
        assert archive.parent == backups and archive.is_file()

        # The machine's disk dies: the hub stops (its sessions run on) and its state is gone.
        hub.process.terminate()
        hub.process.wait(30)
        shutil.rmtree(hub.workdir)
        hub.workdir.mkdir()

        # The site's config file is code the hub runs: a script installs it explicitly.
        # --yes: the student's home volume is still on the engine, and is filled again.
        restored = fgpu_hub(
            "restore", str(archive), "--install-config", "--yes", cwd=hub.workdir, env=hub.env
        )
        assert restored.returncode == 0, restored.stderr
        assert (hub.workdir / "test_config.py").is_file()  # the site's config came back too
        assert os.stat(hub.workdir / "jupyterhub_cookie_secret").st_mode & 0o777 == 0o600
        chapter = hub.workdir / "fgpu-folders" / folder["id"] / "chapter1.md"
        assert chapter.read_bytes() == CHAPTER
        assert (chapter.stat().st_uid, chapter.stat().st_gid) == (1000, 100)  # the session user

        relaunch(hub)  # the same command, in the same directory
        # The waiting one has its place again once the restarted service has counted the engine.
        after = student.wait_for(
            lambda s: (
                {(r["id"], r["status"], r["position"]) for r in s}
                == {(running["id"], "RUNNING", None), (pending["id"], "PENDING", 1)}
            ),
            timeout=60,
        )
        # Adopted, not restarted: the same container, still running.
        (again,) = containers_with({"fgpu.session_id": running["id"]})
        assert again.id == container.id and again.status == "running"
        assert by_status(after, "PENDING")[0]["position"] == 1
        history = student.call("GET", "sessions?finished=1").json()["sessions"]
        assert [s["id"] for s in history] == [first[0]["id"]]
        group_model = hub.request("GET", f"groups/{group}").json()
        assert group_model["properties"] == quota and group_model["users"] == [student.name]
        image = next(
            i for i in admin.call("GET", "images").json()["images"] if i["name"] == "python-3.11"
        )
        assert image["display_name"] == EDITED
        # Its owner sees the private image in the catalog again (the image itself stayed).
        assert private in {i["image"] for i in student.call("GET", "images").json()["images"]}

        # The folder is the student's again, its file served by the service.
        (listed,) = student.call("GET", "folders").json()["folders"]
        assert (listed["id"], listed["name"]) == (folder["id"], "thesis")
        again = student.call("GET", f"folders/{folder['id']}/files/chapter1.md")
        assert again.status_code == 200 and again.content == CHAPTER

        # The waiting request starts by itself once the running one ends.
        assert student.call("DELETE", f"sessions/{running['id']}").status_code == 200
        student.wait_for(
            lambda s: [(r["id"], r["status"]) for r in s] == [(pending["id"], "RUNNING")],
            timeout=120,
        )
        assert {
            c.labels["fgpu.session_id"] for c in containers_with({"fgpu.user": student.name})
        } == {pending["id"]}
