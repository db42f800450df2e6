"""Who asked the hub to stop a server: the end reason a stop from the hub's own pages records.

A student's Sessions page stops a session through the queue service, which records who asked
(the owner, an admin, an instructor). The hub's own admin panel and REST API stop it through the
hub instead (`DELETE /hub/api/users/{name}/servers/{server}`), and the spawner's `stop()` is
told nothing of who asked: without this, an admin's stop from the panel read "Stopped by the
user" in the student's Finished tab.

`install()` wraps JupyterHub's `BaseHandler.stop_single_user`, the one place every hub-side stop
goes through with the request's caller at hand, so that the caller is in a context variable
while the stop runs; the spawner reads it (`end_reason_for`). The stop runs in a task the hub
creates inside that call, and a task copies the context it is created in, so the value reaches
the spawner without any state shared between requests.
"""

from __future__ import annotations

import contextvars
import functools

#: The hub's caller of the stop under way: (kind, name, admin), or None outside a hub request.
STOPPED_BY: contextvars.ContextVar[tuple[str, str, bool] | None] = contextvars.ContextVar(
    "fgpu_stopped_by", default=None
)
ADMIN = "admin"  # queue_service/core/end_reasons.py's code for an admin's stop


def end_reason_for(owner: str, stopper: tuple[str, str, bool] | None) -> str | None:
    """The end reason of a hub-side stop of `owner`'s server: `admin` when another user asked
    (only users with admin rights over servers may), None (the service's default, the user's
    own stop) otherwise. A service's stop (the idle culler, the queue service) says its own."""
    if stopper is None:
        return None
    kind, name, _admin = stopper
    if kind == "user" and name != owner:
        return ADMIN
    return None


def install() -> None:
    """Wrap JupyterHub's stop_single_user (once) so that the spawner knows who asked."""
    from jupyterhub.handlers.base import BaseHandler

    original = BaseHandler.stop_single_user
    if getattr(original, "_fgpu_wrapped", False):
        return

    @functools.wraps(original)
    async def stop_single_user(self, user, server_name=""):
        caller = self.current_user
        token = STOPPED_BY.set(_who(caller))
        try:
            return await original(self, user, server_name)
        finally:
            STOPPED_BY.reset(token)

    stop_single_user._fgpu_wrapped = True
    BaseHandler.stop_single_user = stop_single_user


def _who(caller) -> tuple[str, str, bool] | None:
    if caller is None:
        return None
    return (getattr(caller, "kind", "user"), caller.name, bool(getattr(caller, "admin", False)))
