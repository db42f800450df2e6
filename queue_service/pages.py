"""The queue service's pages: Sessions, the resource indicator and the admin's cluster view.

They extend JupyterHub's own `page.html`, so they look like the hub and carry its navigation bar:
the Jinja loader searches the repository's templates first and JupyterHub's templates after, and
`templates/page.html` always names JupyterHub's original (as in the hub's own `template_paths`).
The pages are thin: each renders once, and a small script under `static/` polls the REST API
(`api/sessions`, `api/resources`) to keep itself current without a reload.

Errors: a browser gets the hub's HTML error page; anything under `api/` gets JSON (apihandlers).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jinja2
from jupyterhub._data import DATA_FILES_PATH
from jupyterhub.services.auth import HubOAuthenticated
from tornado import web

from templates import TEMPLATES_DIR

from .apihandlers import APIHandler

STATIC_DIR = Path(__file__).parent / "static"
#: JupyterHub's own templates (share/jupyterhub/templates), where the hub itself looks for them.
JUPYTERHUB_TEMPLATES = Path(DATA_FILES_PATH) / "templates"


def template_environment(hub_templates: Path | None = None) -> jinja2.Environment:
    """Our templates first (service pages, then the hub overrides that add our nav links), then
    JupyterHub's; `templates/<name>` is always JupyterHub's original, for `{% extends %}`."""
    hub_templates = hub_templates or JUPYTERHUB_TEMPLATES
    loader = jinja2.ChoiceLoader(
        [
            jinja2.PrefixLoader({"templates": jinja2.FileSystemLoader(str(hub_templates))}, "/"),
            jinja2.FileSystemLoader(
                [str(TEMPLATES_DIR / "pages"), str(TEMPLATES_DIR / "hub"), str(hub_templates)]
            ),
        ]
    )
    return jinja2.Environment(loader=loader, autoescape=True)


class PageUser:
    """What `page.html` reads from `user`: the name (plain and JSON-escaped) and the admin flag."""

    def __init__(self, model: dict):
        self.name = model["name"]
        self.admin = bool(model.get("admin"))
        self.groups = list(model.get("groups", []))
        self.json_escaped_name = json.dumps(self.name)[1:-1]


def page_namespace(person: dict | None, prefix: str, service_prefix: str) -> dict:
    """The variables JupyterHub's page.html expects, pointing at the hub's own static files.

    `prefix` is the hub's base URL ("/"), `service_prefix` this service's ("/services/queue/").
    """
    hub_base = prefix + "hub/"
    user = PageUser(person) if person else None
    return {
        "base_url": hub_base,
        "prefix": prefix,
        "static_url": lambda path, include_version=True: f"{hub_base}static/{path}",
        "own_static": lambda path: f"{service_prefix}static/{path}",
        "user": user,
        "admin_access": bool(user and user.admin),
        "no_spawner_check": True,
        "parsed_scopes": {"admin-ui"} if user and user.admin else set(),
        "services": [],
        "logo_url": "",
        "login_url": f"{hub_base}login",
        "logout_url": f"{hub_base}logout",
        "xsrf_token": "",
        "version_hash": "",
        "announcement": None,
    }


class PageHandler(HubOAuthenticated, web.RequestHandler):
    """A page of the service; errors are the hub's HTML error page."""

    @property
    def hub(self):
        return self.settings["hub_client"]

    @property
    def env(self) -> jinja2.Environment:
        return self.settings["page_templates"]

    async def person(self) -> dict:
        identity = self.get_current_user()
        if identity.get("kind") != "user":
            raise web.HTTPError(403, "These pages are for users.")
        return await self.hub.user(identity["name"])

    def namespace(self, person: dict | None) -> dict:
        prefix = os.environ.get("JUPYTERHUB_BASE_URL", "/")
        return page_namespace(person, prefix, self.settings["page_prefix"])

    def page_config(self, person: dict) -> dict:
        """What every page's script needs to know, as JSON in the page."""
        return {
            "api": self.settings["page_prefix"] + "api/",
            "user": person["name"],
            "admin": bool(person.get("admin")),
            "simulated": self.settings["page_simulated_gpus"],
        }

    def render_page(self, name: str, person: dict | None, **extra) -> None:
        html = self.env.get_template(name).render(**self.namespace(person), **extra)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(html)

    def write_error(self, status_code, **kwargs):
        exc = kwargs.get("exc_info", (None, None))[1]
        message = self._reason
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        # The nav bar needs a user; an error before we know who it is shows the page without one.
        identity = getattr(self, "_hub_auth_user_cache", None)
        person = identity if isinstance(identity, dict) and "name" in identity else None
        self.render_page(
            "error.html",
            person,
            status_code=status_code,
            status_message=self._reason,
            message=message,
        )


