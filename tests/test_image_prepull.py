"""The nodes' background pulls of the catalog's images (queue_service/engine/image_prepull.py):
which node pulls what, the backoff of failed pulls, and the states the pages show, driven by real
node reports (node_reports.py) on a fake clock."""

from __future__ import annotations

from queue_service.engine.image_prepull import (
    BACKOFF_MAX_S,
    ImagePrepull,
    OfferedImage,
    PullState,
    backoff,
    offered_images,
    pulls_due,
)
from queue_service.engine.node_reports import NodeReports, parse_report

from .test_node_reports import Clock, body

REGISTRY = "10.0.0.1:5000"
DIGEST = "sha256:" + "a" * 64
BASE = OfferedImage("python-3.11", f"{REGISTRY}/fgpu/jupyter-base@{DIGEST}")
TORCH = OfferedImage("pytorch", f"{REGISTRY}/fgpu/pytorch@sha256:{'b' * 64}")
CUDA = OfferedImage("cuda", f"{REGISTRY}/fgpu/cuda@sha256:{'c' * 64}", gpu=True)


def test_the_offered_images_are_the_shared_visible_pinned_ones_pulled_as_sessions_start_them():
    entry = {"name": "a", "image": "fgpu/a:1", "digest": DIGEST, "gpu": False}
    entry.update(hidden=False, owner=None)
    catalog = [
        entry,
        {**entry, "name": "hidden", "hidden": True},
        {**entry, "name": "private", "owner": "jo"},
        {**entry, "name": "unpinned", "digest": None},
        {**entry, "name": "gpu", "gpu": True},
        {**entry, "name": "elsewhere", "image": "registry.example.org/x/y:2"},
    ]
    assert offered_images(catalog, REGISTRY) == [
        OfferedImage("a", f"{REGISTRY}/fgpu/a@{DIGEST}"),
        OfferedImage("gpu", f"{REGISTRY}/fgpu/a@{DIGEST}", gpu=True),
        OfferedImage("elsewhere", f"registry.example.org/x/y@{DIGEST}"),
    ]
    assert offered_images(catalog, "") == []  # no registry: nothing to pull from


def test_a_node_pulls_what_it_can_run_and_lacks_one_at_a_time_and_not_before_its_backoff():
    images = [BASE, TORCH, CUDA]
    held = frozenset({BASE.reference})
    # GPU images only where GPUs are; what the node holds is not pulled again.
    assert pulls_due(images, 0, held, {}, now=0, per_node=5) == [TORCH]
    assert pulls_due(images, 1, held, {}, now=0, per_node=5) == [TORCH, CUDA]
    # At most per_node at once: one running leaves none, and it is not ordered twice.
    running = {TORCH.reference: PullState(order_id="o1")}
    assert pulls_due(images, 1, held, running, now=0, per_node=1) == []
    assert pulls_due(images, 1, held, running, now=0, per_node=2) == [CUDA]
    # A failed one waits for its backoff.
    failed = {TORCH.reference: PullState(attempts=1, error="x", next_try=30)}
    assert pulls_due(images, 0, held, failed, now=29, per_node=1) == []
    assert pulls_due(images, 0, held, failed, now=30, per_node=1) == [TORCH]


def test_the_backoff_doubles_from_thirty_seconds_up_to_half_an_hour():
    assert [backoff(n) for n in (1, 2, 3, 4)] == [30, 60, 120, 240]
    assert backoff(30) == BACKOFF_MAX_S == 1800


def report(reports: NodeReports, node: str, images, results=()):
    reports.put(parse_report(node, body(node, images=sorted(images), order_results=list(results))))


