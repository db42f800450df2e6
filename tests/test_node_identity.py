"""Who sent a node report (queue_service/engine/node_identity.py): a report is taken only when it is
signed with the key of the node its URL names, now, and later than that node's last one; the
refusals say which check failed. The agent's own signing (node_agent/agent.py) makes the
requests, so both sides are tried together."""

from __future__ import annotations

import json

import pytest

from node_agent import agent
from queue_service.core.errors import Refusal
from queue_service.engine.node_credentials import NodeCredentials
from queue_service.engine.node_identity import NodeIdentity

NODE_A, NODE_B = "a" * 25, "b" * 25
PATH = "/services/queue/api/nodes/worker-1/report"
NOW = 1_800_000_000.0


class Clock:
    def __init__(self):
        self.now = NOW

    def __call__(self):
        return self.now


@pytest.fixture
def keys(tmp_path):
    store = NodeCredentials(tmp_path / "keys.json")
    store.ensure(NODE_A, "worker-1")
    store.ensure(NODE_B, "worker-2")
    return store


@pytest.fixture
def identity(keys):
    return NodeIdentity(keys, max_skew=60, clock=Clock())


def signed(key, node_id=NODE_A, body=b"{}", now=NOW, path=PATH, nonce=None):
    return agent.signed_headers(key, node_id, "POST", path, body, now=now, nonce=nonce)


def test_a_report_signed_with_its_nodes_key_is_taken(keys, identity):
    credential, signed_at = identity.verify(
        "worker-1", "POST", PATH, signed(keys.get(NODE_A).key), b"{}"
    )
    assert credential.node_id == NODE_A and signed_at == NOW


def test_a_node_cannot_report_for_another(keys, identity):
    path = PATH.replace("worker-1", "worker-2")
    headers = signed(keys.get(NODE_A).key, path=path)
    with pytest.raises(Refusal, match="key of node worker-1 cannot report for node worker-2"):
        identity.verify("worker-2", "POST", path, headers, b"{}")
    # Claiming the other node's id without its key fails on the signature.
    headers = signed(keys.get(NODE_A).key, node_id=NODE_B, path=path)
    with pytest.raises(Refusal, match="signature does not match node worker-2's key"):
        identity.verify("worker-2", "POST", path, headers, b"{}")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"headers": {}}, "not signed with a node's key"),
        ({"node_id": "z" * 25}, "has no key here"),
        ({"body": b'{"sessions": {}}'}, "signature does not match"),
        ({"path": PATH + "x"}, "signature does not match"),
        ({"time": "soon"}, "is not a number"),
        ({"time": "nan"}, "is not a number"),
        ({"nonce": ""}, "signature does not match"),
    ],
)
def test_an_unsigned_or_altered_report_is_refused(keys, identity, change, message):
    key = keys.get(NODE_A).key
    headers = change.get("headers", signed(key, node_id=change.get("node_id", NODE_A)))
    if "time" in change:
        headers[agent.TIME_HEADER] = change["time"]
    if "nonce" in change:
        headers[agent.NONCE_HEADER] = change["nonce"]
    with pytest.raises(Refusal, match=message) as refused:
        identity.verify(
            "worker-1", "POST", change.get("path", PATH), headers, change.get("body", b"{}")
        )
    assert refused.value.cause == "forbidden"


def test_a_replayed_or_stale_report_is_refused(keys, identity):
    key = keys.get(NODE_A).key
    first = signed(key)
    identity.verify("worker-1", "POST", PATH, first, b"{}")
    with pytest.raises(Refusal, match="a replay"):
        identity.verify("worker-1", "POST", PATH, first, b"{}")
    # An older one recorded earlier, sent after a newer one was taken.
    with pytest.raises(Refusal, match="a replay"):
        identity.verify("worker-1", "POST", PATH, signed(key, now=NOW - 5), b"{}")
    # Out of the clock's window either way.
    for off in (-61, 61):
        with pytest.raises(Refusal, match="s away from this service's clock"):
            identity.verify("worker-1", "POST", PATH, signed(key, now=NOW + off), b"{}")
    # A forged report cannot move the node's last time forward and lock it out.
    forged = signed("00" * 32, now=NOW + 30)
    with pytest.raises(Refusal, match="signature does not match"):
        identity.verify("worker-1", "POST", PATH, forged, b"{}")
    identity.verify("worker-1", "POST", PATH, signed(key, now=NOW + 1), b"{}")


def test_a_rotated_key_is_refused_at_once(keys, identity):
    old = keys.get(NODE_A).key
    NodeCredentials(keys.path).rotate("worker-1")  # as `fgpu-hub node-agent rotate` does
    with pytest.raises(Refusal, match="signature does not match"):
        identity.verify("worker-1", "POST", PATH, signed(old), b"{}")
    new = keys.get(NODE_A).key
    identity.verify("worker-1", "POST", PATH, signed(new), b"{}")


def test_a_reports_sampled_at_must_agree_with_its_signed_time(identity):
    report = agent.build_report("worker-1", "2027-01-15T08:00:00+00:00", {}, None)
    signed_at = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    identity.check_sampled_at(report["sampled_at"], signed_at + 30)
    with pytest.raises(Refusal, match="a stale report"):
        identity.check_sampled_at(report["sampled_at"], signed_at + 600)
    with pytest.raises(Refusal, match="not an ISO time") as refused:
        identity.check_sampled_at("yesterday", signed_at)
    assert refused.value.cause == "invalid"
    assert json.dumps(report)  # the agent's own report shape is what is checked


def test_a_signature_header_that_is_not_ascii_is_refused_not_a_crash(keys, identity):
    headers = signed(keys.get(NODE_A).key)
    headers[agent.SIGNATURE_HEADER] = "é" * 64  # tornado hands headers over as latin-1 text
    with pytest.raises(Refusal, match="signature does not match"):
        identity.verify("worker-1", "POST", PATH, headers, b"{}")
    assert not agent.answer_is_genuine(keys.get(NODE_A).key, "n1", b"{}", "é" * 64)
