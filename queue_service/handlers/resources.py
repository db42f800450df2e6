"""`api/resources` (contract 4), the cluster page's quota table and `/metrics`.

- `GET api/resources`: your allocated and allocatable slots; admins also see nodes and GPUs.
- `GET cluster/quotas`: admins; every user with a live session, their groups and limits.
- `GET metrics`: admins, or tokens with `read:metrics` (Prometheus; see `queue_service/metrics.py`).
"""

from __future__ import annotations

from tornado import web

from .. import metrics
from .base import BaseHandler


class ResourcesHandler(BaseHandler):
    """GET your allocated and allocatable slots; admins also see nodes and GPUs.

    The JSON (keys kept stable: the pages' indicators read them; slots are {cpu, mem, fgpu}, cpu in
    cores, mem in bytes, fgpu in units):
    - `allocated`, `allocatable`, `capacity`: slots over the whole cluster;
    - `resource_groups`: {name: {allocated, allocatable, capacity, allowed}}, the same per group;
    - `user`, `units_per_gpu`, `sessions` (how many of yours hold a slice);
    - admins only, `nodes`: [{name, resource_group, cpu_total, cpu_free, mem_total, mem_free,
      gpus: [{uuid, index, fraction_free, fgpu_free,
              slices: [{session_id, user, server_name, fraction, fgpu}]}]}].
    """

    @web.authenticated
    async def get(self):
        person = await self.person()
        groups = tuple(person.get("groups", []))
        await self.refresh_quotas(person)
        self.write_json(await self.manager.resources(person["name"], groups, admin=person["admin"]))


class ClusterQuotasHandler(BaseHandler):
    """The cluster page's quota table: every user with a live session, their groups, and the
    limits that apply to them and to those groups (use is summed on the page from sessions)."""

    @web.authenticated
    async def get(self):
        self.require_admin("The cluster view")
        quotas = self.settings["quotas"]
        users = sorted({s["user"] for s in self.manager.sessions()})
        await self.from_hub(quotas.refresh_users(users, self.hub))
        groups = sorted({g for name in users for g in quotas.groups_of(name)})
        self.write_json(
            {
                "users": {
                    name: {
                        "groups": list(quotas.groups_of(name)),
                        "limit": quotas.user_limit(name, ()),
                    }
                    for name in users
                },
                "groups": {name: quota_limits(quotas, name) for name in groups},
            }
        )


def quota_limits(quotas, group: str) -> dict:
    limits = quotas.snapshot().for_group(group).max_slots
    return {"cpu": limits.cpu, "mem": limits.mem, "fgpu": limits.fgpu}


class MetricsHandler(BaseHandler):
    """GET the metrics page: admins, or tokens with `read:metrics`."""

    @web.authenticated
    async def get(self):
        if not (self.holds("read:metrics") or self.is_admin()):
            raise web.HTTPError(
                403, "Metrics are for admins and tokens with the read:metrics scope."
            )
        manager = self.manager
        page = metrics.render(
            manager.sessions(), manager.cluster_view(), manager.settings.units_per_gpu
        )
        self.set_header("Content-Type", metrics.CONTENT_TYPE)
        self.finish(page)


def routes(prefix: str) -> list:
    return [
        (prefix + r"api/resources", ResourcesHandler),
        (prefix + r"cluster/quotas", ClusterQuotasHandler),
        (prefix + r"metrics", MetricsHandler),
    ]
