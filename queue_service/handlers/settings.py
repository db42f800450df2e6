"""`api/settings`: the settings the running service holds, for hub admins.

`GET api/settings` answers a caller whose token holds admin:servers with every `c.QueueService`
setting as the running service took it: what the site wrote in jupyterhub_config.py (which the
hub hands over, fgpu_shared/site_config.py), what its command line gave, else the default, as
`{"settings": {name: value}}`, and the engine backend's class and settings (`c.DockerEngine.…`,
`c.SwarmEngine.…`) as `"engine": {"class": name, "settings": {name: value}}`; a database URL's
password is hidden. Anyone else gets 403. It
reads and changes nothing else: an admin checks here that a `c.` line took effect.
"""

from __future__ import annotations

from tornado import web

from .base import BaseHandler


class SettingsHandler(BaseHandler):
    @web.authenticated
    async def get(self):
        self.require_admin("The service's settings")
        self.set_header("Cache-Control", "no-store")
        self.write_json(
            {
                "settings": self.settings["settings_in_effect"],
                "engine": self.settings["engine_settings_in_effect"],
            }
        )


def routes(prefix: str) -> list:
    return [(prefix + r"api/settings", SettingsHandler)]
