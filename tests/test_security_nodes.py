"""`POST api/nodes/{hostname}/report` (handlers/nodes.py) against the real hub and service: only the
node agents' hub identity may report; students, admins' narrow tokens, the spawner and cross-site
cookies are refused, and a bad report is a 400 that stores nothing. Beyond the hub identity, a
report must be signed with the key of the node it names (node_identity.py): another node's key,
no signature, a replay or a stale report is a 403 that stores nothing, and the answer comes back
signed. `POST api/nodes/{hostname}/key` (a new key for a node) is for full admins alone.

The keys are the hub's own (its state directory's `fgpu_node_credentials.json`), made here for
made-up node ids as the deployment makes them for real ones."""

from __future__ import annotations

import json
import secrets
import time
from urllib.parse import urlsplit

import pytest
import requests

from node_agent import agent
from queue_service.engine.node_credentials import CREDENTIALS_FILE, NodeCredentials

from .harness import QueueUser
from .test_security_handlers import EVIL, Browser, narrow_admin_token

pytestmark = [pytest.mark.docker, pytest.mark.hub]


def agent_token(hub) -> str:
    return (hub.workdir / "fgpu_node_agent_token").read_text().strip()


def report_url(hub, node: str) -> str:
    return f"{hub.url}/services/queue/api/nodes/{node}/report"


def a_report(node: str) -> dict:
    sessions = {
        secrets.token_hex(8): {
            "container": secrets.token_hex(32),
            "state": "running",
            "cpu_percent": 12.5,
            "mem_bytes": 1 << 20,
            "mem_limit_bytes": 1 << 28,
        }
    }
    return agent.build_report(node, agent.now_iso(), sessions, None)


def post(token: str | None, url: str, **kwargs) -> requests.Response:
    headers = {"Authorization": f"token {token}"} if token else {}
    return requests.post(
        url, headers={**headers, **kwargs.pop("headers", {})}, timeout=60, **kwargs
    )


def a_node(hub) -> tuple[str, str, str]:
    """(hostname, node id, key) of a node the hub holds a key for."""
    node, node_id = f"node-{secrets.token_hex(3)}", secrets.token_hex(12) + "n"
    key = NodeCredentials(hub.workdir / CREDENTIALS_FILE).ensure(node_id, node).key
    return node, node_id, key


AGENTS = "the node agents' token"


def signed_post(hub, node, data: bytes, key, node_id, token=AGENTS, **signing):
    """POST `data` as the agent of `node_id` does: the agents' hub token (or `token`; None: no
    token at all) and the node's key."""
    url = report_url(hub, node)
    headers = agent.signed_headers(key, node_id, "POST", urlsplit(url).path, data, **signing)
    headers["Content-Type"] = "application/json"
    return post(agent_token(hub) if token == AGENTS else token, url, data=data, headers=headers)


def answer_is_signed(response: requests.Response, key: str, sent_nonce: str) -> bool:
    signature = response.headers.get(agent.SIGNATURE_HEADER)
    return agent.answer_is_genuine(key, sent_nonce, response.content, signature)


def reported_nodes(hub) -> dict:
    response = QueueUser(hub, "admin").call("GET", "nodes")
    assert response.status_code == 200, response.text
    return {node["node"]: node for node in response.json()["nodes"]}


def test_the_node_agent_reports_and_admins_read_it(hub):
    node, node_id, key = a_node(hub)
    report = a_report(node)
    response = signed_post(hub, node, json.dumps(report).encode(), key, node_id, nonce="n-1")
    assert response.status_code == 200, response.text
    assert response.json() == {"node": node, "orders": []}
    assert answer_is_signed(response, key, "n-1")
    stored = reported_nodes(hub)[node]
    assert stored["sessions"] == report["sessions"] and stored["stale"] is False
    assert stored["report_bytes"] == len(json.dumps(report))


@pytest.mark.parametrize("who", ["student", "narrow admin", "full admin", "spawner", "none"])
def test_only_the_node_agents_identity_may_report(hub, username, who):
    node = f"node-{secrets.token_hex(3)}"
    if who == "student":
        token = hub.user_token(QueueUser(hub, username).name)
    elif who == "narrow admin":
        token = narrow_admin_token(hub, ["access:services!service=queue"]).headers["Authorization"]
        token = token.split()[1]
    elif who == "full admin":
        token = hub.user_token("admin")
    elif who == "spawner":
        token = hub.spawner_token
    else:
        token = None
    _, node_id, key = a_node(hub)
    data = json.dumps(a_report(node)).encode()
    response = signed_post(hub, node, data, key, node_id, token=token)
    assert response.status_code == (401 if token is None else 403), response.text
    if token:
        assert "node agents" in response.json()["message"]
    assert node not in reported_nodes(hub)


def test_a_cross_site_request_with_an_admins_cookie_cannot_report(hub):
    node = f"node-{secrets.token_hex(3)}"
    browser = Browser(hub, "admin")
    for headers in (EVIL, {**EVIL, "Content-Type": "text/plain"}):
        response = browser.call(
            "POST", f"nodes/{node}/report", headers=headers, json=a_report(node)
        )
        assert response.status_code == 403, response.text
    assert node not in reported_nodes(hub)


