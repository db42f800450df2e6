"""`POST sessions` with `count`: start named servers through the hub, side by side.

The hub's own start call returns only once the spawn is done or its slow-spawn timeout passes, so
starting `count` servers one after the other kept the launch dialog waiting for tens of seconds.
Here every start is sent at once, and the launch answers as soon as each server has its queue
record (PENDING or SCHEDULED): that is when the request is in line, and the Sessions page shows the
rest coming up. The hub's answers still count: a start the hub refuses before it has a record (a
quota, a bad image) makes the launch all or nothing, so the servers already started are stopped and
removed again, the refused one's entry included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets

from .hub_client import HubError

log = logging.getLogger(__name__)

#: Longest the launch waits for the records before it answers with what it has.
ANSWER_TIMEOUT = 30.0
#: How often the launch looks at the records between two queue passes (a safety net: a pass wakes it).
_RECHECK_SECONDS = 0.5

#: Starts still running after their launch answered; held so the event loop keeps them alive.
_background: set[asyncio.Task] = set()


def server_names(count: int) -> list[str]:
    return [f"s-{secrets.token_hex(3)}" for _ in range(count)]


async def launch(hub, manager, user: str, names: list[str], options: dict) -> list[dict]:
    """Start `names` for `user`; each server's record once it exists (None if not yet)."""
    starts = {name: asyncio.create_task(hub.start_server(user, name, options)) for name in names}
    try:
        records = await _until_queued(manager, user, starts)
    except HubError:
        await _undo(hub, user, names, starts)
        raise
    for task in starts.values():
        if not task.done():
            _background.add(task)
            task.add_done_callback(_finished_later)
    return [{"server_name": name, "session": records.get(name)} for name in names]


async def _until_queued(manager, user: str, starts: dict) -> dict[str, dict]:
    """The records of the started servers, once every one has a record or an answer from the
    hub; a refusal from the hub is raised as soon as it comes."""
    deadline = asyncio.get_running_loop().time() + ANSWER_TIMEOUT
    while True:
        for task in starts.values():
            if task.done() and task.exception() is not None:
                raise task.exception()
        records = manager.records_of(user, list(starts))
        settled = all(name in records or task.done() for name, task in starts.items())
        if settled or asyncio.get_running_loop().time() > deadline:
            return records
        await manager.wait_for_change(_RECHECK_SECONDS)


async def _undo(hub, user: str, names: list[str], starts: dict) -> None:
    for task in starts.values():
        task.cancel()
    await asyncio.gather(*starts.values(), return_exceptions=True)
    for name in names:
        with contextlib.suppress(HubError):
            await hub.stop_server(user, name, remove=True)


def _finished_later(task: asyncio.Task) -> None:
    _background.discard(task)
    if not task.cancelled() and task.exception() is not None:
        # The spawn itself reports to its user (the Sessions page shows the record's end).
        log.warning("A launched server failed to start: %s", task.exception())
