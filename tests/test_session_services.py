"""`queue_service.engine.session_services`: which Swarm services still hold their session's slice."""

import pytest

from queue_service.engine.session_services import live_sessions, nodes_down, orphan_networks

NODES = [
    {"ID": "n1", "Description": {"Hostname": "node-1"}, "Status": {"State": "ready"}},
    {"ID": "n2", "Description": {"Hostname": "node-2"}, "Status": {"State": "down"}},
]


def service(sid: str, service_id: str | None = None) -> dict:
    return {"ID": service_id or f"svc-{sid}", "Spec": {"Labels": {"fgpu.session_id": sid}}}


def task(sid: str, node: str, state: str, desired: str = "running", created: str = "1") -> dict:
    return {
        "ServiceID": f"svc-{sid}",
        "NodeID": node,
        "CreatedAt": created,
        "DesiredState": desired,
        "Status": {"State": state, "Err": "boom" if state == "failed" else None},
    }


def sort(services, tasks, down_since=None, now=100.0, grace=30.0):
    return live_sessions(services, tasks, NODES, down_since or {}, now, grace)


@pytest.mark.parametrize("state", ["pending", "assigned", "preparing", "starting", "running"])
def test_a_starting_or_running_task_on_a_ready_node_is_alive(state):
    found = sort([service("a")], [task("a", "n1", state)])
    assert list(found.alive) == ["a"]
    assert found.alive["a"].node == "node-1"
    assert found.alive["a"].attrs["Labels"]["fgpu.session_id"] == "a"
    assert found.gone == {}


@pytest.mark.parametrize(
    ("state", "desired", "reason"),
    [
        ("failed", "shutdown", "its Swarm task ended (failed: boom)"),
        ("rejected", "shutdown", "its Swarm task ended (rejected"),
        ("shutdown", "shutdown", "its Swarm task ended (shutdown"),
        ("running", "shutdown", "its Swarm task ended (running"),
    ],
)
def test_an_ended_task_is_gone_with_swarms_words(state, desired, reason):
    found = sort([service("a")], [task("a", "n1", state, desired)])
    assert found.alive == {}
    assert found.gone["a"][0].startswith(reason)


def test_a_task_on_a_down_node_is_alive_within_the_grace_and_lost_after():
    # The manager wants a down node's tasks shut down at once; only the grace decides.
    tasks = [task("a", "n2", "running", desired="shutdown")]
    within = sort([service("a")], tasks, down_since={"node-2": 80.0}, now=100.0, grace=30.0)
    assert list(within.alive) == ["a"]
    after = sort([service("a")], tasks, down_since={"node-2": 60.0}, now=100.0, grace=30.0)
    assert after.alive == {}
    assert after.gone["a"][0] == "its node node-2 went down (no contact for 40 s)"
    assert after.gone["a"][1].id == "svc-a"


def test_the_newest_task_speaks_for_its_service_and_unlabelled_services_are_ignored():
    tasks = [task("a", "n1", "failed", "shutdown", created="1"), task("a", "n1", "running")]
    tasks[1]["CreatedAt"] = "2"
    unlabelled = {"ID": "svc-x", "Spec": {"Labels": {}}}
    found = sort([service("a"), unlabelled], tasks)
    assert list(found.alive) == ["a"]
    assert "svc-x" not in str(found.gone)


def test_a_service_without_a_task_is_gone():
    assert sort([service("a")], []).gone["a"][0] == "its Swarm service has no task"


def test_nodes_down_keeps_the_first_time_a_node_was_seen_down_and_forgets_it_once_back():
    first = nodes_down(NODES, {}, now=10.0)
    assert first == {"node-2": 10.0}
    assert nodes_down(NODES, first, now=20.0) == {"node-2": 10.0}
    back = [NODES[0], {**NODES[1], "Status": {"State": "ready"}}]
    assert nodes_down(back, first, now=30.0) == {}


def test_a_session_overlay_is_an_orphan_from_the_first_round_its_service_is_missing():
    networks = [{"Id": "net-a", "Name": "jupyter-ann"}, {"Id": "net-b", "Name": "jupyter-bob"}]
    services = [{"ID": "svc-a", "Spec": {"Name": "jupyter-ann", "Labels": {}}}]
    first = orphan_networks(networks, services, {}, now=10.0)
    assert first == {"net-b": 10.0}
    # Still an orphan later: seen first at 10; and forgotten once it is gone.
    assert orphan_networks(networks, services, first, now=20.0) == {"net-b": 10.0}
    assert orphan_networks(networks[:1], services, first, now=30.0) == {}
    # Its service back (a session of that name again): no longer an orphan.
    both = [*services, {"ID": "svc-b", "Spec": {"Name": "jupyter-bob"}}]
    assert orphan_networks(networks, both, first, now=40.0) == {}
