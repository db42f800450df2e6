"""Tells each running session when it will end by itself, for its JupyterLab status bar.

Every round of the automatic ends (automatic_ends.py) hands the planned end of each running session
(its `ends` in the sessions API, or None) to `EndNotice`. A session is told through the hub's proxy,
as any client reaches a user's server: `PUT <proxy>/user/<name>/<server>/fgpu/session-end`, served
inside the session by the image's server extension
(image_catalog/recipes/jupyter-base/fgpu_session_end.py). Told when the end changes, and again
every `resend_after` seconds (a restarted server forgets); a failure (the server is starting, an
image without the extension) is tried again next round, never raised.

**No credential of the service's goes with it.** The receiving end is the student's own server,
which loads the student's own configuration from a home that persists: whatever reaches it, the
student can read. So the notice carries only that session's own end-notice key, an HMAC of the
session id under the service's secret (`end_notice_key`), which the spawner puts in the session's
environment (FGPU_END_NOTICE_KEY) when it starts it, and which opens nothing but this one
session's notice (docs/source/explanation/security.md).

It works alike on one host and on a Swarm: the proxy reaches every session.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

CALL_TIMEOUT_S = 5.0
RESEND_AFTER_S = 300.0
MAX_CLIENTS = 10
#: The header the session's server extension reads the key from (the extension, in the image,
#: names it again: it imports nothing of the service's).
KEY_HEADER = "X-Fgpu-End-Notice-Key"
_KEY_PURPOSE = b"fgpu session end notice\0"


def end_notice_key(secret: bytes, session_id: str) -> str:
    """The key that lets the service tell session `session_id` its planned end, and does nothing
    else. Derived (not stored), so that it survives a restart of the service with its secret."""
    return hmac.new(secret, _KEY_PURPOSE + session_id.encode(), hashlib.sha256).hexdigest()


def session_end_url(proxy_url: str, base_url: str, user: str, server_name: str) -> str:
    """Where a session's server extension takes its planned end, through the proxy."""
    server = "/".join(quote(part, safe="") for part in (user, server_name) if part)
    return f"{proxy_url.rstrip('/')}{base_url.rstrip('/')}/user/{server}/fgpu/session-end"


class EndNotice:
    """Keeps running sessions told of their planned ends (see the module's docstring)."""

    def __init__(
        self,
        proxy_url: str,
        base_url: str,
        key_of: Callable[[str], str],
        resend_after: float = RESEND_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
        log=None,
    ):
        self.proxy_url = proxy_url
        self.base_url = base_url
        # session id → that session's end-notice key (end_notice_key under the service's secret).
        self.key_of = key_of
        self.resend_after = resend_after
        self.clock = clock
        self.log = log
        self._told: dict[str, tuple[str, float]] = {}
        self._client: AsyncHTTPClient | None = None

    async def tell(self, ends: dict[str, tuple[str, str, dict | None]]) -> None:
        """`ends`: session id → (user, server name, its `ends` view or None), for every running
        session; sessions not named any more are forgotten."""
        self._told = {sid: told for sid, told in self._told.items() if sid in ends}
        due = [(sid, *what) for sid, what in ends.items() if self._due(sid, what[2])]
        await asyncio.gather(*(self._tell_one(*args) for args in due))

    def _due(self, session_id: str, view: dict | None) -> bool:
        told = self._told.get(session_id)
        return told is None or told[0] != _body(view) or self.clock() - told[1] > self.resend_after

    async def _tell_one(self, session_id: str, user: str, server: str, view: dict | None) -> None:
        body = _body(view)
        request = HTTPRequest(
            session_end_url(self.proxy_url, self.base_url, user, server),
            method="PUT",
            headers={KEY_HEADER: self.key_of(session_id), "Content-Type": "application/json"},
            body=body,
            request_timeout=CALL_TIMEOUT_S,
            follow_redirects=False,
        )
        try:
            await self._http().fetch(request)
        except (HTTPClientError, OSError) as e:
            if self.log:
                self.log.debug("session %s not told its planned end: %s", session_id, e)
            return
        self._told[session_id] = (body, self.clock())

    def _http(self) -> AsyncHTTPClient:
        if self._client is None:
            self._client = AsyncHTTPClient(force_instance=True, max_clients=MAX_CLIENTS)
        return self._client


def _body(view: dict | None) -> str:
    return json.dumps({"ends": view}, sort_keys=True)