class SessionsPage(PageHandler):
    """The Sessions page: the list, the launch dialog, the indicator and the app launcher."""

    @web.authenticated
    async def get(self):
        person = await self.person()
        quotas = self.settings["quotas"]
        await quotas.refresh(person, self.hub)
        config = {
            **self.page_config(person),
            # The tightest quota totals, so the launch dialog can say what can never start.
            "limit": quotas.user_limit(person["name"], tuple(person.get("groups", []))),
            "userPrefix": os.environ.get("JUPYTERHUB_BASE_URL", "/") + "user/",
            # What this user may start (groups, hidden, private), as api/images answers it.
            "images": self.settings["images"].visible_to(
                person["name"],
                tuple(person.get("groups", [])),
                bool(person.get("admin")),
                created=person.get("created"),
            ),
        }
        self.render_page("sessions.html", person, page_config=config)


class IndicatorPage(PageHandler):
    """The resource indicator alone, for an iframe on the hub's home page and spawn form."""

    @web.authenticated
    async def get(self):
        person = await self.person()
        config = self.page_config(person)
        self.set_header("Content-Security-Policy", "frame-ancestors 'self'")
        html = self.env.get_template("indicator.html").render(
            **self.namespace(person), page_config=config
        )
        self.finish(html)


class ClusterPage(PageHandler):
    """Admins: every node and GPU with its slices and holders, the queue, use against quota."""

    @web.authenticated
    async def get(self):
        person = await self.person()
        if not person.get("admin"):
            raise web.HTTPError(403, "The cluster view is for admins.")
        config = {
            **self.page_config(person),
            "quotas": self.settings["page_prefix"] + "cluster/quotas",
        }
        self.render_page("cluster.html", person, page_config=config)


class ClusterQuotas(APIHandler):
    """The cluster page's quota table: every user with a live session, their groups, and the
    limits that apply to them and to those groups (use is summed on the page from sessions)."""

    @web.authenticated
    async def get(self):
        person = await self.person()
        if not person.get("admin"):
            raise web.HTTPError(403, "The cluster view is for admins.")
        quotas = self.settings["quotas"]
        users = sorted({s["user"] for s in self.manager.sessions()})
        await quotas.refresh_users(users, self.hub)
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


class NotFound(PageHandler):
    """Anything unknown: JSON under api/, the hub's HTML 404 page elsewhere."""

    def prepare(self):
        raise web.HTTPError(404, f"There is no page at {self.request.path}.")

    def write_error(self, status_code, **kwargs):
        if self.request.path.startswith(self.settings["page_prefix"] + "api/"):
            return APIHandler.write_error(self, status_code, **kwargs)
        return super().write_error(status_code, **kwargs)


def routes(prefix: str) -> list:
    return [
        (prefix, SessionsPage),
        (prefix + "sessions", SessionsPage),
        (prefix + "indicator", IndicatorPage),
        (prefix + "cluster", ClusterPage),
        (prefix + "cluster/quotas", ClusterQuotas),
        (prefix + r"static/(.*)", web.StaticFileHandler, {"path": str(STATIC_DIR)}),
    ]


def settings(prefix: str, simulated: bool = False) -> dict:
    """Application settings the pages need, merged into the service's. `simulated`: the GPUs are
    simulated, which the pages say next to every fGPU figure."""
    return {
        "page_prefix": prefix,
        "page_simulated_gpus": simulated,
        "page_templates": template_environment(),
        "default_handler_class": NotFound,
    }
