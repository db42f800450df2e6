"""SSH and SFTP into the hub (queue_service/ssh/, docs/source/explanation/contracts.md, contract 9) with Debian's OpenSSH
client against the shared GPU hub and the real dockerd.

A shell lands in the login's running session (its python, its simulated GPU slice, its CPU and
memory limits), a named server's as `user-server`; a login without a running session is told
what to do and nothing is started. SFTP reaches the home and the storage folders, session or
not, with the Storage page's rules: another user's token, a revoked or narrow one, a read-only
share, a `..` path, a planted link and a write past the storage quota are refused.

The password goes to `ssh` as VS Code's and scripts' do without a terminal: by SSH_ASKPASS
(`SSH_ASKPASS_REQUIRE=force`), a small script that prints it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
from pathlib import Path

import asyncssh
import pytest
import requests

from queue_service.ssh.sftp import MAX_OPEN_FILES

from .harness import QueueUser, logged_in

pytestmark = [pytest.mark.docker, pytest.mark.hub]

MIB = 1024 * 1024
#: What a browser sends with a request another site's page makes (as test_security_handlers.py).
CROSS_SITE = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
#: Half the simulated GPU (2 fGPU units a GPU), half a core, 512 MiB.
SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "512M", "fgpu": 1}
LAB = {"image": "python-3.11", "cpu": 0.5, "mem": "256M"}
CLIENT_OPTIONS = [
    "-o", "StrictHostKeyChecking=no",
    "-o", "UserKnownHostsFile=/dev/null",
    "-o", "NumberOfPasswordPrompts=1",
    "-o", "LogLevel=ERROR",
]  # fmt: skip
#: A login by password alone (the keys of whoever runs the tests stay out of it).
PASSWORD_ONLY = [*CLIENT_OPTIONS, "-o", "PubkeyAuthentication=no"]


@pytest.fixture(scope="module")
def askpass(tmp_path_factory) -> Path:
    script = tmp_path_factory.mktemp("askpass") / "askpass"
    script.write_text('#!/bin/sh\nprintf "%s\\n" "$TEST_SSH_PASSWORD"\n')
    script.chmod(0o700)
    return script


class Client:
    """Debian's ssh and sftp, logging in to the hub's SSH service as `login` with `password`."""

    def __init__(self, hub, askpass: Path, login: str, password: str):
        self.port = hub.env["FGPU_SSH_PORT"]
        self.login = login
        self.env = {
            **os.environ,
            "SSH_ASKPASS": str(askpass),
            "SSH_ASKPASS_REQUIRE": "force",
            "TEST_SSH_PASSWORD": password,
        }

    def ssh(self, *command: str, terminal: bool = False, stdin: str = ""):
        target = [*PASSWORD_ONLY, "-p", self.port, f"{self.login}@127.0.0.1"]
        tty = ["-tt"] if terminal else ["-T"]
        return self._run(["/usr/bin/ssh", *tty, *target, *command], stdin)

    def limits(self) -> tuple[float, int]:
        """The session's CPUs and memory limit as its cgroup (v1 or v2) holds them."""
        limits = self.ssh(
            "cat /sys/fs/cgroup/cpu.max 2>/dev/null || "
            "echo $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us); "
            "cat /sys/fs/cgroup/memory.max 2>/dev/null || "
            "cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
        )
        assert limits.returncode == 0, limits.stderr
        (quota, period), memory = (line.split() for line in limits.stdout.splitlines())
        return int(quota) / int(period), int(memory[0])

    def sftp(self, commands: str, cwd: Path | None = None):
        """`commands` read by sftp from its input (not `-b`, which forbids a password)."""
        target = [*PASSWORD_ONLY, "-P", self.port, f"{self.login}@127.0.0.1"]
        return self._run(["/usr/bin/sftp", *target], commands, cwd)

    def _run(self, argv: list[str], stdin: str, cwd: Path | None = None):
        return subprocess.run(
            argv, input=stdin, capture_output=True, text=True, env=self.env, cwd=cwd, timeout=300
        )


