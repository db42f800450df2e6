"""Where a student lands after logging in: the queue service's Sessions page (docs/source/explanation/sessions-and-queue.md, "Asking for
a session"), where their sessions, the resource indicator and the launch dialog are.

JupyterHub calls `JupyterHub.default_url` when a login (or a visit to /hub/) carries no `next`;
a `next` from a link the student followed (/hub/login?next=/user/x/lab) is read first and wins.
"""

from __future__ import annotations

from jupyterhub.utils import url_path_join

#: The Sessions page, under the hub's base URL (queue_service/handlers/pages.py serves it).
SESSIONS_PAGE = "services/queue/sessions"


def sessions_page_url(handler) -> str:
    """`c.JupyterHub.default_url`: the Sessions page under this hub's public base URL."""
    return url_path_join(handler.base_url, SESSIONS_PAGE)
