"""The SSH service's host key: made once (Ed25519, mode 0600) in the hub's state directory, and
read from there at every start, so that clients see the same host across restarts. Never in git
(.gitignore) nor in an image; `fgpu-hub backup` keeps it with the other state files
(store/state_dir.py)."""

from __future__ import annotations

import os

import asyncssh

#: QueueService.ssh_host_key_file's default, in the state directory.
HOST_KEY_FILE = "fgpu_ssh_host_key"


def host_key(path: str) -> asyncssh.SSHKey:
    """The key at `path`, made there first when missing (by one process: O_EXCL)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return asyncssh.read_private_key(path)
    key = asyncssh.generate_private_key("ssh-ed25519")
    with os.fdopen(fd, "wb") as file:
        file.write(key.export_private_key())
    return key
