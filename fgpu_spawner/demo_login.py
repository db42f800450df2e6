"""The shipped demo login: any user name gets in, and `admin` is an admin (DESIGN.md, contract 2).

That is fine for one person on 127.0.0.1 and an open door anywhere else, so the demo login
refuses to start when the hub's public address (`JupyterHub.bind_url`, set from FGPU_HUB_IP) is
not a loopback one, unless the admin says so explicitly (`allow_non_loopback`). A site uses a
real authenticator instead. The demo's settings (`allow_all`, `admin_users`) are configured on
this class alone in jupyterhub_config.py, so none of them reaches the site's authenticator.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlparse

from jupyterhub.auth import DummyAuthenticator
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
        f"authenticator for a site (README.md, 'Configuration'), or bind to 127.0.0.1 "
        f"(FGPU_HUB_IP). To run the demo login on the network anyway, set {ALLOW_ENV}=1 "
        f"(or c.DemoAuthenticator.allow_non_loopback = True)."
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