def test_a_joining_node_is_ordered_pulls_and_its_states_follow_its_reports(caplog):
    clock = Clock()
    reports = NodeReports(stale_after=20, clock=clock)
    prepull = ImagePrepull(reports, per_node=1, pull_timeout=600, clock=clock)
    images, nodes = [BASE, TORCH, CUDA], {"warm": 0, "new": 0}
    report(reports, "warm", {BASE.reference, TORCH.reference})
    assert prepull.plan("warm", images, 0) == []

    # Its first report: one pull ordered (the next once it is done), given in the answer.
    report(reports, "new", set())
    (order,) = prepull.plan("new", images, 0)
    assert order["kind"] == "pull" and order["image"] == BASE.reference
    assert reports.take_orders("new") == [order]
    report(reports, "new", set())
    assert prepull.plan("new", images, 0) == []  # running: neither again nor another
    by_image = prepull.by_image(images, nodes)
    assert by_image["python-3.11"]["present"] == 1 and by_image["python-3.11"]["of"] == 2
    assert by_image["python-3.11"]["pulling"] == 1
    assert {s["node"]: s["state"] for s in by_image["python-3.11"]["nodes"]} == {
        "new": "pulling",
        "warm": "present",
    }
    assert by_image["cuda"] == {"present": 0, "pulling": 0, "of": 0, "nodes": []}  # no GPU node

    # It failed: the reason is kept, and the pull tried again after the backoff only.
    failure = {"id": order["id"], "kind": "pull", "ok": False, "error": "manifest unknown"}
    report(reports, "new", set(), [failure])
    (next_order,) = prepull.plan("new", images, 0)
    assert next_order["image"] == TORCH.reference  # the failed one waits; the next goes
    state = prepull.state_of(BASE, "new")
    assert state["state"] == "failed" and state["error"] == "manifest unknown"
    assert state["retry_in_s"] == 30
    assert (
        f"Node new could not pull {BASE.reference} (1 time(s) in a row; tried again in 30 s): "
        "manifest unknown"
    ) in caplog.text
    reports.take_orders("new")
    done = {"id": next_order["id"], "kind": "pull", "ok": True, "image": TORCH.reference}
    report(reports, "new", {TORCH.reference}, [done])
    assert prepull.plan("new", images, 0) == []
    clock.now += 30
    report(reports, "new", {TORCH.reference})
    (again,) = prepull.plan("new", images, 0)
    assert again["image"] == BASE.reference
    reports.take_orders("new")
    report(reports, "new", {TORCH.reference, BASE.reference}, [{**done, "id": again["id"]}])
    prepull.plan("new", images, 0)

    assert prepull.by_node(images, nodes)["new"] == {"present": 2, "offered": 2, "lacking": []}
    assert prepull.holders(images, nodes)["pytorch"] == {"new"}  # warm's report is stale now
    report(reports, "warm", {BASE.reference, TORCH.reference})
    assert prepull.holders(images, nodes) == {
        "python-3.11": frozenset({"new", "warm"}),
        "pytorch": frozenset({"new", "warm"}),
        "cuda": frozenset(),
    }


def test_a_pull_without_a_result_or_that_does_not_show_counts_as_failed():
    clock = Clock()
    reports = NodeReports(stale_after=1e9, clock=clock)
    prepull = ImagePrepull(reports, per_node=1, pull_timeout=600, clock=clock)
    report(reports, "n", set())
    (order,) = prepull.plan("n", [BASE], 0)
    reports.take_orders("n")
    clock.now += 601  # the agent restarted mid-pull, say
    report(reports, "n", set())
    prepull.plan("n", [BASE], 0)
    assert "no result from the node's agent within 600 s" in prepull.state_of(BASE, "n")["error"]

    clock.now += 30
    report(reports, "n", set())
    (order,) = prepull.plan("n", [BASE], 0)
    reports.take_orders("n")
    # Done, by the agent's word, but the node does not list it: no tight loop of pulls.
    ok = {"id": order["id"], "kind": "pull", "ok": True, "image": BASE.reference}
    report(reports, "n", set(), [ok])
    assert prepull.plan("n", [BASE], 0) == []
    state = prepull.state_of(BASE, "n")
    assert state["state"] == "failed" and "does not list" in state["error"]
    assert state["retry_in_s"] == 60


def test_a_node_whose_agent_lists_no_images_or_is_silent_is_ordered_nothing():
    clock = Clock()
    reports = NodeReports(stale_after=20, clock=clock)
    prepull = ImagePrepull(reports, clock=clock)
    reports.put(parse_report("old", body("old")))  # an agent that does not list its images
    assert prepull.plan("old", [BASE], 0) == []
    assert prepull.state_of(BASE, "old")["state"] == "unknown"
    assert prepull.state_of(BASE, "never")["state"] == "unknown"
