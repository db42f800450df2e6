"""A folder's owner's storage quota, held against every writer on a real hub and dockerd: a
read-write sharer's running session that fills the owner's folder past the owner's quota has
its writes stopped by the next measure round (its bind remounted read-only in the container,
engine/folder_write_stops.py), is told why on its session record, and the files API refuses
the sharer's upload with a 507 naming whose quota it is. The hub measures every 2 s."""

from __future__ import annotations

import os
import secrets
import stat
import subprocess

import pytest

from .harness import QueueUser, containers_with, queue_option, running_hub, wait_until

pytestmark = [pytest.mark.hub, pytest.mark.docker]

SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "512M"}
OCTETS = {"Content-Type": "application/octet-stream"}
FAST_MEASURE = queue_option("folder_measure_interval", 2)


@pytest.fixture(scope="module")
def measuring_hub(tmp_path_factory, docker_engine):
    """A hub measuring every 2 s, its folders root on a mount with nosuid,nodev, as the guide
    tells a site to make it (this fixture's own bind mount, removed after the hub)."""
    workdir = tmp_path_factory.mktemp("measuring-hub")
    root = workdir / "fgpu-folders"
    root.mkdir(mode=0o700)
    subprocess.run(["mount", "--bind", root, root], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,nosuid,nodev", root], check=True)
        env = {"FGPU_FOLDERS_ROOT": str(root)}
        with running_hub(workdir, env=env, extra_config=FAST_MEASURE) as hub:
            yield hub
    finally:
        subprocess.run(["umount", "-l", root], check=True)


def mount_options(container, target: str) -> set[str]:
    """The options of the mount at `target` in the container, as its kernel shows them."""
    with open(f"/proc/{container.attrs['State']['Pid']}/mounts") as mounts:
        (line,) = [x for x in mounts if x.split()[1] == target]
    return set(line.split()[3].split(","))


def test_the_service_warns_when_the_folders_root_lacks_nosuid_nodev(hub, measuring_hub):
    warning = "without nosuid,nodev: a setuid file or device a session leaves"
    assert warning in hub.log_text()  # the shared hub's root: a plain directory in /tmp
    assert warning not in measuring_hub.log_text()


def run_in(container, command: str):
    return container.exec_run(["sh", "-c", command], user="1000")


def the_mount(user: QueueUser, path: str) -> dict:
    (record,) = [s for s in user.sessions() if s["status"] == "RUNNING"]
    (mount,) = [m for m in record["mounts"] if m["path"] == path]
    return mount


def test_a_sharers_running_session_stops_writing_once_the_owners_quota_is_passed(
    measuring_hub,
):
    hub = measuring_hub
    owner_name, sharer_name = f"own-{secrets.token_hex(3)}", f"mate-{secrets.token_hex(3)}"
    hub.create_user(owner_name)
    hub.create_user(sharer_name)
    hub.join_group(owner_name, {"fgpu_quota": {"storage": "64K"}})
    owner, sharer = QueueUser(hub, owner_name), QueueUser(hub, sharer_name)
    made = owner.call("POST", "folders", json={"name": "team"})
    assert made.status_code == 201, made.text
    folder = made.json()
    shared = owner.call(
        "POST", f"folders/{folder['id']}/shares", json={"user": sharer_name, "permission": "rw"}
    )
    assert shared.status_code == 201, shared.text
    started = hub.start_server(sharer_name, {**SESSION, "folders": [folder["id"]]})
    assert started.status_code in (201, 202), started.text
    try:
        hub.wait_ready(sharer_name)
        (container,) = containers_with({"fgpu.user": sharer_name})
        assert the_mount(sharer, "folders/team")["read_only"] is False
        target = "/home/jovyan/folders/team"
        assert {"rw", "nosuid", "nodev"} <= mount_options(container, target)
        # The sharer (no quota of their own) fills the owner's folder past the owner's 64 KiB.
        big = run_in(container, "head -c 200000 /dev/zero > ~/folders/team/big && echo ok")
        assert big.exit_code == 0, big.output
        # The next rounds measure it and stop the session's writes; the record says why.
        mount = wait_until(
            lambda: (m := the_mount(sharer, "folders/team"))["read_only"] and m,
            timeout=120,
            what="the measure round stops the session's writes",
            interval=1,
        )
        assert mount["note"].startswith("Writes stopped: The folders of group ")
        assert "storage quota of 64 KiB" in mount["note"]
        more = run_in(container, "echo more > ~/folders/team/more")
        assert more.exit_code != 0 and b"Read-only file system" in more.output, more.output
        assert {"ro", "nosuid", "nodev"} <= mount_options(container, target)
        # Through the files API, the sharer's upload is refused the same way: a 507.
        put = sharer.call(
            "PUT", f"folders/{folder['id']}/files/more.bin", data=b"x", headers=OCTETS
        )
        assert put.status_code == 507, put.text
        assert "storage quota of 64 KiB" in put.json()["message"]
        # Started again while the owner is past the quota: read-only from the start.
        container = restarted(hub, sharer_name, folder)
        assert "ro" in mount_options(container, target)
        assert the_mount(sharer, "folders/team")["note"].startswith("The folders of group ")
        # The owner makes room; the next start mounts it read-write again.
        removed = owner.call("DELETE", f"folders/{folder['id']}/files/big")
        assert removed.status_code == 204, removed.text
        container = restarted(hub, sharer_name, folder)
        assert "rw" in mount_options(container, target)
        assert run_in(container, "echo back > ~/folders/team/back").exit_code == 0
    finally:
        hub.stop_server(sharer_name)


def restarted(hub, name: str, folder: dict):
    """The user's session stopped and started again with the folder; its container."""
    hub.stop_server(name)
    started = hub.start_server(name, {**SESSION, "folders": [folder["id"]]})
    assert started.status_code in (201, 202), started.text
    hub.wait_ready(name)
    (container,) = containers_with({"fgpu.user": name})
    return container


def as_other_host_user(command: str) -> subprocess.CompletedProcess:
    """`command` run by a shell on the host as uid 4242, a host account that is not the
    sessions' 1000 (through a shell: setpriv's own exec of a path it was given is not what an
    ordinary user's exec is)."""
    setpriv = ["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups", "sh", "-c"]
    return subprocess.run([*setpriv, command], capture_output=True, text=True, timeout=30)


def test_a_folder_is_closed_to_other_host_users_and_a_setuid_file_left_in_it_runs_for_none(
    measuring_hub,
):
    hub = measuring_hub
    name = f"priv-{secrets.token_hex(3)}"
    hub.create_user(name)
    user = QueueUser(hub, name)
    made = user.call("POST", "folders", json={"name": "private"})
    assert made.status_code == 201, made.text
    folder = made.json()
    put = user.call("PUT", f"folders/{folder['id']}/files/notes.txt", data=b"x", headers=OCTETS)
    assert put.status_code == 201, put.text
    root = hub.workdir / "fgpu-folders"
    directory = root / folder["id"]
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(directory / "notes.txt").st_mode) == 0o600
    started = hub.start_server(name, {**SESSION, "folders": [folder["id"]]})
    assert started.status_code in (201, 202), started.text
    try:
        hub.wait_ready(name)
        (container,) = containers_with({"fgpu.user": name})
        left = run_in(
            container, "cp /usr/bin/id ~/folders/private/id && chmod 4755 ~/folders/private/id"
        )
        assert left.exit_code == 0, left.output
    finally:
        hub.stop_server(name)
    assert os.stat(directory / "id").st_mode & stat.S_ISUID  # the session left it setuid
    # pytest's own directories are closed (0700): open the way to the folders root, as a
    # site's /srv is, so that only the folders' own modes keep the other user out.
    for ancestor in [hub.workdir, *hub.workdir.parents]:
        os.chmod(ancestor, os.stat(ancestor).st_mode | 0o001)
    for command in (f"ls {directory}", f"cat {directory}/notes.txt", f"{directory}/id -u"):
        tried = as_other_host_user(command)
        assert tried.returncode != 0 and "Permission denied" in tried.stderr, (command, tried)
    # A folder made open before (0755) is closed by the next measure round.
    os.chmod(directory, 0o755)
    os.chmod(root, 0o755)
    wait_until(
        lambda: (
            stat.S_IMODE(os.stat(directory).st_mode) == 0o700
            and stat.S_IMODE(os.stat(root).st_mode) == 0o700
        ),
        timeout=60,
        what="the measure round closes an open folder",
    )
