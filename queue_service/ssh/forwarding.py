"""Local and dynamic port forwarding (`ssh -L`, `ssh -D`: direct-tcpip channels), opened from
inside the login's running session.

`ssh -L 9000:127.0.0.1:8888 ann@hub` reaches a server listening on 127.0.0.1:8888 of ann's
session, and `ssh -D` (a SOCKS proxy in the client, which VS Code's Remote-SSH uses) likewise:
each channel asks for a host and a port, and the connection to them is made by a small relay
process (`RELAY`, python3, which every image has) that the engine's exec starts in the session's
container (engine/session_exec.py), as the session's user. So the connection leaves from the
session's own network namespace, never from the service's: 127.0.0.1 is the session's, not the
hub's, and whatever a session cannot reach (another session, a port the hub's host keeps to
itself) a forward cannot either. The relay counts against the session's own limits (its
processes, its CPU), as a terminal in JupyterLab does.

The relay says `open` (or why not) on its stderr once it has connected or failed, before the
channel is confirmed, so a client hears "connect failed: Connection refused" as from any SSH
server. Then the channel's bytes go to the relay's stdin in frames (a 4-byte size, the bytes; a
size of 0 is the client's end of input, which ends the relay's sending side); the end of its
stdin (the channel closed) ends it. Its stdout comes back in the engine's frames (`Frames`), and
its exit (the far end closed) closes the channel. Flow control holds each side while the other's
buffer is full.

What the client sends counts as the session's activity for the idle culler (activity.py).

On a Swarm the relay runs in the session on its worker node, started by the node's agent as a
shell is (engine/swarm_exec.py), and its bytes come back the same way.

Refused, with a reason: a login without a running session (nothing is started), more than
`MAX_FORWARDS` channels at once on one connection. Remote forwarding (`-R`), agent and X11 forwarding stay refused (server.py).
"""

from __future__ import annotations

import asyncio
import functools
import struct

import asyncssh

from queue_service.core.ssh_logins import login_of
from queue_service.engine.errors import ENGINE_ERRORS
from queue_service.engine.session_exec import Frames, SessionBusy

from .activity import SessionActivity
from .hub_logins import Login

#: Channels one connection may hold open at once (VS Code holds a handful): each is a process in
#: the session (some 5 MiB of its memory) and an exec on the engine.
MAX_FORWARDS = 32
#: Seconds the relay tries to connect (an address that drops packets answers nothing).
CONNECT_SECONDS = 20
STDERR = 2
#: One frame of the channel's bytes to the relay: their size, then them.
SIZE = struct.Struct(">L")

#: The relay, run as `python3 -I -c RELAY host port` in the session (any python3).
RELAY = f"""
import os, socket, struct, sys, threading

def read(n):
    data = b""
    while len(data) < n:
        part = os.read(0, n - len(data))
        if not part:
            os._exit(0)
        data += part
    return data

def send(conn):
    try:
        while True:
            size = struct.unpack(">L", read(4))[0]
            if size:
                conn.sendall(read(size))
            else:
                conn.shutdown(socket.SHUT_WR)
    except OSError:
        os._exit(0)

try:
    conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), {CONNECT_SECONDS})
except (OSError, ValueError) as e:
    os.write(2, ("failed " + str(getattr(e, "strerror", None) or e) + "\\n").encode())
    sys.exit(1)
conn.settimeout(None)
os.write(2, b"open\\n")
threading.Thread(target=send, args=(conn,), daemon=True).start()
try:
    while True:
        data = conn.recv(65536)
        if not data:
            break
        while data:
            data = data[os.write(1, data):]
except OSError:
    pass
os._exit(0)
"""