def test_students_cannot_read_the_nodes_reports(hub, username):
    response = QueueUser(hub, username).call("GET", "nodes")
    assert response.status_code == 403, response.text


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[" * 5000 + "]" * 5000, "not valid JSON"),  # deeper than the parser recurses
        ("[]", "must be a JSON object"),
        (
            json.dumps({"version": agent.REPORT_VERSION, "node": "elsewhere"}),
            "an agent reports only for its own node",
        ),
        # An agent of the hub's previous version, until the service deploys its own.
        (
            json.dumps({**a_report("NODE"), "version": 1, "jobs": []}),
            "Unknown report version 1; expected 2",
        ),
        (json.dumps({**a_report("NODE"), "sessions": {"s": {"container": "c"}}}), "mem_bytes"),
    ],
)
def test_a_bad_report_is_a_400_with_its_fault_and_stores_nothing(hub, data, message):
    node, node_id, key = a_node(hub)
    data = data.replace('"NODE"', json.dumps(node))
    response = signed_post(hub, node, data.encode(), key, node_id)
    assert response.status_code == 400, response.text
    assert message in response.json()["message"]
    assert node not in reported_nodes(hub)


def test_only_admins_may_save_a_session_on_its_node(hub, username):
    node = f"node-{secrets.token_hex(3)}"
    body = {"session_id": "abc", "user": username, "tag": "t1"}
    student = QueueUser(hub, username).call("POST", f"nodes/{node}/commits", json=body)
    assert student.status_code == 403, student.text
    narrow = narrow_admin_token(hub, ["access:services!service=queue"])
    url = f"{hub.url}/services/queue/api/nodes/{node}/commits"
    assert narrow.post(url, json=body, timeout=60).status_code == 403
    agent_says = post(agent_token(hub), url, json=body)
    assert agent_says.status_code == 403, agent_says.text
    admin = QueueUser(hub, "admin")
    missing = admin.call("POST", f"nodes/{node}/commits", json={"session_id": "abc"})
    assert missing.status_code == 400 and "user is missing" in missing.json()["message"]
    # This hub runs on one host: no registry to push to, so nothing is sent to any agent.
    refused = admin.call("POST", f"nodes/{node}/commits", json=body)
    assert refused.status_code == 409 and "No registry" in refused.json()["message"]


def test_a_report_without_its_nodes_signature_is_refused_and_stores_nothing(hub):
    node, node_id, key = a_node(hub)
    other, other_id, other_key = a_node(hub)
    data = json.dumps(a_report(node)).encode()
    unsigned = post(
        agent_token(hub),
        report_url(hub, node),
        data=data,
        headers={"Content-Type": "application/json"},
    )
    assert unsigned.status_code == 403 and "not signed" in unsigned.json()["message"]
    # The agent token with another node's key: a node reports only for itself.
    borrowed = signed_post(hub, node, data, other_key, other_id)
    assert borrowed.status_code == 403
    assert f"key of node {other} cannot report for node {node}" in borrowed.json()["message"]
    # Another node's id with a key that is not its own.
    claimed = signed_post(hub, node, data, other_key, node_id)
    assert claimed.status_code == 403 and "signature does not match" in claimed.json()["message"]
    stale = signed_post(hub, node, data, key, node_id, now=time.time() - 600)
    assert stale.status_code == 403 and "stale or replayed" in stale.json()["message"]
    assert node not in reported_nodes(hub)


def test_a_replayed_report_is_refused(hub):
    node, node_id, key = a_node(hub)
    data = json.dumps(a_report(node)).encode()
    url = report_url(hub, node)
    headers = agent.signed_headers(key, node_id, "POST", urlsplit(url).path, data)
    headers["Content-Type"] = "application/json"
    first = post(agent_token(hub), url, data=data, headers=headers)
    assert first.status_code == 200, first.text
    again = post(agent_token(hub), url, data=data, headers=headers)
    assert again.status_code == 403 and "a replay" in again.json()["message"]


def test_a_report_sampled_long_before_it_was_signed_is_refused(hub):
    node, node_id, key = a_node(hub)
    report = {**a_report(node), "sampled_at": "2020-01-01T00:00:00+00:00"}
    response = signed_post(hub, node, json.dumps(report).encode(), key, node_id)
    assert response.status_code == 403 and "a stale report" in response.json()["message"]
    assert node not in reported_nodes(hub)


def test_only_full_admins_may_rotate_a_nodes_key(hub, username):
    node, _, _ = a_node(hub)
    path = f"nodes/{node}/key"
    student = QueueUser(hub, username).call("POST", path, json={})
    assert student.status_code == 403, student.text
    narrow = narrow_admin_token(hub, ["access:services!service=queue"])
    url = f"{hub.url}/services/queue/api/{path}"
    assert narrow.post(url, json={}, timeout=60).status_code == 403
    assert post(agent_token(hub), url, json={}).status_code == 403
    browser = Browser(hub, "admin")
    assert browser.call("POST", path, headers=EVIL, json={}).status_code == 403
    # This hub runs on one host: no agents to move, and it says so.
    refused = QueueUser(hub, "admin").call("POST", path, json={})
    assert refused.status_code == 409 and "single-host" in refused.json()["message"]
