"""The queue service's pages: Sessions, Storage, Images, Usage, Courses, the resource indicator and the admin's cluster view.

They extend JupyterHub's own `page.html`, so they look like the hub and carry its navigation bar:
the Jinja loader searches the repository's templates first and JupyterHub's templates after, and
`templates/page.html` always names JupyterHub's original (as in the hub's own `template_paths`).
The pages are thin: each renders once, and a small script under `static/` polls the REST API
(`api/sessions`, `api/resources`) to keep itself current without a reload.

Errors: a browser gets the hub's HTML error page; anything under `api/` gets JSON (handlers.base).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import jinja2
from jupyterhub._data import DATA_FILES_PATH
from markupsafe import Markup
from tornado import web

from fgpu_shared.course_messages import announcement, message_of
from image_catalog.job_options import TIME_LIMIT_MAX, TIME_LIMIT_MIN
from queue_service.course_images import courses_taught
from templates import TEMPLATES_DIR

from ..hub_client import HubError
from .base import ADMIN_SCOPE, BaseHandler, scope_holds
from .courses import course_to_run
from .folders import CHUNK_BYTES
from .images import has_manage_scope

STATIC_DIR = Path(__file__).parent.parent / "static"
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


class PageHandler(BaseHandler):
    """A page of the service; errors are the hub's HTML error page."""

    json_errors = False

    @property
    def env(self) -> jinja2.Environment:
        return self.settings["page_templates"]

    @property
    def page_prefix(self) -> str:
        """The service's URL prefix, under which every page and the API are."""
        return self.settings["page_prefix"]

    @property
    def simulated_gpus(self) -> bool:
        return self.settings["page_simulated_gpus"]

    def namespace(self, person: dict | None) -> dict:
        prefix = os.environ.get("JUPYTERHUB_BASE_URL", "/")
        namespace = page_namespace(person, prefix, self.page_prefix)
        # The pages' scripts send it back as X-XSRFToken: without it, no cookie changes anything.
        return {**namespace, "xsrf_token": self.xsrf_text}

    @property
    def xsrf_text(self) -> str:
        token = self.xsrf_token
        return token.decode("ascii") if isinstance(token, bytes) else token

    def page_config(self, person: dict) -> dict:
        """What every page's script needs to know, as JSON in the page."""
        return {
            "api": self.page_prefix + "api/",
            "user": person["name"],
            "admin": person["admin"],
            "simulated": self.simulated_gpus,
            "xsrf": self.xsrf_text,
        }

    async def render_page(self, name: str, person: dict | None, **extra) -> None:
        """Render a page, with the messages of the person's courses as the hub's announcement
        (as the hub's own pages show them: fgpu_shared/course_messages.py)."""
        self.render_now(name, person, announcement=await self.announcement(person), **extra)

    def render_now(self, name: str, person: dict | None, **extra) -> None:
        html = self.env.get_template(name).render(**{**self.namespace(person), **extra})
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(html)

    async def announcement(self, person: dict | None) -> Markup:
        """The banner of the person's courses' messages; a hub that fails to answer shows none
        rather than no page."""
        names = (person or {}).get("groups") or ()
        try:
            groups = await asyncio.gather(*(self.hub.group(name) for name in names))
        except (HubError, OSError):
            return Markup("")
        return announcement((g["name"], message_of(g.get("properties"))) for g in groups)

    def write_error_page(self, status_code: int, message: str) -> None:
        # The nav bar needs a user; an error before we know who it is shows the page without one.
        identity = getattr(self, "_hub_auth_user_cache", None)
        person = identity if isinstance(identity, dict) and "name" in identity else None
        if person is not None:
            person = {**person, "admin": scope_holds(person.get("scopes", []), ADMIN_SCOPE)}
        self.render_now(
            "error.html",
            person,
            status_code=status_code,
            status_message=self._reason,
            message=message,
        )


def job_limits(rules) -> dict | None:
    if rules is None:
        return None
    return {
        "time_limit": rules.time_limit,
        "time_limit_min": TIME_LIMIT_MIN,
        "time_limit_max": min(rules.time_limit_max, TIME_LIMIT_MAX),
        "start_after_max": rules.start_after_max,
        "waiting_per_user": rules.waiting_per_user,
    }


