"""A throwaway OpenSSH server (Debian's `openssh-server`, installed here when missing): the
ceiling an SSH server in C reaches on this machine, next to which the SSH service's figures mean
something.

`NativeSSHD` runs `/usr/sbin/sshd -D` on 127.0.0.1 and a free port, with a host key, a client key
and a config of its own in a temporary directory (the machine's sshd config and keys are not
touched), and logs in as the user who runs the benchmark with that key. Its SFTP is Debian's
`/usr/lib/openssh/sftp-server`, as a stock server's.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
#: sshd's privilege separation directory, which it wants to exist (the package makes it at boot).
PRIVSEP_DIR = Path("/run/sshd")

CONFIG = """\
ListenAddress 127.0.0.1
Port {port}
HostKey {dir}/host_key
AuthorizedKeysFile {dir}/authorized_keys
PidFile none
UsePAM no
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
Subsystem sftp {sftp_server}
"""


def missing() -> str:
    """Why the native server cannot run here ('' when it can), after installing it as root where
    it is missing. A hub's machine needs no sshd, so setup does not install it; the package's own
    sshd on port 22, which it starts on a systemd machine, is stopped and disabled again."""
    if not all(os.path.exists(path) for path in (SSHD, SFTP_SERVER)) and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "openssh-server"]
        if (
            subprocess.run(install, env=env).returncode == 0
            and Path("/run/systemd/system").is_dir()
        ):
            subprocess.run(["systemctl", "disable", "--now", "ssh"])
    for path in (SSHD, SFTP_SERVER):
        if not os.path.exists(path):
            return f"{path} is missing: install Debian's openssh-server (as root: apt-get install openssh-server)"
    return ""


class NativeSSHD:
    """sshd on a free port while in its `with` block; `argv()` is how `sftp` logs in to it."""

    def __init__(self, directory: Path, port: int):
        self.dir, self.port = directory, port
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> NativeSSHD:
        self.dir.mkdir(parents=True, exist_ok=True)
        for name in ("host_key", "client_key"):
            keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.dir / name)]
            subprocess.run(keygen, check=True)
        (self.dir / "authorized_keys").write_text((self.dir / "client_key.pub").read_text())
        config = self.dir / "sshd_config"
        config.write_text(CONFIG.format(port=self.port, dir=self.dir, sftp_server=SFTP_SERVER))
        if os.getuid() == 0:
            PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
        log = open(self.dir / "sshd.log", "wb")
        self.process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=log)
        self._wait_listening()
        return self

    def _wait_listening(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = (self.dir / "sshd.log").read_text()
                raise RuntimeError(f"sshd exited: {log}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd does not listen on {self.port}")

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        self.process.wait(10)

    def argv(self, options: list[str]) -> list[str]:
        """`sftp` to this server with `options` (the benchmark's, its cipher), by key alone."""
        key = [
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-i",
            str(self.dir / "client_key"),
        ]
        return ["/usr/bin/sftp", *options, *key, "-P", str(self.port), f"{self.user}@127.0.0.1"]
