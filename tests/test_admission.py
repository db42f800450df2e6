"""Admission on its own: what can never fit, or may not wait, is refused at once."""

from __future__ import annotations

from queue_service.core.admission import admission_error
from queue_service.core.resource_model import Quota, Quotas, SlotLimits

from .core_values import GIB, node, req


def test_pending_count_quota_refuses_at_admission():
    quotas = Quotas(users={"ann": Quota(max_pending=2)}, groups={"class": Quota(max_pending=3)})
    nodes = [node()]
    waiting = [req("p1", user="ann"), req("p2", user="ann")]
    assert admission_error(req("p3", user="ann"), nodes, quotas, pending=waiting) == (
        "Your quota allows 2 pending sessions at a time (its `pending` limit), and 2 are waiting. "
        "Cancel one, or wait for it to start."
    )
    assert admission_error(req("p2", user="ann"), nodes, quotas, pending=waiting[:1]) is None
    in_class = [req(f"c{i}", user=f"u{i}", groups=("class",)) for i in range(3)]
    error = admission_error(
        req("c9", user="zed", groups=("class",)), nodes, quotas, pending=in_class
    )
    assert error.startswith("Group 'class' quota allows 3 pending sessions")


def test_admission_refuses_a_request_bigger_than_any_node():
    nodes = [node("a", gpus=2, cpu=8, mem=16 * GIB), node("b", gpus=1, cpu=32, mem=8 * GIB)]
    # Each dimension fits some node, but no node holds all three at once.
    error = admission_error(req("r", fgpu=1.5, cpu=16, mem=4 * GIB), nodes)
    assert error == (
        "This request can never start: it asks for 16 CPU cores, 4 GiB memory and 1.5 fGPU, but no "
        "node in resource group 'default' is that big. The most any node there has is "
        "32 CPU cores, 16 GiB memory and 2 fGPU."
    )
    assert admission_error(req("ok", fgpu=1.5, cpu=8), nodes) is None


def test_admission_counts_fgpu_against_the_nodes_gpus():
    nodes = [node(gpus=2)]
    assert admission_error(req("r", fgpu=4), nodes, units_per_gpu=2) is None
    assert "4.5 fGPU" in admission_error(req("r", fgpu=4.5), nodes, units_per_gpu=2)


def test_admission_refuses_above_a_quota_maximum():
    quotas = Quotas(
        users={"ann": Quota(max_slots=SlotLimits(fgpu=1))},
        groups={"class": Quota(max_slots=SlotLimits(cpu=2, mem=2 * GIB))},
    )
    nodes = [node(gpus=4)]
    assert admission_error(req("r", fgpu=1.5, user="ann"), nodes, quotas) == (
        "This request can never start: it asks for 1.5 fGPU, and your quota is 1 fGPU in all."
    )
    assert admission_error(req("r", cpu=4, user="bo", groups=("class",)), nodes, quotas) == (
        "This request can never start: it asks for 4 CPU cores, "
        "and group 'class' quota is 2 CPU cores in all."
    )
    assert "8 GiB memory" in admission_error(
        req("r", mem=8 * GIB, groups=("class",)), nodes, quotas
    )
    no_sessions = Quotas(default_user=Quota(max_sessions=0))
    assert admission_error(req("r"), nodes, no_sessions) == (
        "This request can never start: your quota allows no sessions."
    )


def test_admission_refuses_unknown_resource_groups_and_empty_slots():
    nodes = [node(group="default")]
    assert admission_error(req("r", rg="nope"), nodes) == (
        "There is no resource group 'nope'. The resource groups are: 'default'."
    )
    assert (
        admission_error(req("r", cpu=0), nodes) == "A session needs some CPU; 0 cores were asked."
    )
    quotas = Quotas(default_user=Quota(resource_groups=("elsewhere",)))
    assert admission_error(req("r"), nodes, quotas) == (
        "None of the resource groups you may use has any nodes."
    )
