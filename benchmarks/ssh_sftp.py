"""SSH and SFTP into the hub (queue_service/ssh/) with Debian's OpenSSH client.

A real hub (the shipped config) with one user and a running session (no GPU). Three figures,
each against its baseline measured in the same run:

- `sftp` put and get of a `--size` MiB file (default 1,024) into a storage folder, against `cp`
  of the same file on the same disk (goal ≥ 0.5× both ways), median of `--transfers` rounds
  (default 3), with the CPU seconds the queue service spent on each. Two ceilings in the same
  rounds: the same `sftp` with OpenSSH's own server (a throwaway sshd, `native_sshd.py`: what an
  SSH server in C reaches on this machine, same client, same cipher), and with Debian's
  sftp-server through a pipe (`sftp -D`: the SFTP protocol without SSH). The cipher each
  negotiates is printed;
- `ssh user@hub true` (the password by SSH_ASKPASS, as scripts and VS Code send it), against
  `docker exec <session container> true` (goal ≤ 2×), median of `--rounds`;
- the same `ssh true` while `--attackers` clients (default 100) keep failing to log in from
  another loopback address (127.0.0.2), against the same login alone.

With `--gcm` the service offers AES-GCM alone (`QueueService.ssh_ciphers`), which OpenSSH's
client then takes instead of chacha20-poly1305; `--cipher NAME` makes the client ask for NAME of
both servers (`sftp -c`).
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

from tests.harness import TEST_LABEL, containers_with, free_port, queue_option, running_hub
from tests.test_ssh_hub import CLIENT_OPTIONS, PASSWORD_ONLY

from .native_sshd import SFTP_SERVER, NativeSSHD, missing

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

    def __init__(self, port: str, login: str, token: str, tmp: Path, options: list[str]):
        askpass = tmp / "askpass"
        askpass.write_text('#!/bin/sh\nprintf "%s\\n" "$BENCH_SSH_PASSWORD"\n')
        askpass.chmod(0o700)
        self.port, self.login, self.options = port, login, options
        self.env = {
            **os.environ,
            "SSH_ASKPASS": str(askpass),
            "SSH_ASKPASS_REQUIRE": "force",
            "BENCH_SSH_PASSWORD": token,
        }

    def ssh(self, *command: str) -> float:
        argv = ["/usr/bin/ssh", "-T", *self.options, "-p", self.port, f"{self.login}@127.0.0.1"]
        return timed([*argv, *command], env=self.env)

    def sftp_argv(self) -> list[str]:
        return ["/usr/bin/sftp", *self.options, "-P", self.port, f"{self.login}@127.0.0.1"]

    def sftp(self, commands: str, cwd: Path) -> float:
        return timed(self.sftp_argv(), env=self.env, stdin=commands, cwd=cwd)


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


def asked_cipher(args) -> list[str]:
    """The client's option that asks for `--cipher` (none: the client's own preference)."""
    return ["-c", args.cipher] if args.cipher else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024, help="MiB to put and get by sftp")
    parser.add_argument("--rounds", type=int, default=20, help="ssh and docker exec runs timed")
    parser.add_argument("--transfers", type=int, default=3, help="rounds of sftp put and get")
    parser.add_argument("--cipher", default="", help="the cipher OpenSSH's client asks (-c)")
    parser.add_argument("--attackers", type=int, default=100, help="clients failing at once")
    parser.add_argument("--skip-sftp", action="store_true", help="only the logins")
    parser.add_argument("--gcm", action="store_true", help="the service offers AES-GCM alone")
    args = parser.parse_args()
    if not args.skip_sftp and missing():
        parser.error(missing())
    options = [*OPTIONS, *asked_cipher(args)]
    config = queue_option("ssh_ciphers", GCM) if args.gcm else ""
    with tempfile.TemporaryDirectory() as name, running_hub(Path(name) / "hub", config) as hub:
        tmp = Path(name)
        hub.create_user("bench")
        token = hub.user_token("bench")
        started = hub.start_server("bench", SESSION)
        assert started.status_code in (201, 202), started.text
        hub.wait_ready("bench")
        (container,) = containers_with({"fgpu.user": "bench", TEST_LABEL: hub.run_id})
        client = OpenSSH(hub.env["FGPU_SSH_PORT"], "bench", token, tmp, options)
        if not args.skip_sftp:
            sftp_figures(hub, client, token, tmp, args)
        login_figures(hub, client, container.id, args)


def sftp_figures(hub, client: OpenSSH, token: str, tmp: Path, args) -> None:
    """`--transfers` rounds, each: `cp` both ways, then `sftp` put and get with the SSH service,
    with OpenSSH's own server (the ceiling of an SSH server in C here) and with sftp-server
    through a pipe (the SFTP protocol without SSH); medians of the rounds."""
    import requests

    http = requests.Session()
    http.headers["Authorization"] = f"token {token}"
    api = f"{hub.url}/services/queue/api/folders"
    created = http.post(api, json={"name": "data"}, timeout=60)
    assert created.status_code == 201, created.text
    source = tmp / "source.bin"
    make_file(source, args.size * MIB)
    service = ServiceCPU(hub.env["FGPU_SSH_PORT"])
    figures: dict[str, list[float]] = {}
    with NativeSSHD(tmp / "native-sshd", free_port()) as native:
        native_argv = native.argv([*CLIENT_OPTIONS, *asked_cipher(args)])
        print(
            f"cipher negotiated: SSH service {negotiated(client.sftp_argv(), client.env)}, "
            f"OpenSSH's sshd {negotiated(native_argv, None)}"
        )
        for _ in range(args.transfers):
            one_round(figures, client, native_argv, service, tmp)
    report(figures, args.size, args.transfers)
    (tmp / "source.bin").unlink()


def one_round(figures: dict, client: OpenSSH, native_argv: list[str], service, tmp: Path) -> None:
    def note(name: str, seconds: float) -> None:
        figures.setdefault(name, []).append(seconds)

    note("cp in", timed(["cp", "source.bin", "copy.bin"], cwd=tmp))
    note("cp out", timed(["cp", "copy.bin", "copy2.bin"], cwd=tmp))
    for name, commands in (
        ("put", "put source.bin /folders/data/big.bin\n"),
        ("get", "get /folders/data/big.bin down.bin\n"),
    ):
        cpu_before = service.seconds()
        note(f"service {name}", client.sftp(commands, tmp))
        note(f"service CPU {name}", service.seconds() - cpu_before)
    note("native put", timed(native_argv, stdin=f"put source.bin {tmp}/native.bin\n", cwd=tmp))
    note("native get", timed(native_argv, stdin=f"get {tmp}/native.bin down.bin\n", cwd=tmp))
    direct = ["/usr/bin/sftp", "-D", SFTP_SERVER]
    note("pipe put", timed(direct, stdin=f"put source.bin {tmp}/pipe.bin\n", cwd=tmp))
    note("pipe get", timed(direct, stdin=f"get {tmp}/pipe.bin down.bin\n", cwd=tmp))
    assert (tmp / "down.bin").stat().st_size == (tmp / "source.bin").stat().st_size
    for leftover in ("copy.bin", "copy2.bin", "down.bin", "native.bin", "pipe.bin"):
        (tmp / leftover).unlink()


def report(figures: dict[str, list[float]], size_mib: int, rounds: int) -> None:
    def rate(name: str) -> float:
        return size_mib / statistics.median(figures[name])

    print(f"sftp of {size_mib} MiB, medians of {rounds} rounds, MiB/s:")
    for way, copy in (("put", "cp in"), ("get", "cp out")):
        cp, ours = rate(copy), rate(f"service {way}")
        native, pipe = rate(f"native {way}"), rate(f"pipe {way}")
        cpu = statistics.median(figures[f"service CPU {way}"])
        print(
            f"  {way}: cp {cp:.0f}, SSH service {ours:.0f} ({cpu:.2f} CPU s, "
            f"{size_mib / cpu:.0f} MiB per CPU s), OpenSSH's sshd {native:.0f}, "
            f"sftp-server by pipe {pipe:.0f}"
        )
        print(
            f"  {way} ratios: service/cp {ours / cp:.2f} (goal >= 0.5), service/sshd "
            f"{ours / native:.2f}, sshd/cp {native / cp:.2f}, pipe/cp {pipe / cp:.2f}"
        )


def negotiated(argv: list[str], env) -> str:
    """The cipher OpenSSH's client and the server at `argv` agree on (its `-v` says)."""
    verbose = [argv[0], "-o", "LogLevel=DEBUG1", *argv[1:]]  # the first LogLevel given wins
    run = subprocess.run(verbose, input="bye\n", capture_output=True, text=True, env=env)
    for line in run.stderr.splitlines():
        if "kex: server->client cipher:" in line:
            return line.split("cipher:")[1].split()[0]
    return f"unknown (exit {run.returncode}: {run.stderr[-300:]})"


class ServiceCPU:
    """CPU seconds the queue service (the process that listens on the SSH port) has spent."""

    def __init__(self, port: str):
        listening = subprocess.run(
            ["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, check=True
        ).stdout
        self.pid = int(listening.split("pid=")[1].split(",")[0])

    def seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
