"""SSH and SFTP into the hub (queue_service/ssh/) with Debian's OpenSSH client.

A real hub (the shipped config) with one user and a running session (no GPU). Three figures,
each against its baseline measured in the same run:

- `sftp` put and get of a `--size` MiB file (default 1,024) into a storage folder, against `cp`
  of the same file on the same disk (goal ≥ 0.5× both ways);
- `ssh user@hub true` (the password by SSH_ASKPASS, as scripts and VS Code send it), against
  `docker exec <session container> true` (goal ≤ 2×), median of `--rounds`;
- the same `ssh true` while `--attackers` clients (default 100) keep failing to log in from
  another loopback address (127.0.0.2), against the same login alone.

With `--gcm` the service offers AES-GCM alone (`QueueService.ssh_ciphers`), which OpenSSH's
client then takes instead of chacha20-poly1305.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import asyncssh

from tests.harness import TEST_LABEL, containers_with, queue_option, running_hub
from tests.test_ssh_hub import PASSWORD_ONLY

MIB = 1024 * 1024
SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "256M"}
#: The tests' OpenSSH options: a login by password alone, no host key kept.
OPTIONS = PASSWORD_ONLY
ATTACK_ADDRESS = "127.0.0.2"
#: `--gcm`: the ciphers that make OpenSSH's client take AES-GCM (QueueService.ssh_ciphers).
GCM = ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com"]


def make_file(path: Path, size: int) -> None:
    block = os.urandom(MIB)
    with open(path, "wb") as f:
        for _ in range(size // MIB):
            f.write(block)


class OpenSSH:
    """Debian's ssh and sftp as `login`, the password (a hub token) by SSH_ASKPASS."""

    def __init__(self, port: str, login: str, token: str, tmp: Path):
        askpass = tmp / "askpass"
        askpass.write_text('#!/bin/sh\nprintf "%s\\n" "$BENCH_SSH_PASSWORD"\n')
        askpass.chmod(0o700)
        self.port, self.login = port, login
        self.env = {
            **os.environ,
            "SSH_ASKPASS": str(askpass),
            "SSH_ASKPASS_REQUIRE": "force",
            "BENCH_SSH_PASSWORD": token,
        }

    def ssh(self, *command: str) -> float:
        argv = ["/usr/bin/ssh", "-T", *OPTIONS, "-p", self.port, f"{self.login}@127.0.0.1"]
        return timed([*argv, *command], env=self.env)

    def sftp(self, commands: str, cwd: Path) -> float:
        argv = ["/usr/bin/sftp", *OPTIONS, "-P", self.port, f"{self.login}@127.0.0.1"]
        return timed(argv, env=self.env, stdin=commands, cwd=cwd)


def timed(argv: list[str], env=None, stdin: str = "", cwd=None) -> float:
    start = time.perf_counter()
    run = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, cwd=cwd)
    elapsed = time.perf_counter() - start
    assert run.returncode == 0, (argv, run.stderr)
    return elapsed


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