class Forwards:
    """One connection's forwards (asyncssh's `SSHServer.connection_requested` hands them here)."""

    def __init__(self, session_exec, no_session, activity: SessionActivity, log):
        #: The engine's session exec (engine/session_exec.py, engine/swarm_exec.py), or None
        #: where the engine has none.
        self.session_exec = session_exec
        #: What a login without a running session is told (shell.py's `Shells.no_session`).
        self.no_session = no_session
        #: What the client sends through a forward is the session's activity (activity.py).
        self.activity = activity
        self.log = log
        self.open_now = 0

    def open(self, conn, login: Login, host: str, port: int):
        """The channel's session on `conn`, once the relay has connected (a coroutine asyncssh
        awaits before it confirms the channel), or ChannelOpenError with the reason."""
        if self.session_exec is None:
            raise _refused("This hub's engine cannot start processes in sessions.")
        if not 0 < port < 65536:
            raise _refused(f"No such port: {port}.")
        if self.open_now >= MAX_FORWARDS:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_RESOURCE_SHORTAGE, f"At most {MAX_FORWARDS} forwards at once."
            )
        self.open_now += 1
        return self._open(conn, login, host, port)

    async def _open(self, conn, login: Login, host: str, port: int) -> asyncssh.SSHTCPSession:
        try:
            relay = await self._start(login, host, port)
        except BaseException:
            self.open_now -= 1
            raise
        if conn.is_closed():
            # The client left while the relay connected: asyncssh drops the channel unseen.
            relay.close()
        relay.ended.add_done_callback(lambda _: self._closed())
        return relay.channel_side

    def _closed(self) -> None:
        self.open_now -= 1

    async def _start(self, login: Login, host: str, port: int) -> Relay:
        started = await self._exec(login, [str(host), str(port)])
        loop = asyncio.get_running_loop()
        used = functools.partial(self.activity.used, login)
        _, relay = await loop.create_connection(lambda: Relay(used), sock=started.sock)
        said = await relay.said
        if said != "open":
            relay.close()
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_CONNECT_FAILED, said.removeprefix("failed ") or "connect failed"
            )
        self.log.info("SSH: %s forwards to %s:%s", login_of(login.user, login.server), host, port)
        return relay

    async def _exec(self, login: Login, args: list[str]):
        """The relay started in the login's session."""
        try:
            found = await asyncio.to_thread(self.session_exec.session_of, login.user, login.server)
        except ENGINE_ERRORS as e:
            raise _refused(f"The hub cannot reach its sessions' engine now ({e}).") from e
        if found is None:
            raise _refused(self.no_session(login))
        container_id, session_id = found
        command = ["python3", "-I", "-c", RELAY, *args]
        start = functools.partial(
            self.session_exec.start, container_id, session_id, command, False, {}
        )
        try:
            return await asyncio.to_thread(start)
        except ENGINE_ERRORS as e:
            raise _refused(f"The session did not take the forward: {e}") from e
        except SessionBusy as e:
            raise _refused("The session is being saved as an image; try again shortly.") from e


class Relay(asyncio.Protocol):
    """The relay's exec connection. Its stderr's first line, the relay's word on connecting, is
    `said`; then its stdout goes to the channel (`channel_side`), and its end closes the
    channel."""

    def __init__(self, used):
        #: Called with each piece the client sends (activity.py).
        self.used = used
        loop = asyncio.get_running_loop()
        self.said: asyncio.Future[str] = loop.create_future()
        self.ended: asyncio.Future[None] = loop.create_future()
        self.frames = Frames()
        self.stderr = bytearray()
        self.transport = None
        self.channel_side = ChannelSide(self)
        #: Output that came before the channel was confirmed.
        self.early: list[bytes] = []

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        for stream, payload in self.frames.feed(data):
            if stream == STDERR:
                self._heard(payload)
            elif self.channel_side.chan is None:
                self.early.append(payload)
            elif not self.channel_side.chan.is_closing():
                self.channel_side.chan.write(payload)

    def _heard(self, payload: bytes) -> None:
        self.stderr += payload
        if not self.said.done() and b"\n" in self.stderr:
            self.said.set_result(self.stderr.split(b"\n", 1)[0].decode(errors="replace"))

    def eof_received(self) -> bool:
        return False  # the transport closes: connection_lost follows

    def connection_lost(self, exc) -> None:
        if not self.said.done():
            # The relay ended before it said a word (no python3 in the image, say).
            text = self.stderr.decode(errors="replace").strip() or "the relay did not start"
            self.said.set_result(f"failed {text}")
        chan = self.channel_side.chan
        if chan is not None and not chan.is_closing():
            chan.write_eof()
            chan.close()
        if not self.ended.done():
            self.ended.set_result(None)

    # The exec connection's buffer: hold the channel's input while it is full.
    def pause_writing(self) -> None:
        if self.channel_side.chan is not None:
            self.channel_side.chan.pause_reading()

    def resume_writing(self) -> None:
        if self.channel_side.chan is not None:
            self.channel_side.chan.resume_reading()

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(SIZE.pack(len(data)) + data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class ChannelSide(asyncssh.SSHTCPSession):
    """The SSH channel's end of a relay."""

    def __init__(self, relay: Relay):
        self.relay = relay
        self.chan = None

    def connection_made(self, chan) -> None:
        self.chan = chan
        for payload in self.relay.early:
            chan.write(payload)
        self.relay.early.clear()

    def data_received(self, data: bytes, datatype) -> None:
        if data:
            self.relay.send(data)
            self.relay.used()

    def eof_received(self) -> bool:
        self.relay.send(b"")  # the relay ends its sending side; its answers still come
        return True

    def connection_lost(self, exc) -> None:
        self.relay.close()  # the relay's stdin ends: the relay ends

    # The channel's window: hold the relay's output while the client takes no more.
    def pause_writing(self) -> None:
        if self.relay.transport is not None:
            self.relay.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.relay.transport is not None:
            self.relay.transport.resume_reading()


def _refused(reason: str) -> asyncssh.ChannelOpenError:
    return asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, reason)
