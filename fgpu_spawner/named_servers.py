"""A named-server limit that counts the servers a user runs or waits for, not the ones they keep.

`c.JupyterHub.named_server_limit_per_user = ActiveNamedServerLimit(5)`. JupyterHub's own integer
limit counts every named server a user has ever created and not deleted, stopped ones too; the
queue service launches each session under a fresh name and stopping it keeps the entry, so a
student would be locked out after five launches. This limit refuses, in the hub and before any
spawner runs, a start (or creation) of a named server while that user already has `limit` named
servers running, starting or waiting in the queue; stopped ones never count. The answer is
JupyterHub's own for its limit, a 400 with a message.

JupyterHub calls it with the request's handler: from the start and spawn-form routes
(`/hub/api/users/{name}/servers/{server}`, `/hub/spawn/{name}/{server}`) to check a request,
and from the home and admin pages only to show the number.
"""

from __future__ import annotations

from tornado import web


class ActiveNamedServerLimit:
    """A callable for `c.JupyterHub.named_server_limit_per_user`; 0 means no limit."""

    def __init__(self, limit: int):
        if limit < 0:
            raise ValueError(f"named server limit {limit} is not a count (0 or more)")
        self.limit = limit

    def __call__(self, handler) -> int:
        target = _target(handler)
        if target is None or not self.limit:
            return self.limit  # a page that only shows the number
        user, server_name = target
        active = [
            name
            for name, spawner in list(user.spawners.items())
            if name and name != server_name and spawner.active
        ]
        if len(active) >= self.limit:
            raise web.HTTPError(
                400,
                f"{user.name} already has {len(active)} named servers running or waiting to "
                f"start, the most one user may have at a time ({self.limit}). Stop one of them "
                "first.",
            )
        # Checked here; JupyterHub's own count, which includes stopped servers, is not applied.
        return 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.limit})"


def _target(handler):
    """(user, server name) a start or spawn-form request is for, or None on other pages.

    Both routes that check the limit take the user's name and the server's name as their first
    two path arguments; the check runs only after JupyterHub has found that user."""
    args = getattr(handler, "path_args", None) or []
    if len(args) < 2 or not args[1]:
        return None
    user = handler.find_user(args[0])
    return None if user is None else (user, args[1])