def make_folder(user: QueueUser, name: str) -> dict:
    response = user.call("POST", "folders", json={"name": name})
    assert response.status_code == 201, response.text
    return response.json()


def folder_dir(hub, folder: dict) -> Path:
    return hub.workdir / "fgpu-folders" / folder["id"]


@pytest.fixture(scope="module")
def ann(gpu_hub):
    """A student (a `-` in the name, as logins split on it) with a running default session
    holding half a GPU, and a folder of her own."""
    user = QueueUser(gpu_hub, f"ann-{secrets.token_hex(3)}")
    response = gpu_hub.start_server(user.name, SESSION)
    assert response.status_code in (201, 202), response.text
    gpu_hub.wait_ready(user.name)
    user.token = user.http.headers["Authorization"].split()[1]
    user.folder = make_folder(user, "data")
    return user


@pytest.fixture(scope="module")
def bob(gpu_hub):
    """A student with no session at all."""
    user = QueueUser(gpu_hub, f"bob-{secrets.token_hex(3)}")
    user.token = user.http.headers["Authorization"].split()[1]
    return user


def session_id(user: QueueUser, server: str = "") -> str:
    (record,) = [
        s for s in user.sessions() if s["status"] == "RUNNING" and s["server_name"] == server
    ]
    return record["id"]


def test_a_shell_runs_python_and_nvidia_smi_in_the_session_within_its_limits(gpu_hub, ann, askpass):
    client = Client(gpu_hub, askpass, ann.name, ann.token)
    python = client.ssh("python", "-c", "'print(6 * 7)'")
    assert (python.returncode, python.stdout) == (0, "42\n"), python.stderr
    where = client.ssh('echo "$FGPU_SESSION_ID $(id -u) $HOME"')
    assert where.stdout.split() == [session_id(ann), "1000", "/home/jovyan"]
    # The session's cgroup: 0.5 CPU (v1 or v2) and 512 MiB.
    assert client.limits() == (0.5, 512 * MIB)
    smi = client.ssh("nvidia-smi")
    assert smi.returncode == 0, smi.stderr
    assert "GPU 0: 50% of Simulated GPU (8 GiB): 4096 MiB of 8192 MiB" in smi.stdout, smi.stdout
    assert client.ssh("exit 7").returncode == 7
    # Output and errors apart, input to the end.
    split = client.ssh("cat; echo oops >&2", stdin="line one\nline two\n")
    assert (split.stdout, split.stderr) == ("line one\nline two\n", "oops\n")


def test_a_terminal_opens_a_login_shell_in_the_session(gpu_hub, ann, askpass):
    client = Client(gpu_hub, askpass, ann.name, ann.token)
    shell = client.ssh(terminal=True, stdin='echo "in $FGPU_SESSION_ID on $(tty)"; exit 3\n')
    assert shell.returncode == 3
    assert f"in {session_id(ann)} on /dev/pts/" in shell.stdout


def test_a_named_server_is_reached_as_user_dash_server(gpu_hub, ann, askpass):
    response = gpu_hub.start_server(ann.name, LAB, server="lab")
    assert response.status_code in (201, 202), response.text
    gpu_hub.wait_ready(ann.name, "lab")
    try:
        lab = Client(gpu_hub, askpass, f"{ann.name}-lab", ann.token).ssh("echo $FGPU_SESSION_ID")
        assert lab.stdout.split() == [session_id(ann, "lab")]
        other = Client(gpu_hub, askpass, f"{ann.name}-nolab", ann.token).ssh("true")
        assert other.returncode == 1
        assert "no running session on the server 'nolab'" in other.stderr
    finally:
        gpu_hub.stop_server(ann.name, "lab")


def test_without_a_running_session_the_login_is_told_to_start_one(gpu_hub, bob, askpass):
    shell = Client(gpu_hub, askpass, bob.name, bob.token).ssh("true")
    assert shell.returncode == 1
    assert f"{bob.name} has no running session on the default server" in shell.stderr
    assert "Start one on the Sessions page (/services/queue/sessions)" in shell.stderr
    assert (bob.name, "") not in gpu_hub.active_servers()  # nothing started behind his back
    assert gpu_hub.server_model(bob.name) is None


