"""A login's shell or command, inside its running session (engine/session_exec.py).

`ssh ann@hub` opens a login shell in ann's running default session, with a terminal when the
client asks for one; `ssh ann@hub python -c 'print(1)'` runs the command there and exits with its
code. The process is the session's user's, in the session's container: its limits, its files, its
`nvidia-smi`. Bytes go both ways unchanged (no line editing here: the terminal is the session's);
a client's window size follows to the terminal; a client's end of input closes the process's (without a terminal).

Nothing is started for a login that has no running session: it is told to start one on the
Sessions page, and the exit code is 1. The engine backend's `session_exec` starts the process: on
one host by the engine's exec (engine/session_exec.py), on a Swarm by the agent of the session's
node, which connects back (engine/swarm_exec.py); both hand back the same connection. A backend
without one (none of the shipped) gets a login told so.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools

import asyncssh

from queue_service.core.ssh_logins import login_of
from queue_service.engine.errors import ENGINE_ERRORS
from queue_service.engine.session_exec import Frames, SessionBusy

from .hub_logins import Login, channel_login

#: A login shell: bash where the image has it, else sh.
LOGIN_SHELL = ["/bin/sh", "-c", 'exec "$(command -v bash || echo /bin/sh)" -l']
READ_BYTES = 65536
#: The exit code of a login that reached no session.
NO_SESSION = 1


class Shells:
    """Runs each SSH session's process (asyncssh's `process_factory`)."""

    def __init__(self, session_exec, sessions_url: str, log):
        #: engine/session_exec.py's SessionExec, or None where the engine has none.
        self.session_exec = session_exec
        self.sessions_url = sessions_url
        self.log = log
        #: What the client types counts as the session's activity (activity.py; set by server.py).
        self.activity = None

    async def run(self, process: asyncssh.SSHServerProcess) -> None:
        login: Login = channel_login(process)
        try:
            code = await self._run(process, login)
        except Exception as e:
            self.log.exception("SSH session of %s failed", login_of(login.user, login.server))
            process.stderr.write(f"The hub could not open the session: {e}\r\n".encode())
            code = 1
        process.exit(code)

    async def _run(self, process: asyncssh.SSHServerProcess, login: Login) -> int:
        if self.session_exec is None:
            return _tell(
                process,
                "This hub's engine starts no shells in sessions. "
                "sftp to the same address reaches your files.",
            )
        try:
            found = await asyncio.to_thread(self.session_exec.session_of, login.user, login.server)
        except ENGINE_ERRORS as e:
            return _tell(process, f"The hub cannot reach its sessions' engine now ({e}).")
        if found is None:
            return _tell(process, self.no_session(login))
        container_id, session_id = found
        tty = process.term_type is not None
        command = ["/bin/sh", "-c", process.command] if process.command else LOGIN_SHELL
        env = {"TERM": process.term_type} if tty else {}
        start = functools.partial(
            self.session_exec.start, container_id, session_id, command, tty, env
        )
        try:
            started = await asyncio.to_thread(start)
        except ENGINE_ERRORS as e:
            return _tell(process, f"The session did not take the shell: {e}")
        except SessionBusy:
            return _tell(process, "The session is being saved as an image; try again shortly.")
        self.log.info("SSH: %s entered session %s", login_of(login.user, login.server), session_id)
        width, height, _, _ = process.term_size
        await asyncio.to_thread(self.session_exec.resize, started, width, height)
        return await self._bridge(process, started, login)

    def no_session(self, login: Login) -> str:
        which = f"server {login.server!r}" if login.server else "default server"
        return (
            f"{login.user} has no running session on the {which}. Start one on the Sessions "
            f"page ({self.sessions_url}), then ssh again; sftp reaches your files without one."
        )

    async def _bridge(self, process: asyncssh.SSHServerProcess, started, login: Login) -> int:
        reader, writer = await asyncio.open_connection(sock=started.sock)
        feeding = asyncio.create_task(self._feed(process, writer, started, login))
        try:
            await _copy_out(process, reader, started.tty)
        finally:
            feeding.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await feeding
            writer.close()
        return await asyncio.to_thread(self.session_exec.exit_code, started)

    async def _feed(self, process: asyncssh.SSHServerProcess, writer, started, login) -> None:
        """The client's input to the process; its end closes the process's input."""
        while True:
            try:
                data = await process.stdin.read(READ_BYTES)
            except asyncssh.TerminalSizeChanged as change:
                resize = self.session_exec.resize
                await asyncio.to_thread(resize, started, change.width, change.height)
                continue
            except (asyncssh.BreakReceived, asyncssh.SignalReceived):
                continue
            if not data:
                # A terminal has no end of input (^D is a byte on it), and the engine drops a
                # terminal's output once its input is closed: only a pipe's input is closed.
                if not started.tty and writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            if self.activity is not None:
                self.activity.used(login)
            await writer.drain()


async def _copy_out(process: asyncssh.SSHServerProcess, reader, tty: bool) -> None:
    """The process's output to the client: as it comes with a terminal, else split into stdout
    and stderr from the engine's frames."""
    frames = Frames()
    while data := await reader.read(READ_BYTES):
        if tty:
            process.stdout.write(data)
            continue
        for stream, payload in frames.feed(data):
            (process.stderr if stream == 2 else process.stdout).write(payload)


def _tell(process: asyncssh.SSHServerProcess, message: str) -> int:
    process.stderr.write((message + "\r\n").encode())
    return NO_SESSION
