"""`api/resources` (contract 4), the cluster page's quota table and `/metrics`.

- `GET api/resources`: your allocated and allocatable slots; admins also see nodes and GPUs.
  `?user=NAME` reads NAME's: the spawner (its form offers NAME the resource groups NAME may use,
  with what is free there) and admins may name anyone, others only themselves.
- `GET cluster/quotas`: admins; every user with a live session, their groups and limits.
- `GET metrics`: admins, or tokens with `read:metrics` (Prometheus; see `queue_service/core/metrics.py`).
"""

from __future__ import annotations

from tornado import web

from queue_service.core import metrics
from queue_service.store.accounts import Account

from .base import BaseHandler


class ResourcesHandler(BaseHandler):
    """GET your allocated and allocatable slots; admins also see nodes and GPUs.

    The JSON (keys kept stable: the pages' indicators read them; slots are {cpu, mem, fgpu}, cpu in
    cores, mem in bytes, fgpu in units):
    - `allocated`, `allocatable`, `capacity`: slots over the whole cluster;
    - `free`: slots free where you may run, quotas aside (`allocatable` is within your quotas);
    - `resource_groups`: {name: {allocated, allocatable, free, capacity, allowed}}, per group;
    - `limits`: [{kind, group, used, limit, left, reached, text}], every quota figure that applies
      to you (kind: sessions, pending, fgpu, cpu or mem; group null for your own quota), with the
      sentence the pages show: "You have 3 of 3 sessions (running or starting; your quota).";
    - `user`, `units_per_gpu`, `sessions` (how many of yours hold a slice);
    - `budgets`: [{group, figure, label, period, limit, used, window_start, frees_at, used_up}],
      the budgets of your groups with this window's use (budgets.py);
    - admins only, `nodes`: [{name, resource_group, cpu_total, cpu_free, mem_total, mem_free,
      gpus: [{uuid, index, fraction_free, fgpu_free,
              slices: [{session_id, user, server_name, fraction, fgpu}]}]}], and in Swarm mode,
      where the nodes pull the catalog's images ahead, each node's `images`: {present, offered,
      lacking: [{image, node, state, error?, retry_in_s?}]} (engine/image_prepull.py).
    """

    query_arguments = {"user": "text"}

    @web.authenticated
    async def get(self):
        subject, admin = await self.subject()
        groups = tuple(subject.get("groups", []))
        await self.refresh_quotas(subject)
        resources = await self.manager.resources(subject["name"], groups, admin=admin)
        on_nodes = self.engine_backend.images_on_nodes() if admin else None
        if on_nodes and "nodes" in resources:
            images = on_nodes[1]
            resources["nodes"] = [
                {**n, "images": images.get(n["name"])} for n in resources["nodes"]
            ]
        budgets = await self.usage.budget_status(Account.of(subject), groups)
        self.write_json({**resources, "budgets": budgets})

    async def subject(self) -> tuple[dict, bool]:
        """(whose allowances are read, whether the caller sees nodes): `?user=NAME` for the
        spawner and admins, or the calling user. A student naming another user is refused, so
        nobody learns another's quotas and resource groups."""
        name = self.get_argument("user", "")
        identity = self.identity()
        if identity.get("kind") == "service":
            if identity.get("name") != self.spawner_service:
                raise web.HTTPError(403, "Only users and the hub's spawner read resources.")
            if not name:
                raise web.HTTPError(400, "The spawner must name the user: ?user=NAME.")
            return await self.from_hub(self.hub.user(name)), False
        person = await self.person()
        if not name or name == person["name"]:
            return person, person["admin"]
        if not person["admin"]:
            raise web.HTTPError(403, "Only admins may read another user's resources.")
        return await self.from_hub(self.hub.user(name)), True


class ClusterQuotasHandler(BaseHandler):
    """The cluster page's quota table: every user with a live session, their groups, and the
    limits that apply to them and to those groups (use is summed on the page from sessions)."""

    @web.authenticated
    async def get(self):
        self.require_admin("The cluster view")
        quotas = self.quotas
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
