"""Jupyter Server extension in every session: the session's planned end, for its status bar item.

The hub's queue service decides when a session ends by itself (a lifetime, an idle timeout) and
moves that end as the session is used. It tells the session through the hub's proxy, with its own
token: `PUT <base_url>fgpu/session-end` with the `ends` of its sessions API (or null). JupyterLab's
status bar item (session-status/) reads it back with `GET`. The browser cannot ask the queue
service itself: the service refuses scripted reads that lack its XSRF token, which no page of a
user's server may hold (they share the hub's origin).

Only the server's owner and the service reach this handler (the single-user server's own auth);
an owner who writes a false end fools only their own status bar.
"""

import json

from jupyter_server.base.handlers import APIHandler
from tornado import web

SETTING = "fgpu_session_end"
MAX_BODY = 4096


class SessionEndHandler(APIHandler):
    @web.authenticated
    def get(self):
        self.finish(json.dumps({"ends": self.settings.get(SETTING)}))

    @web.authenticated
    def put(self):
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