def test_other_tokens_are_refused(gpu_hub, ann, bob, askpass):
    def refused(login: str, password: str) -> bool:
        run = Client(gpu_hub, askpass, login, password).ssh("true")
        return run.returncode == 255 and "Permission denied" in run.stderr

    assert refused(ann.name, bob.token)  # another user's token
    assert refused(bob.name, ann.token)
    assert refused(f"{bob.name}-x", ann.token)
    assert refused(ann.name, "not-a-token-at-all")
    made = gpu_hub.request("POST", f"users/{ann.name}/tokens", json={"note": "ssh"})
    revoked = made.json()
    assert not refused(ann.name, revoked["token"])
    gone = gpu_hub.request("DELETE", f"users/{ann.name}/tokens/{revoked['id']}")
    assert gone.status_code == 204, gone.text
    assert refused(ann.name, revoked["token"])  # at once: logins are never cached
    # A token narrowed to reading the user, or to another server, reaches no shell.
    for scopes in (["read:users!user=" + ann.name], [f"access:servers!server={ann.name}/lab"]):
        narrow = gpu_hub.request("POST", f"users/{ann.name}/tokens", json={"scopes": scopes})
        assert narrow.status_code == 201, narrow.text
        assert refused(ann.name, narrow.json()["token"])
    server_token = gpu_hub.request(
        "POST", f"users/{ann.name}/tokens", json={"scopes": [f"access:servers!server={ann.name}/"]}
    ).json()["token"]
    assert not refused(ann.name, server_token)


def test_sftp_puts_and_gets_a_file_in_a_folder_without_a_session(gpu_hub, bob, askpass, tmp_path):
    folder = make_folder(bob, "datasets")
    data = os.urandom(64 * MIB)
    (tmp_path / "up.bin").write_bytes(data)
    client = Client(gpu_hub, askpass, bob.name, bob.token)
    run = client.sftp(
        "ls /folders\ncd folders/datasets\nput up.bin\nls -l\nget up.bin down.bin\n", tmp_path
    )
    assert run.returncode == 0, run.stderr
    assert "datasets" in run.stdout
    assert (tmp_path / "down.bin").read_bytes() == data
    stored = folder_dir(gpu_hub, folder) / "up.bin"
    info = stored.stat()
    assert (info.st_size, info.st_uid) == (64 * MIB, 1000)  # as the Storage page writes
    # Measured at the file's close, as after an upload.
    (seen,) = [f for f in bob.call("GET", "folders").json()["folders"] if f["id"] == folder["id"]]
    assert seen["size_bytes"] >= 64 * MIB
    assert gpu_hub.server_model(bob.name) is None


def test_sftp_refuses_a_read_only_share_dot_dot_and_planted_links(
    gpu_hub, ann, bob, askpass, tmp_path
):
    shared = make_folder(bob, "handout")
    (folder_dir(gpu_hub, shared) / "task.txt").write_text("read me\n")
    share = bob.call(
        "POST", f"folders/{shared['id']}/shares", json={"user": ann.name, "permission": "ro"}
    )
    assert share.status_code == 201, share.text
    # Links a session plants: in ann's home (through her shell) and in her folder (on disk).
    client = Client(gpu_hub, askpass, ann.name, ann.token)
    plant = client.ssh("ln -sfn /etc/passwd ~/passwd-link && ln -sfn / ~/root-link")
    assert plant.returncode == 0, plant.stderr
    os.symlink("/etc", folder_dir(gpu_hub, ann.folder) / "etc-link")
    (tmp_path / "mine.txt").write_text("mine\n")
    run = client.sftp(
        "get /folders/handout/task.txt\n"
        "put mine.txt /folders/handout/mine.txt\n"
        "rm /folders/handout/task.txt\n"
        "get /folders/../../../etc/passwd dotdot.txt\n"
        "get /../etc/hostname hostname.txt\n"
        "get passwd-link link.txt\n"
        "get root-link/etc/hostname root.txt\n"
        "get /folders/data/etc-link/hostname etc.txt\n"
        "put mine.txt /folders/data/etc-link/mine.txt\n"
        "put mine.txt passwd-link\n",
        tmp_path,
    )
    assert (tmp_path / "task.txt").read_text() == "read me\n"  # reading the share works
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt", "task.txt"], run.stderr
    assert sorted(os.listdir(folder_dir(gpu_hub, shared))) == ["task.txt"]
    assert not (Path("/etc") / "mine.txt").exists()
    assert os.readlink(folder_dir(gpu_hub, ann.folder) / "etc-link") == "/etc"
    assert "Permission denied" in run.stderr
    kept = client.ssh("readlink ~/passwd-link; head -c 4 /etc/passwd")
    assert kept.stdout == "/etc/passwd\nroot"  # the link itself was not written through