class SessionsPage(PageHandler):
    """The Sessions page: the list, the launch dialog, the indicator and the app launcher."""

    @web.authenticated
    async def get(self):
        person = await self.person()
        quotas = self.quotas
        await self.refresh_quotas(person)
        config = {
            **self.page_config(person),
            # The tightest quota totals, so the launch dialog can say what can never start.
            "limit": quotas.user_limit(person["name"], tuple(person.get("groups", []))),
            "userPrefix": os.environ.get("JUPYTERHUB_BASE_URL", "/") + "user/",
            # One session's limits and defaults: the spawner's too (launch_options.py).
            "sessionLimits": self.session_limits,
            # A batch job's time limit when it names none, and the longest it may ask (seconds).
            "jobLimits": job_limits(self.job_rules),
            # The SSH service's port for each running session's SSH dialog; 0: SSH is off.
            "sshPort": self.settings.get("ssh_port", 0),
            "tokenPage": os.environ.get("JUPYTERHUB_BASE_URL", "/") + "hub/token",
            # What this user may start (groups, hidden, private), as api/images answers it.
            "images": self.images.visible_to(
                person["name"],
                tuple(person.get("groups", [])),
                bool(person.get("admin")),
                created=person.get("created"),
            ),
        }
        await self.render_page("sessions.html", person, page_config=config)


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
    """Admins: every node and GPU with its slices and holders, the queue, use against quota,
    and the cluster's utilization over time (static/cluster_utilization.js reads api/utilization)."""

    @web.authenticated
    async def get(self):
        self.require_admin("The cluster view")
        person = await self.person()
        config = {
            **self.page_config(person),
            "quotas": self.page_prefix + "cluster/quotas",
        }
        await self.render_page("cluster.html", person, page_config=config)


class ImagesPage(PageHandler):
    """The Images page: instructors curate the catalog, students see theirs. The page renders
    once; `static/images.js` does the rest through `api/images`, so the page and the API can never
    disagree about who may change what."""

    @web.authenticated
    async def get(self):
        person = await self.person()
        manager = person["admin"] or has_manage_scope(self.identity())
        # A course's instructors manage their courses' images (course_images.py).
        taught = [] if manager else sorted(await self.from_hub(courses_taught(self.hub, person)))
        config = {**self.page_config(person), "manager": manager or bool(taught), "taught": taught}
        await self.render_page("images.html", person, page_config=config)


class UsagePage(PageHandler):
    """The Usage page: your use per day, a chart of it, your groups' budgets, the CSV export;
    admins see everyone's, with filters. `static/usage.js` reads `api/usage`, which decides who
    sees what."""

    @web.authenticated
    async def get(self):
        person = await self.person()
        await self.render_page("usage.html", person, page_config=self.page_config(person))


class StoragePage(PageHandler):
    """The Storage page: your folders and those shared with you, their files (browse, upload in
    chunks, download), shares; admins may list everyone's. `static/storage.js` does it all
    through `api/folders`, which decides who may see and change what."""

    @web.authenticated
    async def get(self):
        person = await self.person()
        config = {
            **self.page_config(person),
            # Uploads go in chunks of this size: the largest body api/folders/{id}/files takes.
            "chunkBytes": CHUNK_BYTES,
            # How long a deleted folder is kept, for the delete dialog to say.
            "graceDays": self.folders.grace / (24 * 3600),
        }
        await self.render_page("storage.html", person, page_config=config)


class SSHKeysPage(PageHandler):
    """Your SSH keys: list, add (a pasted `.pub` line), remove. `static/ssh_keys.js` does it
    through `api/ssh-keys`, which checks each key and says why it refuses one."""

    @web.authenticated
    async def get(self):
        person = await self.person()
        config = {**self.page_config(person), "sshPort": self.settings.get("ssh_port", 0)}
        await self.render_page("ssh_keys.html", person, page_config=config)


class CoursesPage(PageHandler):
    """The Courses page: the courses you are in or teach (all for admins), each with its
    allowance; `courses/{name}`, for its instructors and admins, is the course's own page: its
    roster with each member's live sessions and jobs, its budgets, its message, and the actions
    (stop, open, message, a new roster). `static/courses.js` does it all through `api/courses`,
    which decides who may see and do what; a course the caller does not run answers as the API
    does (404 for strangers, 403 for its students)."""

    @web.authenticated
    async def get(self, name=None):
        person = await self.person()
        if name is not None:
            await course_to_run(self, name)
        config = {**self.page_config(person), "course": name}
        await self.render_page("courses.html", person, page_config=config)


class NotFound(PageHandler):
    """Anything unknown: JSON under api/, the hub's HTML 404 page elsewhere."""

    async def admit(self):
        self.json_errors = self.request.path.startswith(self.page_prefix + "api/")
        raise web.HTTPError(404, f"There is no page at {self.request.path}.")

    async def get(self, *args):
        """Never reached: `admit` answers 404 for every method."""

    head = post = put = patch = delete = get


def routes(prefix: str) -> list:
    return [
        (prefix, SessionsPage),
        (prefix + "sessions", SessionsPage),
        (prefix + "indicator", IndicatorPage),
        (prefix + "cluster", ClusterPage),
        (prefix + "images", ImagesPage),
        (prefix + "usage", UsagePage),
        (prefix + "storage", StoragePage),
        (prefix + "ssh", SSHKeysPage),
        (prefix + "courses", CoursesPage),
        (prefix + r"courses/([^/]+)", CoursesPage),
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