class Attack:
    """`count` clients that log in with a wrong token from ATTACK_ADDRESS, again and again,
    until stopped: in a thread with its own event loop."""

    def __init__(self, port: int, login: str, count: int):
        self.port, self.login, self.count = port, login, count
        self.tries = self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> Attack:
        self._thread.start()
        time.sleep(2)  # the attack under way before the good logins are timed
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(120)

    async def _run(self) -> None:
        await asyncio.gather(*(self._client(n) for n in range(self.count)))

    async def _client(self, n: int) -> None:
        while not self._stop.is_set():
            self.tries += 1
            try:
                async with asyncssh.connect(
                    "127.0.0.1",
                    self.port,
                    local_addr=(ATTACK_ADDRESS, 0),
                    username=self.login,
                    password=f"wrong-token-{n}-{self.tries}",
                    known_hosts=None,
                    client_keys=None,
                    preferred_auth="password",
                    login_timeout=60,
                ):
                    raise AssertionError("a wrong token logged in")
            except (asyncssh.Error, OSError):
                self.refused += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024, help="MiB to put and get by sftp")
    parser.add_argument("--rounds", type=int, default=20, help="ssh and docker exec runs timed")
    parser.add_argument("--attackers", type=int, default=100, help="clients failing at once")
    parser.add_argument("--skip-sftp", action="store_true", help="only the logins")
    parser.add_argument("--gcm", action="store_true", help="the service offers AES-GCM alone")
    args = parser.parse_args()
    config = queue_option("ssh_ciphers", GCM) if args.gcm else ""
    with tempfile.TemporaryDirectory() as name, running_hub(Path(name) / "hub", config) as hub:
        tmp = Path(name)
        hub.create_user("bench")
        token = hub.user_token("bench")
        started = hub.start_server("bench", SESSION)
        assert started.status_code in (201, 202), started.text
        hub.wait_ready("bench")
        client = OpenSSH(hub.env["FGPU_SSH_PORT"], "bench", token, tmp)
        if not args.skip_sftp:
            sftp_figures(hub, client, token, tmp, args.size)
        (container,) = containers_with({"fgpu.user": "bench", TEST_LABEL: hub.run_id})
        login_figures(hub, client, container.id, args)


def sftp_figures(hub, client: OpenSSH, token: str, tmp: Path, size_mib: int) -> None:
    import requests

    http = requests.Session()
    http.headers["Authorization"] = f"token {token}"
    api = f"{hub.url}/services/queue/api/folders"
    created = http.post(api, json={"name": "data"}, timeout=60)
    assert created.status_code == 201, created.text
    source = tmp / "source.bin"
    make_file(source, size_mib * MIB)
    up = client.sftp("put source.bin /folders/data/big.bin\n", tmp)
    down = client.sftp("get /folders/data/big.bin down.bin\n", tmp)
    assert (tmp / "down.bin").stat().st_size == source.stat().st_size
    copy_in = timed(["cp", str(source), str(tmp / "copy.bin")])
    (tmp / "down.bin").unlink()
    copy_out = timed(["cp", str(tmp / "copy.bin"), str(tmp / "copy2.bin")])
    for leftover in ("copy.bin", "copy2.bin"):
        (tmp / leftover).unlink()
    mb = size_mib
    print(f"sftp put {mb} MiB: {up:.2f} s, {mb / up:.0f} MiB/s (cp: {mb / copy_in:.0f} MiB/s)")
    print(f"sftp get {mb} MiB: {down:.2f} s, {mb / down:.0f} MiB/s (cp: {mb / copy_out:.0f} MiB/s)")
    print(f"ratio to cp: put {copy_in / up:.2f}, get {copy_out / down:.2f} (goal >= 0.5)")


def login_figures(hub, client: OpenSSH, container_id: str, args) -> None:
    client.ssh("true")  # the first login warms the caches both sides keep
    ssh_alone, docker = [], []
    for _ in range(args.rounds):  # interleaved: a busy neighbour slows both alike
        ssh_alone.append(client.ssh("true"))
        docker.append(timed(["docker", "exec", container_id, "true"]))
    port = int(hub.env["FGPU_SSH_PORT"])
    with Attack(port, "bench", args.attackers) as attack:
        ssh_attacked = [client.ssh("true") for _ in range(args.rounds)]
    alone, exec_, attacked = median_ms(ssh_alone), median_ms(docker), median_ms(ssh_attacked)
    print(f"ssh true p50 {alone:.0f} ms (max {max(ssh_alone) * 1000:.0f})")
    print(f"docker exec true p50 {exec_:.0f} ms (max {max(docker) * 1000:.0f})")
    print(f"ratio ssh / docker exec: {alone / exec_:.2f} (goal <= 2)")
    print(
        f"ssh true during {args.attackers} failing clients ({attack.tries} tries, "
        f"{attack.refused} refused): p50 {attacked:.0f} ms (max {max(ssh_attacked) * 1000:.0f})"
    )
    print(f"ratio attacked / alone: {attacked / alone:.2f}")


if __name__ == "__main__":
    main()
