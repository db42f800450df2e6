"""Jupyter Server extension in every session: the session's planned end, for its status bar item.

The hub's queue service decides when a session ends by itself (a lifetime, an idle timeout) and
moves that end as the session is used. It tells the session through the hub's proxy:
`PUT <base_url>fgpu/session-end` with the `ends` of its sessions API (or null). JupyterLab's
status bar item (session-status/) reads it back with `GET`. The browser cannot ask the queue
service itself: the service refuses scripted reads that lack its XSRF token, which no page of a
user's server may hold (they share the hub's origin).

The service presents no token of its own: this server is the student's, and reads whatever
reaches it. It presents this session's end-notice key (`X-Fgpu-End-Notice-Key`), which the
spawner put in the environment as FGPU_END_NOTICE_KEY and which opens nothing but this handler.
A `PUT` without that key is refused, so nobody else can write a false end here; the owner, who
can read the key, fools only their own status bar. `GET` is the owner's (the server's own auth).
"""

import hmac
import json
import os

from jupyter_server.base.handlers import APIHandler
from tornado import web

try:  # jupyter_server 2.13 and later ask handlers open to unauthenticated callers to say so
    from jupyter_server.auth.decorator import allow_unauthenticated
except ImportError:  # pragma: no cover - older jupyter_server serves them anyway

    def allow_unauthenticated(method):
        return method


SETTING = "fgpu_session_end"
MAX_BODY = 4096
KEY_HEADER = "X-Fgpu-End-Notice-Key"
KEY_ENV = "FGPU_END_NOTICE_KEY"


def _key_matches(presented: str) -> bool:
    expected = os.environ.get(KEY_ENV, "")
    return bool(expected) and hmac.compare_digest(presented.encode(), expected.encode())


class SessionEndHandler(APIHandler):
    @web.authenticated
    def get(self):
        self.finish(json.dumps({"ends": self.settings.get(SETTING)}))

    def check_xsrf_cookie(self):
        # The service's PUT carries a header no cross-site form can send (a cross-site script
        # would need CORS, which this server does not grant); its key is checked in put().
        if self.request.method == "PUT" and KEY_HEADER in self.request.headers:
            return None
        return super().check_xsrf_cookie()

    @allow_unauthenticated
    def put(self):
        if not _key_matches(self.request.headers.get(KEY_HEADER, "")):
            raise web.HTTPError(403, "Only the hub's queue service tells this session its end.")
        if len(self.request.body) > MAX_BODY:
            raise web.HTTPError(413, "The planned end is a small JSON object.")
        try:
            ends = json.loads(self.request.body or b"null").get("ends")
        except (ValueError, AttributeError):
            raise web.HTTPError(400, 'Send {"ends": {...}} or {"ends": null}.') from None
        if ends is not None and not isinstance(ends, dict):
            raise web.HTTPError(400, "ends must be an object or null.")
        self.settings[SETTING] = ends
        self.set_status(204)
        self.finish()


def _jupyter_server_extension_points():
    return [{"module": "fgpu_session_end"}]


def _load_jupyter_server_extension(serverapp):
    route = serverapp.base_url.rstrip("/") + "/fgpu/session-end"
    serverapp.web_app.add_handlers(".*$", [(route, SessionEndHandler)])
