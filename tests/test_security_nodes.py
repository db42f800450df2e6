"""`POST api/nodes/{hostname}/report` (handlers/nodes.py) against the real hub and service: only the
node agents' hub identity may report; students, admins' narrow tokens, the spawner and cross-site
cookies are refused, and a bad report is a 400 that stores nothing."""

from __future__ import annotations

import json
import secrets

import pytest
import requests

from node_agent import agent

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


def reported_nodes(hub) -> dict:
    response = QueueUser(hub, "admin").call("GET", "nodes")
    assert response.status_code == 200, response.text
    return {node["node"]: node for node in response.json()["nodes"]}


def test_the_node_agent_reports_and_admins_read_it(hub):
    node = f"node-{secrets.token_hex(3)}"
    report = a_report(node)
    response = post(agent_token(hub), report_url(hub, node), json=report)
    assert response.status_code == 200, response.text
    assert response.json() == {"node": node, "jobs": []}
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
    response = post(token, report_url(hub, node), json=a_report(node))
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
        ("[]", "must be a JSON object"),
        (json.dumps({"version": 1, "node": "elsewhere"}), "an agent reports only for its own node"),
        (json.dumps({**a_report("NODE"), "sessions": {"s": {"container": "c"}}}), "mem_bytes"),
    ],
)
def test_a_bad_report_is_a_400_with_its_fault_and_stores_nothing(hub, data, message):
    node = f"node-{secrets.token_hex(3)}"
    data = data.replace('"NODE"', json.dumps(node))
    response = post(
        agent_token(hub),
        report_url(hub, node),
        data=data,
        headers={"Content-Type": "application/json"},
    )
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
