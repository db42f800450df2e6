"""The service's web layer: every handler, API and page, on one base (`base.BaseHandler`).

Each module serves one part and lists its own routes, as JupyterHub's `apihandlers/` does:
- `base`: authentication, XSRF, the body cap, scopes and the refusal → status table;
- `grants`: the spawner's `api/grants`;
- `courses`: `api/courses`, courses on hub groups, their rosters and their sessions;
- `material_links`: a course's material by one link (`api/courses/{name}/link`, `courses/{name}/open`);
- `sessions`: people's `api/sessions` (launch, stop, save as an image);
- `session_logs`: `api/sessions/{id}/logs`, a batch job's log (followed live with `follow=1`);
- `resources`: `api/resources`, the cluster page's quota table, `/metrics`;
- `presets`: `api/presets`, the resource presets a user may pick;
- `images`: the catalog's `api/images`;
- `folders`: `api/folders`, storage folders, their shares and files;
- `usage`: `api/usage`, the daily usage figures (JSON or CSV);
- `utilization`: `api/utilization`, the cluster's capacity, allocation and use over time (admins);
- `health`: `api/health`, the service's health (a status for anyone, the checks for admins);
- `settings`: `api/settings`, the settings the running service holds (admins);
- `ssh_keys`: `api/ssh-keys`, the public keys that log a user in over SSH;
- `nodes`: the node agents' `api/nodes/{hostname}/report`, and `api/nodes` for admins;
- `node_exec`: the node agents' shell channel (`exec-orders`, `exec/{token}`): shells on Swarm nodes;
- `pages`: the HTML pages and their static files (and the 404 for anything else).

Handlers only translate HTTP to the domain (`queue`, `quotas`, `images`, `private_images`,
`launches`) and back; the scheduling core (`scheduler`) is pure and knows nothing of either.
"""

from __future__ import annotations

from jupyterhub.services.auth import HubOAuthCallbackHandler

from queue_service.hub_identity_lookups import SharedLookupHubOAuth

from . import (
    courses,
    folders,
    grants,
    health,
    images,
    material_links,
    node_exec,
    nodes,
    pages,
    presets,
    resources,
    session_logs,
    sessions,
    settings,
    ssh_keys,
    usage,
    utilization,
)


def routes(prefix: str) -> list:
    """Every route of the service under `prefix` ("/services/queue/"); the pages' catch-all is
    the application's default handler (`pages.settings`)."""
    return [
        *grants.routes(prefix),
        *sessions.routes(prefix),
        *courses.routes(prefix),
        *material_links.routes(prefix),
        *session_logs.routes(prefix),
        *resources.routes(prefix),
        *presets.routes(prefix),
        *images.routes(prefix),
        *folders.routes(prefix),
        *nodes.routes(prefix),
        *node_exec.routes(prefix),
        *usage.routes(prefix),
        *utilization.routes(prefix),
        *health.routes(prefix),
        *settings.routes(prefix),
        *ssh_keys.routes(prefix),
        (prefix + r"oauth_callback", OAuthCallbackHandler),
        *pages.routes(prefix),
    ]


class OAuthCallbackHandler(HubOAuthCallbackHandler):
    """The hub's login callback, on the same HubOAuth singleton as every other handler."""

    hub_auth_class = SharedLookupHubOAuth
