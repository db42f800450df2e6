"""How the hub starts its managed services (the queue service, the idle culler): again within
seconds of dying, and the queue service with the site's settings for it.

The site's settings: a service whose environment asks for them (`site_config.ENV` set to
`site_config.FROM_HUB` in its `services` entry) gets, in that variable, the part of the hub's
merged config it reads (`c.QueueService.…` and the settings it shares with the spawner:
fgpu_shared/site_config.py), as the hub starts it, once every config file has been read.

Restarts:
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

from fgpu_shared import site_config

POLL_SECONDS = 2
MIN_UPTIME = 30.0


class ManagedServiceSpawner(hub_services._ServiceSpawner):
    """JupyterHub's spawner of managed services, polled every `POLL_SECONDS` once it has run for
    `MIN_UPTIME` seconds, which hands a service that asks for them the site's settings."""

    poll_interval = Integer(POLL_SECONDS)
    started_at = 0.0

    def start(self):
        self.started_at = time.monotonic()
        return super().start()

    def get_env(self):
        env = super().get_env()
        if env.get(site_config.ENV) == site_config.FROM_HUB:
            try:
                env[site_config.ENV] = site_config.service_config_text(self.user.service.app.config)
            except site_config.SiteConfigError as e:
                # Before the service starts: the hub stops, with the line to change named.
                self.log.critical("Refusing to start: %s", e)
                raise SystemExit(1) from None
        return env

    async def poll_and_notify(self):
        # The periodic poll alone: the hub's stop of the service still polls it directly.
        if time.monotonic() - self.started_at < MIN_UPTIME:
            return None
        return await super().poll_and_notify()


def install() -> None:
    """Have the hub start its managed services with `ManagedServiceSpawner` (JupyterHub's
    `Service.start` looks its spawner class up in its module at each start)."""
    hub_services._ServiceSpawner = ManagedServiceSpawner
