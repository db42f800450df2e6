"""A process inside a running session's container, by the engine's exec, for the SSH service's
shells and commands (queue_service/ssh/shell.py).

The process runs as the session's user (uid 1000, the images' jovyan) in the session's home,
inside the container: in its cgroup (its CPU and memory limits, its process limit), with its
mounts and its environment, as a terminal in JupyterLab is. The engine hands back the exec's
connection, a plain socket: with a terminal (`tty`), the bytes of the pseudo-terminal both ways;
without, the engine multiplexes stdout and stderr in frames (`Frames` splits them).

Only on the engine the service talks to (one host): `DockerEngine.session_exec` names this class.
On a Swarm the session's container is on another node's engine, which the service does not
reach: swarm_exec.py's `SwarmExec` has the same methods and goes through the node's agent.

An exec only starts while no commit holds the container: an exec that enters a container being
committed is what froze a session for good (container_calls.py). A shell started before a commit
goes on; the commit waits for no shell.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from dataclasses import dataclass

from .container_calls import ContainerLocks
from .errors import ENGINE_ERRORS
from .session_containers import DEPLOYMENT_LABEL, LIVE_STATES, SESSION_LABEL, server_of

#: The session user of the images (jovyan) and their home.
SESSION_USER = "1000"
HOME = "/home/jovyan"
#: How long an exited process's code is waited for once its output has ended.
EXIT_WAIT_SECONDS = 5.0


class SessionBusy(Exception):
    """A commit holds the session's container: no process may enter it now."""


@dataclass
class Exec:
    """A process started in a session: `sock` is its connection (the caller closes it)."""

    id: str
    sock: socket.socket
    tty: bool


class SessionExec:
    """Finds a user's running session container and starts processes in it (blocking calls:
    the caller runs them off the event loop)."""

    def __init__(self, client, locks: ContainerLocks, deployment_id: str):
        self.client = client
        self.locks = locks
        #: Only this hub's sessions: hubs may share an engine, and their users' names.
        self.deployment_id = deployment_id

    def session_of(self, user: str, server: str) -> tuple[str, str] | None:
        """(container id, session id) of `user`'s running session for `server`, or None."""
        containers = self.client.containers.list(
            filters={
                "label": [
                    SESSION_LABEL,
                    f"fgpu.user={user}",
                    f"{DEPLOYMENT_LABEL}={self.deployment_id}",
                ],
                "status": LIVE_STATES,
            },
            sparse=True,
            ignore_removed=True,
        )
        for container in containers:
            if server_of(container) == (user, server):
                return container.id, container.attrs["Labels"][SESSION_LABEL]
        return None

    def start(
        self, container_id: str, session_id: str, command: list[str], tty: bool, env: dict
    ) -> Exec:
        """Start `command` in the container as the session's user; SessionBusy while a commit
        holds it."""
        api = self.client.api
        with self.locks.exec_unless_committing(session_id) as held:
            if not held:
                raise SessionBusy(session_id)
            made = api.exec_create(
                container_id,
                command,
                stdin=True,
                stdout=True,
                stderr=True,
                tty=tty,
                user=SESSION_USER,
                environment=env,
                workdir=HOME,
            )
            stream = api.exec_start(made["Id"], tty=tty, socket=True)
        return Exec(made["Id"], _own_socket(stream), tty)

    def resize(self, process: Exec, width: int, height: int) -> None:
        if process.tty and width and height:
            # The process may have ended meanwhile: nothing to resize then.
            with contextlib.suppress(*ENGINE_ERRORS):
                self.client.api.exec_resize(process.id, height=height, width=width)

    def exit_code(self, process: Exec) -> int:
        """The process's exit code, once its output has ended (-1 when the engine never says:
        a container stopped under it)."""
        deadline = time.monotonic() + EXIT_WAIT_SECONDS
        while True:
            try:
                found = self.client.api.exec_inspect(process.id)
            except ENGINE_ERRORS:
                return -1
            if not found.get("Running") and found.get("ExitCode") is not None:
                return found["ExitCode"]
            if time.monotonic() > deadline:
                return -1
            time.sleep(0.05)


def _own_socket(stream) -> socket.socket:
    """The exec's connection as a socket of the caller's own. docker-py hands back its wrapper
    (SocketIO) of the socket its HTTP response holds; when docker-py's objects are collected they
    close that socket, under the caller's feet (a command's output was lost so). A duplicate
    descriptor keeps the connection open for as long as the caller holds it; docker-py's are
    closed here, at once."""
    raw = getattr(stream, "_sock", stream)
    own = raw.dup()
    response = getattr(stream, "_response", None)
    # (A closed wrapper's flush says ValueError.)
    with contextlib.suppress(OSError, ValueError):
        stream.close()
        if response is not None:
            response.close()
        raw.close()
    return own


class Frames:
    """Splits the engine's multiplexed stream of an exec without a terminal: each frame is a
    header (stream: 1 stdout, 2 stderr; three zero bytes; the size, 4 bytes big-endian) and the
    payload. Fed bytes as they come, it hands back the whole payloads found so far."""

    HEADER = struct.Struct(">BxxxL")

    def __init__(self):
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buffer += data
        found = []
        while len(self._buffer) >= self.HEADER.size:
            stream, size = self.HEADER.unpack_from(self._buffer)
            end = self.HEADER.size + size
            if len(self._buffer) < end:
                break
            found.append((stream, bytes(self._buffer[self.HEADER.size : end])))
            del self._buffer[:end]
        return found
