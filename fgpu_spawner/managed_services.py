"""The hub's managed services (the queue service, the idle culler) started again within seconds
of dying, not up to half a minute later.

JupyterHub starts a managed service again once its poll of the process finds it gone, and polls
its services as it polls single-user servers: every 30 s (`Spawner.poll_interval`), with no
setting for the services' own spawner class. The queue service holds every grant and every
waiting spawn's place in line, so a killed service (an OOM kill, say) left the hub without its
pages and API for up to 33 s. `install` has the hub's services polled
every `POLL_SECONDS` instead, but never before `MIN_UPTIME` seconds after their start: a service
that cannot start (a database it cannot upgrade, say) is not started again more often than
before, once in about half a minute.
"""

from __future__ import annotations

import time

from jupyterhub.services import service as hub_services
from traitlets import Integer

POLL_SECONDS = 2
MIN_UPTIME = 30.0


class QuickRestartServiceSpawner(hub_services._ServiceSpawner):
    """JupyterHub's spawner of managed services, polled every `POLL_SECONDS` once it has run for
    `MIN_UPTIME` seconds."""

    poll_interval = Integer(POLL_SECONDS)
    started_at = 0.0

    def start(self):
        self.started_at = time.monotonic()
        return super().start()

    async def poll_and_notify(self):
        # The periodic poll alone: the hub's stop of the service still polls it directly.
        if time.monotonic() - self.started_at < MIN_UPTIME:
            return None
        return await super().poll_and_notify()


def install() -> None:
    """Have the hub start its managed services with `QuickRestartServiceSpawner` (JupyterHub's
    `Service.start` looks its spawner class up in its module at each start)."""
    hub_services._ServiceSpawner = QuickRestartServiceSpawner
