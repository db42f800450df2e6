"""The hub scopes the queue service reads, and the start-up check of the hub's roles against them.

Pure (no I/O): `jupyterhub_config.py` runs `check_roles` on `c.JupyterHub.load_roles` as the hub
starts, and the handlers take their scope names from here, so the two never disagree.

JupyterHub lets a role grant a scope limited by a filter (`custom:images:manage!group=course-a`).
The service does not limit catalog rights to a group: it refuses such a grant on every request
(handlers/images.py), never taking it as the whole catalog. A role that grants one would only
ever be refused, so the hub refuses to start with it and says which role and scope, rather than
let a site believe its course-a instructors curate course-a's images.

Admin powers stay on the hub's own `admin:servers` (rather than a custom `custom:queue:admin`):
JupyterHub refuses any change to its `admin` role's scopes, so a custom scope would need a role of
its own, assigned by hand, and a user made admin in the admin panel would lack it. And what the
service's admin actions are, acting on other users' servers and sessions, is what `admin:servers`
means, so the service never gives anyone more than the hub already does. A filtered
`admin:servers!group=x` has uses of its own in the hub (a teaching assistant who may restart
course-x's servers), so such a role is not refused: the hub starts and warns that in the queue
service its members act as plain users (handlers/base.py holds only the unfiltered scope).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: Curating the shared image catalog: the `instructor` role, held by the `instructors` group.
MANAGE_SCOPE = "custom:images:manage"

#: Admin powers in the service: everyone's sessions, nodes, the cluster page, commits, metrics.
#: The hub's `admin` role holds it; a token an admin made with fewer scopes does not.
ADMIN_SCOPE = "admin:servers"


def is_filtered_form(scope: str, of: str) -> bool:
    """Whether `scope` is `of` limited by a filter (`of!group=x`), not `of` itself."""
    return scope.startswith(of + "!")


@dataclass(frozen=True)
class RoleCheck:
    """What `check_roles` found: refusals stop the hub; warnings are logged."""

    refusals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def check_roles(roles: Iterable[Mapping]) -> RoleCheck:
    """Check every role's scopes against the scopes the service reads unfiltered only."""
    found = RoleCheck()
    for role in roles:
        name = role.get("name", "?")
        for scope in role.get("scopes") or ():
            if is_filtered_form(scope, MANAGE_SCOPE):
                found.refusals.append(_filtered_manage_refusal(name, scope))
            elif is_filtered_form(scope, ADMIN_SCOPE):
                found.warnings.append(_filtered_admin_warning(name, scope))
    return found


def _filtered_manage_refusal(role: str, scope: str) -> str:
    return (
        f"role {role!r} grants {scope!r}: the queue service does not limit catalog rights to a "
        f"group, so it would refuse every catalog change of that role's members. Grant "
        f"{MANAGE_SCOPE!r} itself (add them to the 'instructors' group), or remove the filter "
        f"from the role in c.JupyterHub.load_roles."
    )


def _filtered_admin_warning(role: str, scope: str) -> str:
    return (
        f"role {role!r} grants {scope!r}: the hub lets its members act on those servers, but "
        f"the queue service gives admin powers (everyone's sessions, the cluster page, saving "
        f"images) only with {ADMIN_SCOPE!r} itself; there they act as plain users."
    )
