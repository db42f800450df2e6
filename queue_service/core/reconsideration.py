"""Which pending requests a pass must consider again after a change: those joined to it through a
resource group or a quota they are checked against; the others would meet what they met in the
last pass (a release reaches the next grant at once with thousands waiting
elsewhere). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from queue_service.core.resource_model import Quota, Quotas, Request

_ANY_GROUP = ("any",)


def limits_anything(quota: Quota) -> bool:
    """Whether a pass ever checks this quota against usage (its resource groups are read at
    admission and in `_candidate_groups`, which usage never changes)."""
    limit = quota.max_slots
    return quota.max_sessions is not None or any(
        value is not None for value in (limit.cpu, limit.mem, limit.fgpu)
    )


def reconsidered(
    pending: Sequence[Request],
    quotas: Quotas,
    resource_groups: Iterable[str],
    dirty_groups: Iterable[str | None],
    dirty_users: Mapping[str, Sequence[str]],
    keys: Sequence[tuple] | None = None,
) -> list[Request]:
    """The pending requests whose outcome a FIFO pass may change, in the order given.

    Requests are joined when they can touch each other in a pass: through a resource group (one's
    placement takes capacity, or moves the skip count, the other could use), or through a quota
    both are checked against (the user's own, or a hub group's: one's placement uses it up for the
    other). A request whose resource group is None may go anywhere: it joins every group.
    `dirty_groups` (None: all of them) are the resource groups whose nodes, holdings or line
    changed since the last pass that placed; `dirty_users` (with their hub groups) the users whose
    holdings changed. Every request joined to either comes back; the others would meet exactly
    what they met in the last pass, which left them as they are, so a pass leaves them again.
    `keys` are the requests' `ScopeKeys`, when the caller keeps them.
    """
    parent: dict[tuple, tuple] = {}

    def root(element: tuple) -> tuple:
        parent.setdefault(element, element)
        while parent[element] != element:
            parent[element] = parent[parent[element]]
            element = parent[element]
        return element

    def join(a: tuple, b: tuple) -> None:
        parent[root(a)] = root(b)

    if keys is None:
        scope_key = ScopeKeys(quotas)
        keys = [scope_key(request) for request in pending]
    scope_of = {key: _scope_elements(key) for key in set(keys)}
    dirty_groups = set(dirty_groups)
    if None in dirty_groups or any(key[0] is None for key in scope_of):
        for group in resource_groups:
            join(("g", group), _ANY_GROUP)
    for first, *rest in scope_of.values():
        for element in rest:
            join(first, element)
    marked = {root(_ANY_GROUP if g is None else ("g", g)) for g in dirty_groups}
    for user, groups in dirty_users.items():
        marked.add(root(("u", user)))
        marked.update(root(("h", group)) for group in groups)
    chosen = {key for key, elements in scope_of.items() if root(elements[0]) in marked}
    return [r for r, key in zip(pending, keys, strict=True) if key in chosen]


class ScopeKeys:
    """A request's (resource group, user if the user's quota limits anything, hub groups whose
    quota limits anything): what it is joined through, told apart cheaply for thousands."""

    def __init__(self, quotas: Quotas):
        self.quotas = quotas
        self.default_user = limits_anything(quotas.default_user)
        self.hub_groups: dict[str, bool] = {}

    def __call__(self, request: Request) -> tuple:
        quota = self.quotas.users.get(request.user)
        limited = self.default_user if quota is None else limits_anything(quota)
        groups = ()
        if request.groups:
            groups = tuple(g for g in request.groups if self._limits(g))
        return (request.resource_group, request.user if limited else None, groups)

    def _limits(self, group: str) -> bool:
        if group not in self.hub_groups:
            self.hub_groups[group] = limits_anything(self.quotas.for_group(group))
        return self.hub_groups[group]


def _scope_elements(key: tuple) -> tuple[tuple, ...]:
    resource_group, user, groups = key
    elements = [_ANY_GROUP if resource_group is None else ("g", resource_group)]
    if user is not None:
        elements.append(("u", user))
    elements.extend(("h", g) for g in groups)
    return tuple(elements)
