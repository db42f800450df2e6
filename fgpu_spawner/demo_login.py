"""The shipped demo login: any user name gets in, and `admin` is an admin (docs/source/explanation/contracts.md, contract 2).

That is fine for one person on 127.0.0.1 and an open door anywhere else, so the demo login
refuses to start when the hub's public address (`JupyterHub.bind_url`, set from FGPU_HUB_IP) is
not a loopback one, unless the admin says so explicitly (`allow_non_loopback`). A site uses a
real authenticator instead. The demo's settings (`allow_all`, `admin_users`) are configured on
this class alone in jupyterhub_config.py, so none of them reaches the site's authenticator.

The hub's own port (`hub_ip:hub_port`) serves `/hub/login` and the token API too, and sessions
reach it (the session network's gateway on one host, every address in Swarm mode). So a demo
login is taken only from a connection that comes from this machine itself (the proxy behind the
loopback public address), never from a session (docs/source/howto/demo-login.md, "The demo login").
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from urllib.parse import urlparse

from jupyterhub.auth import DummyAuthenticator
from jupyterhub.handlers.login import LoginHandler
from tornado import web
from traitlets import Bool

#: The environment variable jupyterhub_config.py reads into `allow_non_loopback`.
ALLOW_ENV = "FGPU_DEMO_LOGIN_ON_NETWORK"


def is_loopback_url(url: str) -> bool:
    """Whether a bind URL listens on a loopback address only. An empty host (all interfaces), a
    name other than `localhost`, and a Unix socket (a reverse proxy may publish it) are not."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https"):
        return False
    host = parsed.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def demo_login_refusal(bind_url: str, allowed: bool) -> str | None:
    """Why the demo login must not run at `bind_url`, or None. Pure."""
    if allowed or is_loopback_url(bind_url):
        return None
    return (
        f"Refusing to start: the demo login (any user name gets in, and 'admin' is an admin) "
        f"would be reachable at {bind_url}, which is not a loopback address. Configure a real "
        f"authenticator for a site (docs/source/howto/configure.md, 'Configuration'), or bind to 127.0.0.1 "
        f"(FGPU_HUB_IP). To run the demo login on the network anyway, set {ALLOW_ENV}=1 "
        f"(or c.DemoAuthenticator.allow_non_loopback = True)."
    )


def comes_from_this_machine(peer_ip: str | None) -> bool:
    """Whether a connection to the hub was opened on this machine: from a loopback address or
    from one of this machine's own (the proxy's, to the session network's gateway, comes from
    one: the engine's NAT may rewrite it to the host's main address). A session's comes from its
    container's address, which is not this machine's. None (a Unix socket) is local."""
    if peer_ip is None:
        return True
    peer = _plain_ip(peer_ip)
    return peer.is_loopback or is_own_address(peer)


def is_own_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether `address` is one of this machine's: only those can be bound. Where the kernel lets
    any address be bound (ip_nonlocal_bind), that proves nothing, and the answer is no."""
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    if _binds_any_address(address.version):
        return False
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:
            return False
    return True


def _binds_any_address(version: int) -> bool:
    setting = Path(f"/proc/sys/net/ipv{version}/ip_nonlocal_bind")
    try:
        return setting.read_text().strip() != "0"
    except OSError:
        return False


def _plain_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """`text` as an address, an IPv4 one written as IPv6 (::ffff:a.b.c.d) as IPv4."""
    address = ipaddress.ip_address(text.split("%")[0])
    if address.version == 6 and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def peer_address(handler) -> str | None:
    """The IP a request's connection came from; None for a Unix socket. The socket's own, never
    X-Forwarded-For, which anyone who reaches the hub's port can write."""
    address = getattr(handler.request.connection.context, "address", None)
    return address[0] if isinstance(address, tuple) else None


def off_public_address_refusal(public_url: str) -> str:
    """What a demo login that came to the hub's own port, not the public address, is told."""
    return (
        f"The demo login is taken only at {public_url}, from this machine: not on the hub's own "
        f"port, which sessions reach. A site configures a real authenticator."
    )


class DemoAuthenticator(DummyAuthenticator):
    """DummyAuthenticator that stays on a loopback address unless told otherwise."""

    allow_non_loopback = Bool(
        False,
        config=True,
        help="""
        Let the demo login run on an address other than a loopback one (127.0.0.1, ::1,
        localhost). Anyone who reaches the hub then logs in under any name, `admin` included.
        Off by default: the hub refuses to start.

        Example::

            c.DemoAuthenticator.allow_non_loopback = True
        """,
    )

    @property
    def demo_login_note(self) -> str:
        """What the login page says under the password field (templates/hub/login.html)."""
        if self.password:
            return (
                "Demo login: any user name, with this hub's shared password "
                "(ask whoever runs the hub). The user admin is an administrator."
            )
        return (
            "Demo login: any user name signs you in, and the password is not checked; leave it "
            "empty. The user admin is an administrator. A site sets up a real login instead."
        )

    async def authenticate(self, handler, data):
        """Any name, as DummyAuthenticator, but only from this machine (see the module's note).
        Checked here too, not only on the login page: the token API takes a password as well."""
        if handler is not None:
            self.refuse_unless_from_this_machine(handler)
        return await super().authenticate(handler, data)

    def refuse_unless_from_this_machine(self, handler) -> None:
        """A 403 saying where to log in, for a request that came to the hub's own port from
        elsewhere (a session); nothing when the demo login may run on the network."""
        if self.allow_non_loopback:
            return
        peer = peer_address(handler)
        if comes_from_this_machine(peer):
            return
        self.log.warning("Demo login refused from %s on the hub's own port", peer)
        refusal = off_public_address_refusal(getattr(self.parent, "bind_url", "127.0.0.1"))
        error = web.HTTPError(403, "%s", refusal)
        # What the hub's error and login pages show (a plain HTTPError's text is not).
        error.jupyterhub_message = refusal
        raise error

    def get_handlers(self, app):
        return [("/login", DemoLoginHandler)]

    def check_allow_config(self):
        super().check_allow_config()
        bind_url = getattr(self.parent, "bind_url", "")
        refusal = demo_login_refusal(bind_url, self.allow_non_loopback)
        if refusal:
            self.log.critical(refusal)
            # Before the proxy and services start: the process ends here, nothing is left running.
            raise SystemExit(1)
        if not is_loopback_url(bind_url):
            self.log.warning("The demo login runs on %s: anyone can log in as admin.", bind_url)


class DemoLoginHandler(LoginHandler):
    """The hub's login page, not even shown to a session: where the network lets sessions reach
    the hub's own port, they get a 403 that says where to log in instead."""

    async def prepare(self):
        self.authenticator.refuse_unless_from_this_machine(self)
        await super().prepare()
