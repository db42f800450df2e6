"""The SSH listener: logins by hub API token (`hub_logins.py`), a shell or command in the login's
session (`shell.py`), SFTP to its files (`sftp.py`), local and dynamic port forwarding (`ssh -L`,
`ssh -D`) opened from inside the login's session (`forwarding.py`). Nothing else: no remote
forwarding (`ssh -R`: asyncssh's `server_requested` says no), no agent or X11 forwarding, and no
legacy `scp -O` (today's scp speaks SFTP). A source that keeps failing to log in is held back
(`login_throttle.py`).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import asyncssh
from asyncssh.encryption import get_encryption_algs

from .activity import SessionActivity
from .file_areas import FileAreas
from .forwarding import Forwards
from .host_key import host_key
from .hub_logins import HubUnanswered, TokenLogins, channel_login, extra_info_name
from .login_throttle import LoginThrottle, source_of
from .quick_acks import acknowledge_at_once
from .sftp import FolderSFTP
from .shell import Shells

#: Seconds a client has to log in.
LOGIN_SECONDS = 60
#: Threads for SFTP's file and database calls, apart from the queue service's.
SFTP_THREADS = 8


class HubLogin(asyncssh.SSHServer):
    """One connection's logins: by password (a hub API token) or by a public key the account
    keeps."""

    def __init__(self, logins: TokenLogins, throttle: LoginThrottle, forwards: Forwards):
        self.logins = logins
        self.throttle = throttle
        self.forwards = forwards
        self.conn = None
        self.source = ""

    def connection_made(self, conn) -> None:
        self.conn = conn
        self.source = source_of(conn.get_extra_info("peername"))
        if self.throttle.held_back(self.source):
            # Closed before the key exchange, the costly part of a connection.
            asyncio.get_running_loop().call_soon(conn.abort)
            return
        acknowledge_at_once(conn)

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    async def validate_password(self, username: str, password: str) -> bool:
        return await self._checked(username, self.logins.check, password, counted=True)

    async def validate_public_key(self, username: str, key) -> bool:
        # asyncssh checks the client's signature with this key once this says yes. A key no
        # account keeps is no failure: clients offer each of theirs in turn.
        return await self._checked(username, self.logins.check_key, key, counted=False)

    def connection_requested(self, dest_host: str, dest_port: int, orig_host, orig_port):
        """`ssh -L` and `ssh -D`: opened from inside the login's session, never from here."""
        return self.forwards.open(self.conn, channel_login(self.conn), dest_host, dest_port)

    async def _checked(self, username: str, check, secret, counted: bool) -> bool:
        """Whether `check` takes the login, in one of its source's turns; never checked while
        the source is held back. A hub that does not answer is no failure of the source's."""
        async with self.throttle.turn(self.source):
            if self.throttle.held_back(self.source):
                return False
            try:
                login = await check(username, secret)
            except HubUnanswered:
                return False
        if login is None:
            if counted:
                self.throttle.failed(self.source)
            return False
        self.throttle.succeeded(self.source)
        self.conn.set_extra_info(**{extra_info_name(username): login})
        return True


class SSHService:
    def __init__(
        self,
        logins: TokenLogins,
        throttle: LoginThrottle,
        shells: Shells,
        areas: FileAreas,
        measure,
        log,
    ):
        self.logins, self.shells, self.areas, self.measure = logins, shells, areas, measure
        self.throttle = throttle
        self.log = log
        self.server = None
        self.activity = SessionActivity(logins.hub, log)
        shells.activity = self.activity
        self.threads = ThreadPoolExecutor(SFTP_THREADS, thread_name_prefix="fgpu-sftp")

    async def listen(self, host: str, port: int, key_path: str, ciphers=()) -> None:
        """Listen on `host`:`port` with the host key at `key_path` (made there when missing),
        offering `ciphers` (empty: asyncssh's)."""
        key = await asyncio.to_thread(host_key, key_path)
        self.server = await asyncssh.create_server(
            self._connection,
            host or None,
            port,
            server_host_keys=[key],
            process_factory=self.shells.run,
            sftp_factory=lambda chan: FolderSFTP(chan, self.areas, self.measure, self.threads),
            allow_scp=False,
            encoding=None,
            line_editor=False,
            agent_forwarding=False,
            x11_forwarding=False,
            login_timeout=LOGIN_SECONDS,
            encryption_algs=list(ciphers) or (),
        )

    def _connection(self) -> HubLogin:
        shells = self.shells
        forwards = Forwards(shells.session_exec, shells.no_session, self.activity, self.log)
        return HubLogin(self.logins, self.throttle, forwards)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self.threads.shutdown(wait=False)


def cipher_names() -> list[str]:
    """The ciphers asyncssh can offer (`QueueService.ssh_ciphers` picks among them)."""
    return [name.decode() for name in get_encryption_algs()]
