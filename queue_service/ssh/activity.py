"""Use over SSH counts as the session's activity, as its JupyterLab's does.

The idle culler stops a server whose hub `last_activity` is older than its timeout, and the
session itself reports only what it sees (kernels, terminals, pages): a student working in VS
Code through Remote-SSH, or in an `ssh` shell, would have the session stopped under them. So the
bytes a client sends, into a shell or through a forward, report the login's server as in use to
the hub (`HubClient.report_activity`), at most once per `REPORT_SECONDS` a server. The hub keeps
the later of its time and ours, so a report never moves activity back.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from queue_service.hub_client import HubError

from .hub_logins import Login

#: Seconds between two reports for one server (the culler's timeouts are in minutes and hours).
REPORT_SECONDS = 60


class SessionActivity:
    def __init__(self, hub, log):
        self.hub = hub
        self.log = log
        #: (user, server) → when (monotonic) its last report went.
        self.reported: dict[tuple[str, str], float] = {}
        self.sending: set[asyncio.Task] = set()

    def used(self, login: Login) -> None:
        """The login's client sent something: report the server in use, unless done lately."""
        key = (login.user, login.server)
        now = time.monotonic()
        if now - self.reported.get(key, -REPORT_SECONDS) < REPORT_SECONDS:
            return
        self.reported[key] = now
        task = asyncio.get_running_loop().create_task(self._report(login))
        self.sending.add(task)
        task.add_done_callback(self.sending.discard)

    async def _report(self, login: Login) -> None:
        when = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        try:
            await self.hub.report_activity(login.user, login.server, when)
        except (HubError, OSError) as e:
            # A server stopped meanwhile, or a hub restarting: a later use reports again.
            self.log.info("SSH: no activity report for %s/%s: %s", login.user, login.server, e)