def test_sftp_writes_stop_at_the_storage_quota(gpu_hub, askpass, tmp_path):
    carol = QueueUser(gpu_hub, f"carol-{secrets.token_hex(3)}")
    gpu_hub.join_group(carol.name, {"fgpu_quota": {"storage": "1M"}})
    folder = make_folder(carol, "notes")
    (tmp_path / "big.bin").write_bytes(os.urandom(3 * MIB))
    token = carol.http.headers["Authorization"].split()[1]
    run = Client(gpu_hub, askpass, carol.name, token).sftp(
        "put big.bin /folders/notes/big.bin\n", tmp_path
    )
    assert "Failure" in run.stderr or "quota" in run.stderr, run.stderr
    stored = folder_dir(gpu_hub, folder) / "big.bin"
    assert stored.stat().st_size <= 1 * MIB


def new_key(folder: Path, name: str) -> tuple[Path, str]:
    """A fresh Ed25519 key pair: (its private key's path, its public key line)."""
    path = folder / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@laptop", "-f", path],
        check=True,
    )
    return path, path.with_suffix(".pub").read_text().strip()


def by_key(hub, login: str, key: Path, *command: str):
    """ssh with the key alone (no password asked)."""
    options = [
        *CLIENT_OPTIONS,
        "-o", "PubkeyAuthentication=yes",
        "-o", "PasswordAuthentication=no",
        "-o", "IdentitiesOnly=yes",
        "-o", "BatchMode=yes",
    ]  # fmt: skip
    argv = ["/usr/bin/ssh", "-T", *options, "-i", key, "-p", hub.env["FGPU_SSH_PORT"]]
    return subprocess.run(
        [*argv, f"{login}@127.0.0.1", *command], capture_output=True, text=True, timeout=120
    )


def test_a_key_the_user_adds_logs_in_until_it_is_removed(gpu_hub, ann, bob, tmp_path):
    key, public = new_key(tmp_path, "ann")
    added = ann.call("POST", "ssh-keys", json={"key": public})
    assert added.status_code == 201, added.text
    assert (added.json()["title"], added.json()["key"]) == ("ann@laptop", public)
    listed = ann.call("GET", "ssh-keys").json()["keys"]
    assert [k["id"] for k in listed] == [added.json()["id"]]
    shell = by_key(gpu_hub, ann.name, key, "echo $FGPU_SESSION_ID")
    assert shell.stdout.split() == [session_id(ann)], shell.stderr
    # Her key reaches her named servers too, and nobody else's account.
    lab = by_key(gpu_hub, f"{ann.name}-lab", key, "true")
    assert lab.returncode == 1
    assert "no running session on the server 'lab'" in lab.stderr
    assert by_key(gpu_hub, bob.name, key, "true").returncode == 255
    # Bob can neither see nor remove it; ann removes it, and it logs in no more.
    assert bob.call("GET", "ssh-keys").json()["keys"] == []
    assert bob.call("DELETE", f"ssh-keys/{added.json()['id']}").status_code == 404
    assert bob.call("GET", f"ssh-keys?user={ann.name}").status_code == 403
    assert ann.call("DELETE", f"ssh-keys/{added.json()['id']}").status_code == 204
    refused = by_key(gpu_hub, ann.name, key, "true")
    assert refused.returncode == 255 and "Permission denied" in refused.stderr


