"""The ciphers the SSH service offers (`QueueService.ssh_ciphers`): with AES-GCM alone offered,
Debian's OpenSSH client, whose own first choice is chacha20-poly1305, takes AES-GCM; with
nothing set it keeps its first choice; a name asyncssh does not know stops the service's
configuration with the name. The service's real listener (queue_service/ssh/server.py) on a
free port, without a hub: the cipher is settled in the key exchange, before any login (which
fails here: no hub answers). What it saves: benchmarks/README.md."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import threading

import pytest
from traitlets import TraitError

from queue_service.app import QueueService
from queue_service.hub_client import HubClient
from queue_service.ssh.hub_logins import TokenLogins
from queue_service.ssh.login_throttle import LoginThrottle
from queue_service.ssh.server import SSHService
from queue_service.ssh.shell import Shells

from .harness import free_port

LOG = logging.getLogger("test")
GCM = ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com"]


def cipher_taken(tmp_path, ciphers: list[str]) -> str:
    """The cipher OpenSSH's client settles on with a listener that offers `ciphers`."""
    hub = HubClient(f"http://127.0.0.1:{free_port()}/hub/api", "service-token")
    service = SSHService(
        TokenLogins(hub, keys=None, log=LOG),
        LoginThrottle(10, 60.0, LOG),
        Shells(None, "/sessions", LOG),
        None,
        None,
        LOG,
    )
    port, loop = free_port(), asyncio.new_event_loop()

    listen = service.listen("127.0.0.1", port, str(tmp_path / "host_key"), ciphers)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(listen, loop).result(30)
    try:
        options = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
        run = subprocess.run(
            ["/usr/bin/ssh", "-v", "-T", *options, "-o", "BatchMode=yes", "-p", str(port)]
            + ["ann@127.0.0.1", "true"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        loop.call_soon_threadsafe(service.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    assert run.returncode == 255  # no login: nothing answers for the hub
    (line,) = [x for x in run.stderr.splitlines() if "kex: server->client cipher:" in x]
    return line.split("cipher: ")[1].split()[0]


def test_offering_aes_gcm_alone_makes_openssh_take_it(tmp_path):
    assert cipher_taken(tmp_path, GCM) == "aes128-gcm@openssh.com"
    assert cipher_taken(tmp_path, []) == "chacha20-poly1305@openssh.com"


def test_an_unknown_cipher_is_refused_by_name():
    with pytest.raises(TraitError, match="ssh_ciphers: no cipher 'rot13'"):
        QueueService(ssh_ciphers=["aes128-gcm@openssh.com", "rot13"])
    assert QueueService(ssh_ciphers=GCM).ssh_ciphers == GCM
