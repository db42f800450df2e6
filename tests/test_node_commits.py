"""Saving a session on its node through the agent (queue_service/engine/node_commits.py): the order, and the
answers when the node does not run the session or the agent's commit fails. The real commit and
push on a lab node are tried in tests/test_node_agent_lab.py."""

from __future__ import annotations

import asyncio

import pytest

from queue_service.core.errors import Refusal
from queue_service.engine.node_commits import commit_on_node, commit_order
from queue_service.engine.node_reports import NodeReports, parse_report
from queue_service.private_images import session_commit

from .test_node_reports import Clock, body


def test_a_commit_order_names_the_private_image_in_the_registry():
    order = commit_order("s1", session_commit("s1", "alice", "t1"), "10.213.0.1:5000")
    assert order["image"] == "10.213.0.1:5000/fgpu-private/alice:t1"
    assert order["labels"] == {"fgpu.private-owner": "alice", "fgpu.private-from-session": "s1"}
    assert order["message"] == "fGPU hub: session s1 of alice"
    bob = commit_order("s1", session_commit("s1", "Bob@x", "t1"), "r:5000")
    assert bob["image"].startswith("r:5000/fgpu-private/u_")
    with pytest.raises(Refusal, match="tag must be"):
        session_commit("s1", "alice", "-bad")
    with pytest.raises(Refusal, match="not a registry address"):
        commit_order("s1", session_commit("s1", "alice", "t1"), "r:5000/path")


async def test_a_commit_on_a_node_that_does_not_run_the_session_is_a_conflict():
    store = NodeReports(clock=Clock())
    store.put(parse_report("node-1", body()))
    with pytest.raises(Refusal, match="runs no container of session other") as refused:
        await commit_on_node(
            store, "node-1", "other", session_commit("other", "alice", "t1"), "r:5"
        )
    assert refused.value.cause == "conflict" and store.take_orders("node-1") == []
    waiting = asyncio.ensure_future(
        commit_on_node(store, "node-1", "abc123", session_commit("abc123", "alice", "t1"), "r:5")
    )
    await asyncio.sleep(0)
    (order,) = store.take_orders("node-1")
    store.put(
        parse_report(
            "node-1", body(order_results=[{"id": order["id"], "ok": False, "error": "full"}])
        )
    )
    with pytest.raises(Refusal, match="could not save session abc123: full") as refused:
        await waiting
    assert refused.value.cause == "engine"
