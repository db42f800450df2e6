"""A named-server limit that counts the servers a user runs or waits for, not the ones they keep.

`c.JupyterHub.named_server_limit_per_user = ActiveNamedServerLimit(5)`. JupyterHub's own integer
limit counts every named server a user has ever created and not deleted, stopped ones too; the
queue service launches each session under a fresh name and stopping it keeps the entry, so a
student would be locked out after five launches. This limit refuses, in the hub and before any
spawner runs, a start (or creation) of a named server while that user already has `limit` named
servers running, starting or waiting in the queue; stopped ones never count. The answer is
JupyterHub's own for its limit, a 400 with a message.

Batch jobs waiting in the queue count against a limit of their own there (the service's
`jobs_waiting_per_user`), not against the `pending` quota, and the hub follows: a session's start
counts the servers running, starting or waiting, less the batch jobs still waiting for their
turn, against `limit` (sessions + pending); a batch job's start (`"type": "batch"` in its
options) counts them all against `limit + jobs_waiting`.

JupyterHub calls it with the request's handler: from the start and spawn-form routes
(`/hub/api/users/{name}/servers/{server}`, `/hub/spawn/{name}/{server}`) to check a request,
and from the home and admin pages only to show the number.
"""

from __future__ import annotations

import json

from tornado import web


class ActiveNamedServerLimit:
    """A callable for `c.JupyterHub.named_server_limit_per_user`; 0 means no limit."""

    def __init__(self, limit: int, jobs_waiting: int = 0):
        if limit < 0 or jobs_waiting < 0:
            raise ValueError(
                f"named server limit {limit} (+ {jobs_waiting} jobs) is not a count (0 or more)"
            )
        self.limit = limit
        #: Room for batch jobs waiting (the service's jobs_waiting_per_user); 0: no limit on them.
        self.jobs_waiting = jobs_waiting

    def __call__(self, handler) -> int:
        target = _target(handler)
        if target is None or not self.limit:
            return self.limit  # a page that only shows the number
        user, server_name = target
        active = [
            spawner
            for name, spawner in list(user.spawners.items())
            if name and name != server_name and spawner.active
        ]
        if _starts_a_job(handler):
            if not self.jobs_waiting:
                return 0
            limit, what = self.limit + self.jobs_waiting, "with batch jobs waiting"
        else:
            active = [spawner for spawner in active if not _waiting_job(spawner)]
            limit, what = self.limit, "besides batch jobs waiting"
        if len(active) >= limit:
            raise web.HTTPError(
                400,
                f"{user.name} already has {len(active)} named servers running or waiting to "
                f"start, the most one user may have at a time ({limit}, {what}). Stop one of "
                "them first.",
            )
        # Checked here; JupyterHub's own count, which includes stopped servers, is not applied.
        return 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.limit}, jobs_waiting={self.jobs_waiting})"


def _waiting_job(spawner) -> bool:
    """A batch job's server whose start still waits (in the queue, for its grant)."""
    options = getattr(spawner, "user_options", None) or {}
    return isinstance(options, dict) and options.get("type") == "batch" and bool(spawner.pending)


def _starts_a_job(handler) -> bool:
    """Whether the request starts a batch job: its JSON body (the REST API's start) says
    `"type": "batch"`. The spawn form starts sessions."""
    request = getattr(handler, "request", None)
    body = getattr(request, "body", None) or b""
    if not body.lstrip().startswith(b"{"):
        return False
    try:
        options = json.loads(body)
    except ValueError:
        return False
    return isinstance(options, dict) and options.get("type") == "batch"


def _target(handler):
    """(user, server name) a start or spawn-form request is for, or None on other pages.

    Both routes that check the limit take the user's name and the server's name as their first
    two path arguments; the check runs only after JupyterHub has found that user."""
    args = getattr(handler, "path_args", None) or []
    if len(args) < 2 or not args[1]:
        return None
    user = _loaded_user(handler, args[0]) or handler.find_user(args[0])
    return None if user is None else (user, args[1])


def _loaded_user(handler, name: str):
    """The hub's own wrapper of user `name` if it holds it, which it does for a user it has just
    found for this request: another `find_user` is a query with its relations loaded, a tenth of
    the hub's time while a class starts at once."""
    for user in list(dict.values(getattr(handler, "users", None) or {})):
        if user.name == name:
            return user
    return None
