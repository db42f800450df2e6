"""The store of node agents' reports (queue_service/engine/node_reports.py): what a report must look like,
and what the service reads back (usage, GPUs, session ids), with staleness on a fake clock; and
orders for a node's agent."""

from __future__ import annotations

import asyncio
import math

import pytest

from queue_service.core.errors import Refusal
from queue_service.engine.node_reports import NodeReports, isolation_problems, parse_report


def body(node="node-1", **changes):
    report = {
        "version": 2,
        "node": node,
        "sampled_at": "2026-11-24T03:00:00+00:00",
        "sessions": {
            "abc123": {
                "container": "c" * 64,
                "state": "running",
                "cpu_percent": 42.5,
                "mem_bytes": 100,
                "mem_limit_bytes": 1000,
            }
        },
        "gpus": [
            {
                "uuid": "GPU-1",
                "name": "A100",
                "index": 0,
                "memory_total": 40,
                "memory_used": 1,
                "util_percent": None,
            }
        ],
        "order_results": [],
        "agent": {"rss_bytes": 1, "cpu_seconds": 0.5, "other": "dropped"},
    }
    report.update(changes)
    return report


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize(
    ("node", "data", "message"),
    [
        ("node-1", [], "a JSON object"),
        # An agent of an earlier hub, until the service deploys its own: the orders of the
        # answer would never be carried out (it read them under another key).
        ("node-1", body(version=1), "Unknown report version 1; expected 2 (the node runs an agent"),
        ("node-1", body(node="node-2"), "names node 'node-2' but was sent for 'node-1'"),
        ("-bad", body(node="-bad"), "not a node's hostname"),
        ("node-1", body(sessions=[]), "sessions must be an object"),
        ("node-1", body(sessions={"a b": {}}), "not a session id"),
        ("node-1", body(sessions={"s": 3}), "usage must be an object"),
        ("node-1", body(sessions={"s": {"container": "c", "mem_bytes": -1}}), "mem_bytes"),
        (
            "node-1",
            body(
                sessions={
                    "s": {
                        "container": "c",
                        "mem_bytes": 1,
                        "mem_limit_bytes": 1,
                        "cpu_percent": math.inf,
                    }
                }
            ),
            "cpu_percent must be a number",
        ),
        ("node-1", body(gpus={}), "gpus must be a list"),
        ("node-1", body(gpus=[{"uuid": "GPU-1"}]), "name must be a non-empty string"),
        ("node-1", body(order_results=[{"ok": True}]), "each with its id"),
        ("node-1", body(sampled_at=""), "sampled_at"),
        ("node-1", body(agent=[]), "agent must be an object"),
        ("node-1", body(daemon=[]), "daemon must be an object"),
        ("node-1", body(daemon={"icc": "false"}), "daemon: icc must be true, false or null"),
        ("node-1", body(daemon={"no_new_privileges": 1}), "no_new_privileges must be true"),
        ("node-1", body(images="a@sha256:1"), "images must be a list of at most 10000"),
        ("node-1", body(images=["x" * 513]), "images must be a list"),
        ("node-1", body(images=[""]), "images must be a list"),
        ("node-1", body(images=["a"] * 10_001), "images must be a list"),
    ],
)
def test_a_bad_report_is_refused_with_what_is_wrong(node, data, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_report(node, data)


def test_a_report_gives_usage_gpus_and_session_ids_while_it_is_fresh():
    clock = Clock()
    store = NodeReports(stale_after=20, clock=clock)
    assert store.session_ids("node-1") is None and store.stale("node-1")
    store.put(parse_report("node-1", body(), size=900))
    assert store.usage("abc123") == {
        "cpu_percent": 42.5,
        "mem_bytes": 100,
        "mem_limit_bytes": 1000,
        "gpu_mem_bytes": None,
        "gpu_util_percent": None,
        "sampled_at": "2026-11-24T03:00:00+00:00",
    }
    assert [gpu.uuid for gpu in store.gpus("node-1")] == ["GPU-1"]
    assert store.session_ids("node-1") == {"abc123"}
    (summary,) = store.nodes()
    assert summary["report_bytes"] == 900 and summary["agent"] == {
        "rss_bytes": 1,
        "cpu_seconds": 0.5,
    }

    clock.now += 21  # silent for longer than stale_after: unknown, not "nothing runs"
    assert store.stale("node-1") and store.nodes()[0]["stale"]
    assert store.usage("abc123") is None
    assert store.session_ids("node-1") is None and store.gpus("node-1") is None


def test_a_session_that_moved_or_ended_is_read_from_its_last_node():
    store = NodeReports(clock=Clock())
    store.put(parse_report("node-1", body()))
    store.put(parse_report("node-2", body(node="node-2", sessions={})))
    assert store.usage("abc123")["mem_bytes"] == 100
    moved = body("node-2")
    moved["sessions"]["abc123"]["mem_bytes"] = 7
    store.put(parse_report("node-2", moved))
    store.put(parse_report("node-1", body(sessions={})))  # node-1's later report no longer has it
    assert store.usage("abc123")["mem_bytes"] == 7
    store.put(parse_report("node-2", body("node-2", sessions={})))
    assert store.usage("abc123") is None
    assert store.session_ids("node-1") == set() and store.gpus("node-2")[0].uuid == "GPU-1"


IMAGE = "10.213.0.1:5000/fgpu-private/ann:t1"
DIGEST, IMAGE_ID = "sha256:" + "d" * 64, "sha256:" + "e" * 64
ORDER = {"id": "o1", "kind": "commit", "image": IMAGE, "push": True}
DONE = {"id": "o1", "ok": True, "image": IMAGE, "image_id": IMAGE_ID, "digest": DIGEST}


def test_orders_go_out_with_the_next_answer_and_results_come_back():
    store = NodeReports(clock=Clock())
    store.queue_order("node-1", ORDER)
    assert store.take_orders("node-2") == []
    assert store.take_orders("node-1") == [ORDER]
    assert store.take_orders("node-1") == []
    store.put(parse_report("node-1", body(order_results=[DONE])))
    assert store.order_result("o1") == {**DONE, "node": "node-1", "kind": "commit"}


def test_only_the_node_an_order_was_given_to_may_answer_it():
    store = NodeReports(clock=Clock())
    store.queue_order("node-1", ORDER)
    store.put(parse_report("node-1", body(order_results=[DONE])))  # before it was given out
    assert store.order_result("o1") is None
    store.take_orders("node-1")
    store.put(parse_report("node-2", body("node-2", order_results=[DONE])))  # another node's answer
    assert store.order_result("o1") is None
    store.put(
        parse_report("node-1", body(order_results=[{**DONE, "ok": False, "error": "disk full"}]))
    )
    assert store.order_result("o1")["error"] == "disk full"
    store.put(parse_report("node-1", body(order_results=[DONE])))  # answered once, not twice
    assert store.order_result("o1")["ok"] is False


@pytest.mark.parametrize(
    ("change", "fault"),
    [
        ({"image": "10.213.0.1:5000/fgpu/jupyter-base:py3.11"}, "is not the order's"),
        ({"image_id": "abc"}, "image_id is not a sha256 digest"),
        ({"digest": None}, "digest is not a sha256 digest"),
    ],
)
def test_a_result_that_does_not_match_its_order_counts_as_a_failure(change, fault):
    store = NodeReports(clock=Clock())
    store.queue_order("node-1", ORDER)
    store.take_orders("node-1")
    store.put(parse_report("node-1", body(order_results=[{**DONE, **change}])))
    result = store.order_result("o1")
    assert result["ok"] is False and fault in result["error"]


def test_a_pull_result_counts_only_for_the_image_its_order_named():
    store = NodeReports(clock=Clock())
    pull = {"id": "p1", "kind": "pull", "image": "r/a@sha256:" + "a" * 64}
    store.queue_order("node-1", pull)
    store.queue_order("node-1", {**pull, "id": "p2"})
    store.take_orders("node-1")
    done = {"id": "p1", "kind": "pull", "ok": True, "image": pull["image"]}
    store.put(
        parse_report("node-1", body(order_results=[done, {**done, "id": "p2", "image": "x"}]))
    )
    assert store.order_result("p1")["ok"] is True
    assert "image 'x' is not the order's" in store.order_result("p2")["error"]
    assert store.report("node-1").images is None  # an agent that does not list them
    store.put(parse_report("node-1", body(images=[pull["image"]])))
    assert store.report("node-1").images == {pull["image"]}


def test_the_store_holds_a_bounded_number_of_nodes():
    store = NodeReports(clock=Clock(), max_nodes=2)
    for node in ("a", "b"):
        store.put(parse_report(node, body(node)))
    store.put(parse_report("a", body("a")))  # a known node may always report again
    with pytest.raises(Refusal, match="Reports of 2 nodes"):
        store.put(parse_report("c", body("c")))
    assert [n["node"] for n in store.nodes()] == ["a", "b"]


async def test_an_order_is_given_to_its_node_and_its_result_awaited():
    store = NodeReports(clock=Clock())
    store.put(parse_report("node-1", body()))
    waiting = asyncio.ensure_future(store.run_order("node-1", ORDER, 5))
    await asyncio.sleep(0)
    assert store.take_orders("node-1") == [ORDER]  # the next answer's
    store.put(parse_report("node-1", body(order_results=[DONE])))
    assert (await waiting)["digest"] == DIGEST


async def test_an_order_for_a_silent_node_is_refused_and_an_unanswered_one_withdrawn():
    clock = Clock()
    store = NodeReports(stale_after=20, clock=clock)
    with pytest.raises(Refusal, match="no fresh report") as refused:
        await store.run_order("node-1", {"kind": "commit"}, 5)
    assert refused.value.cause == "unavailable"
    store.put(parse_report("node-1", body()))
    with pytest.raises(Refusal, match="no result within 0.05 s"):
        await store.run_order("node-1", {"kind": "commit"}, 0.05)
    assert store.take_orders("node-1") == []  # not given out after its caller gave up


ISOLATED = {"icc": False, "no_new_privileges": True}


def test_a_node_whose_engine_keeps_sessions_apart_has_no_isolation_problem():
    store = NodeReports()
    store.put(parse_report("node-1", body(daemon=ISOLATED)))
    (node,) = store.nodes()
    assert node["daemon"] == ISOLATED
    assert node["isolation_problems"] == []


def test_a_report_without_the_daemon_field_is_taken_and_its_node_flagged_unknown():
    store = NodeReports()
    store.put(parse_report("node-1", body()))  # no "daemon"
    (node,) = store.nodes()
    assert node["daemon"] == {"icc": None, "no_new_privileges": None}
    assert [p.split(" ", 2)[:2] for p in node["isolation_problems"]] == [
        ["icc", "unknown"],
        ["no_new_privileges", "unknown"],
    ]


def test_icc_on_or_privileges_allowed_are_named_with_what_they_let_a_session_do():
    assert isolation_problems({"icc": True, "no_new_privileges": True}) == [
        "icc is true: sessions on the node's bridge can reach one another"
    ]
    assert isolation_problems({"icc": False, "no_new_privileges": False}) == [
        "no_new_privileges is false: a setuid program in a session can gain privileges"
    ]
