"""`GET api/presets` (contract 4): the resource presets a user may pick (presets.py), each with
its slots and whether it is theirs to use now, with the reason when not. `?user=NAME` as for
`api/resources`: the spawner (resolving a `preset` of a hub start) and admins name anyone, others
only themselves.
"""

from __future__ import annotations

from tornado import web

from queue_service.core import presets

from .base import BaseHandler
from .resources import ResourcesHandler


class PresetsHandler(ResourcesHandler):
    """GET the presets offered to you (or, for the spawner and admins, to `?user=`)."""

    @web.authenticated
    async def get(self):
        subject, _ = await self.subject()
        await self.refresh_quotas(subject)
        self.write_json({"presets": offered_presets(self, subject)})


def offered_presets(handler: BaseHandler, person: dict) -> list[dict]:
    """The site's presets and those of the person's groups, each judged against the person's
    quota (as last refreshed) and one session's limits."""
    groups = tuple(person.get("groups", []))
    quotas = handler.quotas
    offered = presets.merged(handler.site_presets, quotas.presets_of(groups))
    limits = handler.session_limits
    session_max = {key: limits[f"{key}_max"] for key in ("cpu", "mem", "fgpu")}
    return presets.listing(offered, quotas.user_limit(person["name"], groups), session_max)


def routes(prefix: str) -> list:
    return [(prefix + r"api/presets", PresetsHandler)]