def test_bad_keys_are_refused_with_a_reason_and_kept_nowhere(gpu_hub, bob, tmp_path):
    key, public = new_key(tmp_path, "bob")
    cases = {
        "": 400,
        "ssh-ed25519 not-base64": 400,
        key.read_text(): 400,  # the private key
    }
    for text, status in cases.items():
        response = bob.call("POST", "ssh-keys", json={"key": text})
        assert response.status_code == status, response.text
    assert "private key" in bob.call("POST", "ssh-keys", json={"key": key.read_text()}).text
    assert bob.call("POST", "ssh-keys", json={"key": public}).status_code == 201
    again = bob.call("POST", "ssh-keys", json={"key": public})
    assert again.status_code == 409, again.text
    assert len(bob.call("GET", "ssh-keys").json()["keys"]) == 1


def test_an_admin_puts_a_key_in_for_a_user_and_nobody_else_can(gpu_hub, bob, tmp_path):
    admin = f"admin-{secrets.token_hex(3)}"
    made = gpu_hub.request("POST", f"users/{admin}", json={"admin": True})
    assert made.status_code == 201, made.text
    key, public = new_key(tmp_path, "for-bob")
    by_admin = QueueUser(gpu_hub, admin).call(
        "POST", f"ssh-keys?user={bob.name}", json={"key": public}
    )
    assert by_admin.status_code == 201, by_admin.text
    assert by_key(gpu_hub, bob.name, key, "true").returncode == 1  # in: no session, told so
    # A token without the service's scope, and a cross-site request with bob's cookie.
    narrow = gpu_hub.request(
        "POST", f"users/{bob.name}/tokens", json={"scopes": [f"read:users!user={bob.name}"]}
    ).json()["token"]
    url = f"{gpu_hub.url}/services/queue/api/ssh-keys"
    _, other = new_key(tmp_path, "other")
    answer = requests.post(url, json={"key": other}, headers={"Authorization": f"token {narrow}"})
    assert answer.status_code == 403, answer.text
    browser = logged_in(gpu_hub, bob.name)
    assert browser.get(f"{gpu_hub.url}/services/queue/sessions", timeout=60).status_code == 200
    forged = browser.post(url, headers=CROSS_SITE, json={"key": other}, timeout=60)
    assert forged.status_code == 403, forged.text
    titles = [k["title"] for k in bob.call("GET", "ssh-keys").json()["keys"]]
    assert "other@laptop" not in titles


def test_one_sftp_session_holds_a_bounded_number_of_files_open(gpu_hub, bob):
    """The descriptors are the queue service's: a client that opens without end is refused past
    the bound (asyncssh's client here, which can hold files open as OpenSSH's sftp cannot)."""
    make_folder(bob, "many")

    async def hold_open() -> tuple[int, str]:
        port = int(gpu_hub.env["FGPU_SSH_PORT"])
        async with asyncssh.connect(
            "127.0.0.1", port, username=bob.name, password=bob.token, known_hosts=None,
            client_keys=None,
        ) as connection, connection.start_sftp_client() as sftp:  # fmt: skip
            held, refusal = [], ""
            try:
                for i in range(MAX_OPEN_FILES + 1):
                    held.append(await sftp.open(f"/folders/many/f{i}", "w"))
            except asyncssh.SFTPError as e:
                refusal = e.reason
            for file in held:
                await file.close()
            again = await sftp.open("/folders/many/again", "w")  # room again once closed
            await again.close()
            return len(held), refusal

    held, refusal = asyncio.run(hold_open())
    assert (held, refusal) == (MAX_OPEN_FILES, f"At most {MAX_OPEN_FILES} files are open at once.")
