"""Which requests a pass considers again (a release reaches the next grant at once
with thousands waiting elsewhere)."""

from __future__ import annotations

from queue_service.core.reconsideration import reconsidered
from queue_service.core.resource_model import NO_QUOTAS, Quota, Quotas, SlotLimits

from .core_values import req


def ids_reconsidered(pending, quotas=NO_QUOTAS, groups=("a", "b", "c"), dirty=(), users=None):
    return [r.id for r in reconsidered(pending, quotas, groups, dirty, users or {})]


def test_a_change_in_one_resource_group_concerns_only_the_requests_there():
    pending = [req("a1", rg="a", user="u1"), req("b1", rg="b", user="u2"), req("a2", rg="a")]
    assert ids_reconsidered(pending, dirty={"a"}) == ["a1", "a2"]
    assert ids_reconsidered(pending, dirty={"c"}) == []
    # A request free to go anywhere joins every group, and a change to one of those (None) all.
    anywhere = [*pending, req("any", user="u3")]
    assert ids_reconsidered(anywhere, dirty={"c"}) == ["a1", "b1", "a2", "any"]
    assert ids_reconsidered(pending, dirty={None}) == ["a1", "b1", "a2"]


def test_a_quota_joins_the_requests_checked_against_it():
    pending = [
        req("a-u1", rg="a", user="u1"),
        req("b-u1", rg="b", user="u1"),
        req("c-u2", rg="c", user="u2", groups=("lab",)),
        req("b-u3", rg="b", user="u3", groups=("lab",)),
    ]
    # No quota limits anything: each resource group stands alone.
    assert ids_reconsidered(pending, dirty={"a"}) == ["a-u1"]
    # A user quota joins that user's requests, in whichever group: a release in group a (or a
    # slice of u1's anywhere) frees quota for u1's request in group b, and so all of b.
    limited = Quotas(default_user=Quota(max_slots=SlotLimits(fgpu=2)))
    assert ids_reconsidered(pending, limited, dirty={"a"}) == ["a-u1", "b-u1", "b-u3"]
    assert ids_reconsidered(pending, limited, users={"u2": ("lab",)}) == ["c-u2"]
    # A hub group's quota joins its members' requests.
    lab = Quotas(groups={"lab": Quota(max_sessions=2)})
    assert ids_reconsidered(pending, lab, dirty={"c"}) == ["b-u1", "c-u2", "b-u3"]
    assert ids_reconsidered(pending, lab, users={"u9": ("lab",)}) == ["b-u1", "c-u2", "b-u3"]
    # A quota that only names resource groups is read at admission, never against usage.
    groups_only = Quotas(default_user=Quota(resource_groups=("a", "b")))
    assert ids_reconsidered(pending, groups_only, dirty={"a"}) == ["a-u1"]
