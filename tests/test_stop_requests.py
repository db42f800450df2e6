"""Who asked the hub to stop a server (fgpu_spawner/stop_requests.py): another user's stop is
an admin's; the owner's own, a service's and one outside a hub request say nothing."""

from __future__ import annotations

import asyncio

from fgpu_spawner.stop_requests import STOPPED_BY, end_reason_for, install


def test_another_users_stop_is_an_admins_and_the_rest_say_nothing():
    assert end_reason_for("ann", ("user", "root", True)) == "admin"
    assert end_reason_for("ann", ("user", "ann", False)) is None
    assert end_reason_for("ann", ("service", "idle-culler", False)) is None
    assert end_reason_for("ann", None) is None


def test_the_wrapped_stop_holds_its_caller_in_the_tasks_it_starts_and_not_after():
    from jupyterhub.handlers.base import BaseHandler

    seen = []

    async def original(self, user, server_name=""):
        # The hub stops the server in a task it creates here: the task sees the caller.
        await asyncio.ensure_future(_read(seen))

    class Caller:
        kind, name, admin = "user", "root", True

    saved = BaseHandler.stop_single_user
    BaseHandler.stop_single_user = original
    try:
        install()
        install()  # once only
        handler = object.__new__(BaseHandler)
        handler._jupyterhub_user = Caller()
        asyncio.run(BaseHandler.stop_single_user(handler, "ann"))
    finally:
        BaseHandler.stop_single_user = saved
    assert seen == [("user", "root", True)]
    assert STOPPED_BY.get() is None


async def _read(seen: list) -> None:
    seen.append(STOPPED_BY.get())
