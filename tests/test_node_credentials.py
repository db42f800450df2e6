"""Each node's own key (queue_service/engine/node_credentials.py): made once per Swarm node id, kept
private, rotated on demand, forgotten when the node leaves, and read again when another process
(`fgpu-hub node-agent rotate`) changed the file."""

from __future__ import annotations

import os
import stat

import pytest

from queue_service.core.errors import Refusal
from queue_service.engine.node_credentials import NodeCredentials

NODE_A, NODE_B = "a" * 25, "b" * 25


def test_a_key_is_made_once_per_node_id_and_kept_private(tmp_path):
    path = tmp_path / "keys.json"
    store = NodeCredentials(path)
    first = store.ensure(NODE_A, "worker-1")
    assert len(first.key) == 64 and first.hostname == "worker-1"
    assert store.ensure(NODE_A, "worker-1") == first
    assert store.ensure(NODE_B, "worker-2").key != first.key
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # Another process reads the same keys.
    assert NodeCredentials(path).get(NODE_A) == first
    # A node whose hostname changed keeps its key under its new name.
    renamed = store.ensure(NODE_A, "worker-1b")
    assert (renamed.key, renamed.hostname) == (first.key, "worker-1b")


def test_rotating_makes_a_new_key_seen_at_once_by_a_store_that_read_the_old_one(tmp_path):
    path = tmp_path / "keys.json"
    service, command = NodeCredentials(path), NodeCredentials(path)
    old = service.ensure(NODE_A, "worker-1")
    rotated = command.rotate("worker-1")
    assert rotated.key != old.key and rotated.node_id == NODE_A
    assert service.get(NODE_A).key == rotated.key
    assert command.rotate(NODE_A).key not in (old.key, rotated.key)  # by its id too
    with pytest.raises(Refusal, match="No node agent key is kept for node 'nowhere'"):
        command.rotate("nowhere")


def test_the_keys_of_nodes_that_left_are_forgotten(tmp_path):
    store = NodeCredentials(tmp_path / "keys.json")
    store.ensure(NODE_A, "worker-1")
    store.ensure(NODE_B, "worker-2")
    assert store.keep_only([NODE_B]) == ["worker-1"]
    assert store.get(NODE_A) is None and store.get(NODE_B) is not None
    assert store.keep_only([NODE_B]) == []


def test_a_readable_damaged_or_badly_named_store_is_refused(tmp_path):
    path = tmp_path / "keys.json"
    store = NodeCredentials(path)
    with pytest.raises(Refusal, match="not a Swarm node id"):
        store.ensure("../etc", "worker-1")
    assert not path.exists()  # nothing half-written
    store.ensure(NODE_A, "worker-1")
    os.chmod(path, 0o644)
    with pytest.raises(Refusal, match="readable by others"):
        NodeCredentials(path).get(NODE_A)
    os.chmod(path, 0o600)
    path.write_text('{"nodes": [1, 2]}')
    with pytest.raises(Refusal, match="damaged"):
        NodeCredentials(path).get(NODE_A)


def test_a_second_node_with_a_hostname_another_node_holds_gets_no_key(tmp_path):
    """Reports, orders and results go by hostname: a clone, or a node renamed to pass for another,
    must not sign as it."""
    store = NodeCredentials(tmp_path / "keys.json")
    first = store.ensure(NODE_A, "worker-1")
    with pytest.raises(Refusal, match="has the hostname 'worker-1' of node a+") as refused:
        store.ensure(NODE_B, "worker-1")
    assert refused.value.cause == "conflict"
    assert store.get(NODE_B) is None and store.get(NODE_A) == first
    # Renamed to a hostname of its own, it gets its key.
    assert store.ensure(NODE_B, "worker-2").hostname == "worker-2"
