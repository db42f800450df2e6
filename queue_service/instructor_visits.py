"""An instructor opens a student's running session to help, through JupyterHub's shares.

"Open" on the Course page asks the hub to share that one server with the instructor
(`POST /hub/api/shares/{student}/{server} {"user": instructor}`): JupyterHub then grants the
instructor `access:servers!server={student}/{server}`, and nothing else of the student's: not
their other servers, not their API, not their storage. The instructor's browser logs in to the
student's server with the hub's OAuth like any visitor of a shared server; the token the student's
server sees is the instructor's OAuth token for that server alone, which opens nothing else.

JupyterHub's roles cannot say this per course at run time (they live in the hub's configuration),
so the service decides who may ask (`courses.may_act_on`), and the share is the hub's own record
that the access exists, which the hub's shares API lists and revokes.

A share outlives its session only until `VisitCloser`'s next round: every minute it revokes the
shares of course instructors on servers with no live session, and the shares of people who are no
longer instructors of the server's owner. A named server takes its shares with it when the service
removes it (server_removal.py); the default server keeps its spawner, so this round is what ends a
visit there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from . import courses
from .hub_client import HubClient, HubError


async def open_for(hub: HubClient, instructor: str, owner: str, server_name: str) -> None:
    """Share `owner`'s server with `instructor` (already allowed by the caller)."""
    await hub.share_server(owner, server_name, instructor)


async def close_stale(
    hub: HubClient, active: Callable[[], set[tuple[str, str]]], log=None
) -> list[tuple[str, str, str]]:
    """One round: revoke instructors' shares that no session or course justifies any more;
    the (instructor, owner, server) triples revoked."""
    revoked = []
    students_of: dict[str, set[str]] = {}
    for course in await courses.courses_of(hub, {"name": "", "admin": True}):
        for instructor in course.instructors:
            students_of.setdefault(instructor, set()).update(course.members)
    for instructor, students in sorted(students_of.items()):
        for owner, server in await hub.shared_with(instructor):
            if (owner, server) in active() and owner in students:
                continue
            try:
                await hub.revoke_share(owner, server, instructor)
            except HubError as e:
                if log:
                    log.warning(
                        "could not end %s's visit of %s/%s: %s", instructor, owner, server, e
                    )
                continue
            revoked.append((instructor, owner, server))
    return revoked


class VisitCloser:
    """Runs `close_stale` on a timer of its own, off the queue's path."""

    def __init__(self, hub: HubClient, active: Callable[[], set[tuple[str, str]]], log=None):
        self.hub, self.active, self.log = hub, active, log

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await close_stale(self.hub, self.active, self.log)
            except Exception:  # tried again next round
                if self.log:
                    self.log.exception("ending instructors' visits failed; trying again later")
