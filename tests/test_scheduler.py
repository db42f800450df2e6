"""The scheduling pass on its own: placement, queue order, quotas, reasons, and its invariants."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queue_service.core.admission import admission_error
from queue_service.core.free_capacity import free_capacity
from queue_service.core.resource_model import (
    QUANTA_PER_GPU,
    Allocation,
    Gpu,
    Node,
    Quota,
    Quotas,
    Request,
    SlotLimits,
    Slots,
    fraction_quanta,
    gpu_quanta,
)
from queue_service.core.scheduler import schedule

from .core_values import GIB, held, node, req


def placed_ids(result) -> list[str]:
    return [a.request_id for a in result.placed]


# ---------------------------------------------------------------------------------------------
# The seed's walk-through


def test_walkthrough_two_units_per_gpu_runs_two_and_queues_the_third():
    nodes = [node()]
    pending = [req(f"s{i}", fgpu=1) for i in range(3)]

    first = schedule(nodes, [], pending, units_per_gpu=2)

    assert placed_ids(first) == ["s0", "s1"]
    assert all(a.gpus == {"node-0-gpu0": 0.5} for a in first.placed)
    waiting = first.waiting["s2"]
    assert waiting.position == 1
    assert waiting.cause == "capacity"
    assert waiting.reason == "waiting for 1 fGPU; every GPU is fully in use"

    # One session ends: the next pass places the waiting request on the freed half.
    second = schedule(nodes, [first.placed[1]], [pending[2]], units_per_gpu=2)
    assert placed_ids(second) == ["s2"]
    assert second.placed[0].gpus == {"node-0-gpu0": 0.5}
    assert second.waiting == {}


def test_walkthrough_one_unit_per_gpu_with_point_four_requests():
    nodes = [node()]
    pending = [req(f"s{i}", fgpu=0.4) for i in range(3)]

    result = schedule(nodes, [], pending, units_per_gpu=1)

    assert placed_ids(result) == ["s0", "s1"]
    assert result.waiting["s2"].reason == (
        "waiting for 0.4 fGPU; the most free on one GPU is 0.2 fGPU (gpu-0 on node-0)"
    )
    quanta = sum(fraction_quanta(f) for a in result.placed for f in a.gpus.values())
    assert quanta == 8000


def test_three_units_per_gpu_fill_one_gpu_without_drift():
    result = schedule([node()], [], [req(f"s{i}", fgpu=1) for i in range(4)], units_per_gpu=3)
    assert placed_ids(result)[:3] == ["s0", "s1", "s2"]
    assert "s3" in result.waiting
    assert sum(fraction_quanta(a.gpus["node-0-gpu0"]) for a in result.placed) <= QUANTA_PER_GPU


# ---------------------------------------------------------------------------------------------
# Placement


def test_one_and_a_half_gpus_span_a_whole_gpu_and_half_of_another_on_one_node():
    nodes = [node("a", gpus=1), node("b", gpus=2)]
    result = schedule(nodes, [], [req("big", fgpu=1.5)])
    (allocation,) = result.placed
    assert allocation.node == "b"
    assert sorted(allocation.gpus.values()) == [0.5, 1.0]


def test_the_remainder_of_a_spanning_request_goes_on_a_partly_used_gpu():
    nodes = [node("a", gpus=3)]
    allocations = [held("x", "a", {"a-gpu1": 0.5}, fgpu=0.5)]
    (allocation,) = schedule(nodes, allocations, [req("big", fgpu=1.5)]).placed
    assert allocation.gpus["a-gpu1"] == 0.5
    assert sorted(allocation.gpus.values()) == [0.5, 1.0]


def test_a_spanning_request_never_splits_across_nodes():
    nodes = [node("a", gpus=1), node("b", gpus=1)]
    result = schedule(nodes, [], [req("big", fgpu=1.5)])
    assert result.placed == ()
    assert "no node in resource group 'default' is that big" in result.refused["big"]


def test_best_fit_keeps_room_that_first_fit_would_fragment():
    # gpu0 has 0.6 free and gpu1 0.3. First fit puts a 0.3 request on gpu0, leaving 0.3 + 0.3 and
    # no room for the 0.6 that follows; best fit fills gpu1 and keeps gpu0's 0.6 whole.
    nodes = [node("a", gpus=2)]
    allocations = [held("x", "a", {"a-gpu0": 0.4}, 0.4), held("y", "a", {"a-gpu1": 0.7}, 0.7)]
    small, large = req("small", fgpu=0.3), req("large", fgpu=0.6)

    result = schedule(nodes, allocations, [small, large])

    assert [a.gpus for a in result.placed] == [{"a-gpu1": 0.3}, {"a-gpu0": 0.6}]
    first_fit = [
        held("x", "a", {"a-gpu0": 0.4}, 0.4),
        held("y", "a", {"a-gpu1": 0.7}, 0.7),
        held("small", "a", {"a-gpu0": 0.3}, 0.3),
    ]
    assert schedule(nodes, first_fit, [req("large2", fgpu=0.6)]).placed == ()


def test_best_fit_breaks_a_whole_gpu_on_the_node_with_fewest_left():
    # A small request that fits no partly used GPU must open a whole one. Taking it from the node
    # with one whole GPU left keeps node "b"'s two whole GPUs together for a 2 fGPU request.
    nodes = [node("a", gpus=2), node("b", gpus=2)]
    allocations = [held("x", "a", {"a-gpu0": 0.9}, 0.9)]
    result = schedule(nodes, allocations, [req("small", fgpu=0.5), req("two", fgpu=2)])
    assert [(a.request_id, a.node) for a in result.placed] == [("small", "a"), ("two", "b")]
    assert result.placed[0].gpus == {"a-gpu1": 0.5}


def test_fill_and_spread_choose_different_nodes():
    nodes = [node("a", gpus=2), node("b", gpus=2)]
    allocations = [held("x", "a", {"a-gpu0": 0.5}, 0.5)]
    request = req("r", fgpu=0.2)
    fill = schedule(nodes, allocations, [request], placement="fill")
    spread = schedule(nodes, allocations, [request], placement="spread")
    best = schedule(nodes, allocations, [request], placement="best_fit")
    assert fill.placed[0].node == "a"
    assert spread.placed[0].node == "b"
    assert best.placed[0].gpus == {"a-gpu0": 0.2}


def test_spread_without_gpus_goes_to_the_node_with_most_free_cpu():
    nodes = [node("a", gpus=0, cpu=8), node("b", gpus=0, cpu=4)]
    request = req("r", cpu=2)
    assert schedule(nodes, [], [request], placement="spread").placed[0].node == "a"
    assert schedule(nodes, [], [request], placement="fill").placed[0].node == "b"


def test_a_request_without_gpu_needs_only_cpu_and_memory():
    nodes = [node("a", gpus=1, cpu=2)]
    allocations = [held("x", "a", {"a-gpu0": 1.0}, 1.0, cpu=1)]
    result = schedule(nodes, allocations, [req("cpu-only", cpu=1), req("more", cpu=1)])
    assert placed_ids(result) == ["cpu-only"]
    assert result.placed[0].gpus == {}
    assert result.waiting["more"].reason == (
        "waiting for 1 CPU core; the most free on one node is 0 (a)"
    )


def test_memory_shortage_is_named_in_the_reason():
    nodes = [node("a", mem=4 * GIB)]
    result = schedule(nodes, [held("x", "a", {}, 0, mem=3 * GIB)], [req("r", mem=2 * GIB)])
    assert (
        result.waiting["r"].reason
        == "waiting for 2 GiB memory; the most free on one node is 1 GiB (a)"
    )


def test_a_spanning_request_waiting_says_how_many_gpus_it_needs():
    nodes = [node("a", gpus=2)]
    result = schedule(nodes, [held("x", "a", {"a-gpu0": 0.5}, 0.5)], [req("r", fgpu=2)])
    assert result.waiting["r"].reason == (
        "waiting for 2 fGPU, which spans 2 GPUs on one node; "
        "the most wholly free GPUs on one node is 1 (a)"
    )


def test_a_request_of_one_whole_gpu_says_so_in_the_singular():
    # 1 fGPU at 1 unit per GPU is one whole GPU: not "spans 1 GPUs".
    nodes = [node("a", gpus=1)]
    result = schedule(nodes, [held("x", "a", {"a-gpu0": 0.5}, 0.5)], [req("r", fgpu=1)])
    assert result.waiting["r"].reason == "waiting for 1 fGPU, which needs a whole GPU; none is free"


def test_requests_stay_in_their_resource_group():
    nodes = [node("cpu-box", gpus=1, group="cpu"), node("gpu-box", gpus=1, group="gpu")]
    allocations = [held("x", "gpu-box", {"gpu-box-gpu0": 1.0}, 1.0)]
    result = schedule(nodes, allocations, [req("r", fgpu=0.5, rg="gpu")])
    assert result.placed == ()
    assert result.waiting["r"].cause == "capacity"
    anywhere = schedule(nodes, allocations, [req("r2", fgpu=0.5)])
    assert anywhere.placed[0].node == "cpu-box"


@pytest.mark.parametrize(
    ("placement", "node_1_gpus", "node_1_held"),
    [("best_fit", 1, 0.5), ("fill", 1, 0.5), ("spread", 3, 0)],
)
def test_a_request_goes_first_to_a_node_that_holds_its_image_among_those_with_room(
    placement, node_1_gpus, node_1_held
):
    """node-1 is the placement rule's pick without the image; node-2 holds the image but is
    full, so node-3 (holding it, with room) is taken; with no holder with room, the rule's own
    pick; and a request for another image is not moved."""
    nodes = [node("node-1", gpus=node_1_gpus), node("node-2", gpus=1), node("node-3", gpus=2)]
    busy = [held("h1", "node-2", {"node-2-gpu0": 1.0}, 1)]
    if node_1_held:
        busy.append(held("h2", "node-1", {"node-1-gpu0": node_1_held}, node_1_held))
    holders = {"torch": frozenset({"node-2", "node-3"})}
    image_request = Request("r", "alice", (), Slots(1.0, GIB, 0.5), image="torch")

    def node_of(allocations, request, **kwargs):
        (placed,) = schedule(nodes, allocations, [request], placement=placement, **kwargs).placed
        return placed.node

    assert node_of(busy, image_request) == "node-1"
    assert node_of(busy, image_request, image_nodes=holders) == "node-3"
    other = dataclasses.replace(image_request, image="sklearn")
    assert node_of(busy, other, image_nodes=holders) == "node-1"
    # The holders full: anywhere with room, rather than wait for them.
    full = [*busy, held("h3", "node-3", {"node-3-gpu0": 1.0, "node-3-gpu1": 1.0}, 2)]
    assert node_of(full, image_request, image_nodes=holders) == "node-1"


def test_a_cpu_only_request_goes_to_its_images_holder_too():
    nodes = [node("node-1", gpus=0, cpu=4.0), node("node-2", gpus=0, cpu=16.0)]
    request = Request("r", "alice", (), Slots(1.0, GIB, 0), image="py")
    assert schedule(nodes, [], [request]).placed[0].node == "node-1"  # best fit: least CPU left
    holders = {"py": frozenset({"node-2"})}
    assert schedule(nodes, [], [request], image_nodes=holders).placed[0].node == "node-2"


# ---------------------------------------------------------------------------------------------
# Queue order: backfill with a skip bound, and DRF


def test_backfill_lets_small_requests_pass_a_blocked_one_until_the_skip_bound():
    nodes = [node()]
    allocations = [held("x", "node-0", {"node-0-gpu0": 0.5}, 0.5)]
    big = req("big", fgpu=1)
    smalls = [req(f"small{i}", fgpu=0.1) for i in range(5)]

    result = schedule(nodes, allocations, [big, *smalls], max_skips=3)

    assert placed_ids(result) == ["small0", "small1", "small2"]
    assert result.waiting["big"].skips == 3
    assert result.waiting["small3"].cause == "order"
    assert "overtaken 3 times" in result.waiting["small3"].reason
    assert [result.waiting[r].position for r in ("big", "small3", "small4")] == [1, 2, 3]


def test_a_request_at_the_skip_bound_is_overtaken_by_no_one():
    nodes = [node()]
    allocations = [held("x", "node-0", {"node-0-gpu0": 0.5}, 0.5)]
    big = req("big", fgpu=1, skips=3)
    result = schedule(nodes, allocations, [big, req("small", fgpu=0.1)], max_skips=3)
    assert result.placed == ()
    assert result.waiting["big"].skips == 3
    # Once the GPU frees, the held-back request goes first.
    freed = schedule(nodes, [], [big, req("small", fgpu=0.1)], max_skips=3)
    assert placed_ids(freed) == ["big"]


def test_max_skips_zero_is_strict_fifo():
    nodes = [node()]
    allocations = [held("x", "node-0", {"node-0-gpu0": 0.5}, 0.5)]
    result = schedule(nodes, allocations, [req("big", fgpu=1), req("small", fgpu=0.1)], max_skips=0)
    assert result.placed == ()


def test_skips_count_only_overtakings_in_the_blocked_requests_resource_groups():
    nodes = [node("a", group="ra"), node("b", group="rb")]
    allocations = [held("x", "a", {"a-gpu0": 0.5}, 0.5)]
    big = req("big", fgpu=1, rg="ra", skips=2)
    other = req("other", fgpu=0.5, rg="rb")
    result = schedule(nodes, allocations, [big, other], max_skips=2)
    assert placed_ids(result) == ["other"]
    assert result.waiting["big"].skips == 2


def test_a_request_waiting_on_quota_neither_blocks_others_nor_counts_skips():
    nodes = [node()]
    quotas = Quotas(users={"alice": Quota(max_sessions=1)})
    allocations = [held("x", "node-0", {}, 0, user="alice")]
    capped = req("capped", fgpu=0.5, user="alice", skips=1)
    result = schedule(
        nodes, allocations, [capped, req("bob", fgpu=0.5, user="bob")], quotas, max_skips=1
    )
    assert placed_ids(result) == ["bob"]
    assert result.waiting["capped"].cause == "quota"
    assert result.waiting["capped"].skips == 1


def test_drf_serves_the_user_with_the_smallest_dominant_share_first():
    nodes = [node()]
    allocations = [held("x", "node-0", {"node-0-gpu0": 0.5}, 0.5, user="alice")]
    alice, bob = req("alice-2", fgpu=0.5, user="alice"), req("bob-1", fgpu=0.5, user="bob")
    assert placed_ids(schedule(nodes, allocations, [alice, bob], policy="fifo")) == ["alice-2"]
    drf = schedule(nodes, allocations, [alice, bob], policy="drf")
    assert placed_ids(drf) == ["bob-1"]
    assert drf.waiting["alice-2"].position == 1


def test_drf_alternates_between_users_as_shares_grow():
    nodes = [node(gpus=2)]
    pending = [req(f"a{i}", fgpu=0.5, user="alice") for i in range(4)]
    pending += [req(f"b{i}", fgpu=0.5, user="bob") for i in range(4)]
    result = schedule(nodes, [], pending, policy="drf")
    assert placed_ids(result) == ["a0", "b0", "a1", "b1"]


def test_drf_puts_requests_at_the_skip_bound_first():
    nodes = [node()]
    allocations = [held("x", "node-0", {"node-0-gpu0": 0.5}, 0.5, user="alice")]
    starved = req("alice-old", fgpu=0.5, user="alice", skips=2)
    result = schedule(
        nodes, allocations, [starved, req("bob-1", fgpu=0.5, user="bob")], policy="drf", max_skips=2
    )
    assert placed_ids(result) == ["alice-old"]


# ---------------------------------------------------------------------------------------------
# Quotas


@pytest.mark.parametrize(
    "limits, request_slots, expected",
    [
        (
            SlotLimits(cpu=4),
            Slots(2, GIB, 0),
            "waiting for quota: you hold 3 CPU cores of 4 CPU cores (your quota); this request asks for 2 CPU cores more",
        ),
        (
            SlotLimits(mem=4 * GIB),
            Slots(1, 2 * GIB, 0),
            "waiting for quota: you hold 3 GiB memory of 4 GiB memory (your quota); this request asks for 2 GiB memory more",
        ),
        (
            SlotLimits(fgpu=1),
            Slots(1, GIB, 0.5),
            "waiting for quota: you hold 0.6 fGPU of 1 fGPU (your quota); this request asks for 0.5 fGPU more",
        ),
    ],
)
def test_user_quota_on_summed_slots(limits, request_slots, expected):
    nodes = [node(gpus=2)]
    allocations = [held("x", "node-0", {"node-0-gpu0": 0.6}, 0.6, cpu=3, mem=3 * GIB, user="alice")]
    quotas = Quotas(users={"alice": Quota(max_slots=limits)})
    request = Request("r", "alice", (), request_slots, None, 1)
    result = schedule(nodes, allocations, [request], quotas)
    assert result.placed == ()
    assert result.waiting["r"].cause == "quota"
    assert result.waiting["r"].reason == expected
    # Another user is not held by alice's quota.
    other = Request("o", "bob", (), request_slots, None, 2)
    assert placed_ids(schedule(nodes, allocations, [other], quotas)) == ["o"]


def test_quota_fgpu_sums_exactly():
    quotas = Quotas(default_user=Quota(max_slots=SlotLimits(fgpu=0.3)))
    pending = [req(f"r{i}", fgpu=0.1) for i in range(4)]
    result = schedule([node()], [], pending, quotas)
    assert placed_ids(result) == ["r0", "r1", "r2"]
    assert result.waiting["r3"].cause == "quota"


def test_group_quota_holds_for_the_groups_summed_usage():
    nodes = [node(gpus=2)]
    quotas = Quotas(groups={"students": Quota(max_slots=SlotLimits(fgpu=1))})
    allocations = [
        held("x", "node-0", {"node-0-gpu0": 0.75}, 0.75, user="ann", groups=("students",))
    ]
    bea = req("bea", fgpu=0.5, user="bea", groups=("staff", "students"))
    result = schedule(nodes, allocations, [bea], quotas)
    assert result.waiting["bea"].reason == (
        "waiting for quota: group 'students' holds 0.75 fGPU of 1 fGPU (its quota); "
        "this request asks for 0.5 fGPU more"
    )
    staff_only = req("cid", fgpu=0.5, user="cid", groups=("staff",))
    assert placed_ids(schedule(nodes, allocations, [staff_only], quotas)) == ["cid"]


def test_session_quota_counts_running_sessions_of_user_and_group():
    nodes = [node()]
    quotas = Quotas(default_user=Quota(max_sessions=2), groups={"class": Quota(max_sessions=3)})
    pending = [req(f"a{i}", user="ann", groups=("class",)) for i in range(3)]
    pending += [req(f"b{i}", user="ben", groups=("class",)) for i in range(2)]
    result = schedule(nodes, [], pending, quotas)
    assert placed_ids(result) == ["a0", "a1", "b0"]
    assert result.waiting["a2"].reason == (
        "waiting for quota: you have 2 of 2 sessions (running or starting; your quota)"
    )
    assert result.waiting["b1"].reason == (
        "waiting for quota: group 'class' has 3 of 3 sessions (running or starting; its quota)"
    )


def test_resource_groups_are_granted_by_any_of_the_users_groups():
    nodes = [node("d", group="default"), node("g", group="gpu")]
    quotas = Quotas(
        default_group=Quota(resource_groups=("default",)),
        groups={"gpu-lab": Quota(resource_groups=("default", "gpu"))},
    )
    student = req("s", fgpu=0.5, user="sam", groups=("students",), rg="gpu")
    assert admission_error(student, nodes, quotas) == (
        "You may not use resource group 'gpu'. You may use: default."
    )
    researcher = req("r", fgpu=0.5, user="rae", groups=("students", "gpu-lab"), rg="gpu")
    assert admission_error(researcher, nodes, quotas) is None
    assert schedule(nodes, [], [researcher], quotas).placed[0].node == "g"
    # Without a named group, only the allowed groups are searched, even when they are full.
    full = [held("x", "d", {"d-gpu0": 1.0}, 1.0)]
    anywhere = req("a", fgpu=0.5, user="sam", groups=("students",))
    result = schedule(nodes, full, [anywhere], quotas)
    assert result.placed == ()
    assert result.waiting["a"].cause == "capacity"


def test_user_quota_narrows_the_resource_groups():
    nodes = [node("d", group="default"), node("g", group="gpu")]
    quotas = Quotas(users={"sam": Quota(resource_groups=("gpu",))})
    assert schedule(nodes, [], [req("r", fgpu=0.5, user="sam")], quotas).placed[0].node == "g"


# ---------------------------------------------------------------------------------------------
# What can no longer fit is refused in a pass; unknown settings are refused


def test_schedule_refuses_requests_that_can_no_longer_fit():
    # The inventory shrank after the request was admitted: it must end, not wait forever.
    before = [node("a", gpus=2)]
    request = req("r", fgpu=2)
    assert admission_error(request, before) is None
    after = [node("a", gpus=1)]
    result = schedule(after, [], [request, req("small", fgpu=0.5)])
    assert "r" in result.refused
    assert placed_ids(result) == ["small"]


def test_schedule_rejects_unknown_settings():
    with pytest.raises(ValueError):
        schedule([node()], [], [], policy="lifo")
    with pytest.raises(ValueError):
        schedule([node()], [], [], placement="worst_fit")
    with pytest.raises(ValueError):
        schedule([node()], [], [], units_per_gpu=0)


# ---------------------------------------------------------------------------------------------
# Properties


FGPU_CHOICES = [0.0] + [round(0.1 * i, 1) for i in range(1, 26)]


@st.composite
def clusters(draw):
    nodes = [
        Node(
            f"n{i}",
            draw(st.sampled_from(["ra", "rb"])),
            draw(st.sampled_from([1.0, 2.0, 4.0, 8.0])),
            draw(st.integers(1, 8)) * GIB,
            tuple(Gpu(f"n{i}-g{g}") for g in range(draw(st.integers(0, 4)))),
        )
        for i in range(draw(st.integers(1, 4)))
    ]
    users = ["u0", "u1", "u2"]
    group_sets = [(), ("g1",), ("g2",), ("g1", "g2")]
    requests = [
        Request(
            f"r{i}",
            draw(st.sampled_from(users)),
            draw(st.sampled_from(group_sets)),
            Slots(
                draw(st.sampled_from([0.5, 1.0, 2.0])),
                draw(st.integers(1, 4)) * GIB,
                draw(st.sampled_from(FGPU_CHOICES)),
            ),
            draw(st.sampled_from([None, None, "ra", "rb"])),
            i,
            draw(st.integers(0, 3)),
        )
        for i in range(draw(st.integers(0, 25)))
    ]
    limit = st.one_of(st.none(), st.sampled_from([1.0, 2.0, 3.0]))
    quota = st.builds(
        Quota,
        max_slots=st.builds(SlotLimits, cpu=limit, mem=st.none() | st.just(6 * GIB), fgpu=limit),
        max_sessions=st.none() | st.integers(1, 3),
        resource_groups=st.none() | st.sampled_from([("ra",), ("ra", "rb")]),
    )
    quotas = Quotas(
        users={u: draw(quota) for u in users if draw(st.booleans())},
        groups={g: draw(quota) for g in ("g1", "g2") if draw(st.booleans())},
    )
    return nodes, requests, quotas


def candidate_groups(request: Request, nodes, quotas: Quotas) -> set[str]:
    if request.resource_group is not None:
        return {request.resource_group}
    allowed = quotas.allowed_resource_groups(request.user, request.groups)
    return {n.resource_group for n in nodes if allowed is None or n.resource_group in allowed}


def assert_within_capacity(nodes, allocations, units):
    by_name = {n.name: n for n in nodes}
    for n in nodes:
        mine = [a for a in allocations if a.node == n.name]
        assert sum(round(a.slots.cpu * 1000) for a in mine) <= round(n.cpu * 1000)
        assert sum(a.slots.mem for a in mine) <= n.mem
        for gpu in n.gpus:
            fractions = [a.gpus[gpu.uuid] for a in mine if gpu.uuid in a.gpus]
            assert sum(fraction_quanta(f) for f in fractions) <= QUANTA_PER_GPU
            assert math.fsum(fractions) <= 1.0 + 1e-12
    for a in allocations:
        uuids = {g.uuid for g in by_name[a.node].gpus}
        assert set(a.gpus) <= uuids
        quanta = [fraction_quanta(f) for f in a.gpus.values()]
        assert sum(quanta) == gpu_quanta(a.slots.fgpu, units)
        # Whole GPUs plus at most one fraction.
        assert sum(1 for q in quanta if q < QUANTA_PER_GPU) <= 1


def assert_within_quota(allocations, quotas: Quotas):
    scopes: dict[tuple[str, str], list[Allocation]] = {}
    for a in allocations:
        scopes.setdefault(("user", a.user), []).append(a)
        for g in a.groups:
            scopes.setdefault(("group", g), []).append(a)
    for (kind, name), mine in scopes.items():
        quota = quotas.for_user(name) if kind == "user" else quotas.for_group(name)
        limit = quota.max_slots
        if quota.max_sessions is not None:
            assert len(mine) <= quota.max_sessions
        if limit.cpu is not None:
            assert sum(round(a.slots.cpu * 1000) for a in mine) <= round(limit.cpu * 1000)
        if limit.mem is not None:
            assert sum(a.slots.mem for a in mine) <= limit.mem
        if limit.fgpu is not None:
            assert sum(round(a.slots.fgpu * 10_000) for a in mine) <= round(limit.fgpu * 10_000)


@settings(max_examples=200, deadline=None)
@given(
    cluster=clusters(),
    policy=st.sampled_from(["fifo", "drf"]),
    placement=st.sampled_from(["best_fit", "fill", "spread"]),
    units=st.sampled_from([1, 2, 3, 5]),
    max_skips=st.integers(0, 4),
    data=st.data(),
)
def test_passes_never_overcommit_never_exceed_quota_and_never_starve(
    cluster, policy, placement, units, max_skips, data
):
    nodes, pending, quotas = cluster
    allocations: list[Allocation] = []
    for _ in range(4):
        result = schedule(
            nodes,
            allocations,
            pending,
            quotas,
            policy=policy,
            placement=placement,
            units_per_gpu=units,
            max_skips=max_skips,
        )
        # Every request gets exactly one outcome.
        outcomes = (
            [a.request_id for a in result.placed] + list(result.waiting) + list(result.refused)
        )
        assert sorted(outcomes) == sorted(r.id for r in pending)
        assert result.decisions == len(pending)
        allocations += result.placed
        assert_within_capacity(nodes, allocations, units)
        assert_within_quota(allocations, quotas)

        by_id = {r.id: r for r in pending}
        placed = [by_id[a.request_id] for a in result.placed]
        node_group = {n.name: n.resource_group for n in nodes}
        for request in pending:
            waiting = result.waiting.get(request.id)
            if waiting is None:
                continue
            # Skips only grow, and never past the bound.
            assert request.skips <= waiting.skips <= max(max_skips, request.skips)
            if waiting.cause == "quota":
                assert waiting.skips == request.skips
                continue
            groups = candidate_groups(request, nodes, quotas)
            overtakers = [
                other
                for other, allocation in zip(placed, result.placed, strict=True)
                if node_group[allocation.node] in groups
                and other.enqueued_seq > request.enqueued_seq
            ]
            if policy == "fifo":
                # In FIFO every later request placed where this one could go overtook it.
                assert waiting.skips == request.skips + len(overtakers)
            if request.skips < max_skips:
                continue
            # At the bound and still waiting: nobody behind it took resources it could use.
            for other, allocation in zip(placed, result.placed, strict=True):
                if node_group[allocation.node] not in groups:
                    continue
                assert other.enqueued_seq < request.enqueued_seq
                if policy == "drf":
                    assert other.skips >= max_skips

        assert [w.position for w in result.waiting.values()] == list(
            range(1, len(result.waiting) + 1)
        )
        pending = [
            Request(
                r.id,
                r.user,
                r.groups,
                r.slots,
                r.resource_group,
                r.enqueued_seq,
                result.waiting[r.id].skips,
            )
            for r in pending
            if r.id in result.waiting
        ]
        # Some sessions end before the next pass.
        if allocations:
            ending = data.draw(st.sets(st.sampled_from(range(len(allocations)))))
            allocations = [a for i, a in enumerate(allocations) if i not in ending]


def fits_somewhere(request: Request, nodes, allocations, units, groups) -> bool:
    """Brute force: does any node of `groups` hold the request now?"""
    whole, rest = divmod(gpu_quanta(request.slots.fgpu, units), QUANTA_PER_GPU)
    for free in free_capacity(nodes, allocations, units):
        if free.resource_group not in groups:
            continue
        if round(free.cpu_free * 1000) < round(request.slots.cpu * 1000):
            continue
        if free.mem_free < request.slots.mem:
            continue
        quanta = sorted(round(g.fraction_free * QUANTA_PER_GPU) for g in free.gpus)
        wholes = sum(1 for q in quanta if q == QUANTA_PER_GPU)
        if wholes < whole:
            continue
        if rest == 0 or wholes > whole or any(rest <= q < QUANTA_PER_GPU for q in quanta):
            return True
    return False


@settings(max_examples=200, deadline=None)
@given(
    cluster=clusters(),
    placement=st.sampled_from(["best_fit", "fill", "spread"]),
    units=st.sampled_from([1, 2, 3]),
)
def test_without_a_skip_bound_nothing_waits_that_would_fit(cluster, placement, units):
    """Work conservation: with no quotas and no skip bound in reach, a request that waits for
    capacity really fits on no node after the pass (the search and its shortcuts miss nothing)."""
    nodes, pending, _ = cluster
    result = schedule(nodes, [], pending, placement=placement, units_per_gpu=units, max_skips=10**6)
    allocations = list(result.placed)
    assert_within_capacity(nodes, allocations, units)
    everywhere = {n.resource_group for n in nodes}
    for request in pending:
        if request.id in result.waiting:
            assert result.waiting[request.id].cause == "capacity"
            groups = {request.resource_group} if request.resource_group else everywhere
            assert not fits_somewhere(request, nodes, allocations, units, groups)


# ---------------------------------------------------------------------------------------------
# The shortcuts a pass takes for speed (P1) answer as the long way does


def test_requests_of_one_size_in_different_resource_groups_get_their_own_reasons():
    nodes = [node("a", group="ra"), node("b", group="rb")]
    allocations = [held("h-a", "a", {"a-gpu0": 1.0}, 1), held("h-b", "b", {"b-gpu0": 0.7}, 0.7)]
    pending = [req("in-a", fgpu=0.5, rg="ra"), req("in-b", fgpu=0.5, rg="rb")]
    result = schedule(nodes, allocations, pending)
    assert result.waiting["in-a"].reason == "waiting for 0.5 fGPU; every GPU is fully in use"
    assert result.waiting["in-b"].reason == (
        "waiting for 0.5 fGPU; the most free on one GPU is 0.3 fGPU (gpu-0 on b)"
    )
