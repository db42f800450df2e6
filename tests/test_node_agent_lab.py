"""The node agent on a real Swarm (scripts/swarm-lab, 3 workers) reporting to a real hub.

The hub runs on this machine with the shipped config; its queue service is pointed at the lab's
manager and given `node_agent_url`, so it deploys the agents itself (config, secrets, one service
per node, each with its node's own key) at start, exactly as in Swarm mode. The hub's proxy listens on every address, so the agents reach it
at the lab's gateway (the root namespace, FGPU_HUB_CONNECT_IP). A session-labelled service pinned to
one node then shows up, with its usage, in that node's report, read back through `GET api/nodes`.

The lab is the run's shared one (tests/swarm_lab.py).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import subprocess
import sys
import time
from urllib.parse import urlsplit

import docker
import pytest
import requests

from fgpu_admin import doctor
from fgpu_shared.registry_auth import read_registry_auth
from node_agent import agent
from queue_service.engine import node_agent_deploy
from queue_service.engine.node_agent_deploy import AgentSettings, deploy_node_agents
from queue_service.engine.node_credentials import CREDENTIALS_FILE, NodeCredentials

from .harness import QueueUser, running_hub
from .swarm_lab import IMAGE, LAB_NAME, LAB_NET, engine_client, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.hub]

GATEWAY = f"{LAB_NET}.0.1"
INTERVAL = 1
# Each node's own engine (there, /var/run/docker.sock is this machine's engine): Swarm fills the
# template per node.
LAB_SOCKET = f"/var/lib/fgpu-swarm-lab/{LAB_NAME}/nodes/{{{{.Node.Hostname}}}}/docker.sock"
SESSION_MEM = 48 << 20


@pytest.fixture(scope="module")
def lab(lab):
    """The run's shared lab (tests/swarm_lab.py), as the variables it exports."""
    return lab.env


def hub_config(lab: dict) -> str:
    """The queue service runs the Swarm engine on the lab's manager, which deploys the agents;
    the hub's spawner stays the single-host one (no session here goes through it)."""
    engine = {key: lab[key] for key in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")}
    image = f"{lab['FGPU_SWARM_REGISTRY']}/{IMAGE}"
    return f"""
import os
for service in c.JupyterHub.services:
    if service["name"] == "queue":
        service["environment"].update({engine!r})
c.QueueService.engine_class = "swarm"
c.SwarmEngine.node_agent_url = f"http://{GATEWAY}:{{os.environ['FGPU_HUB_PORT']}}/services/queue/"
c.SwarmEngine.node_agent_image = "{image}"
c.SwarmEngine.node_agent_interval = {INTERVAL}
c.SwarmEngine.node_agent_registry = "{lab["FGPU_SWARM_REGISTRY"]}"
c.QueueService.registry_auth_file = "{lab["FGPU_SWARM_REGISTRY_AUTH_FILE"]}"
c.SwarmEngine.registry_ca = "{lab["FGPU_SWARM_REGISTRY_CA"]}"
c.SwarmEngine.node_agent_docker_socket = "{LAB_SOCKET}"
"""


@pytest.fixture(scope="module")
def lab_hub(lab, tmp_path_factory):
    # Listening on every address: the nodes reach the proxy at the lab's gateway.
    env = {"FGPU_HUB_IP": "0.0.0.0", "FGPU_DEMO_LOGIN_ON_NETWORK": "1"}
    with running_hub(tmp_path_factory.mktemp("agent-hub"), hub_config(lab), env=env) as hub:
        yield hub


def reports(hub) -> dict:
    response = QueueUser(hub, "admin").call("GET", "nodes")
    assert response.status_code == 200, response.text
    return {node["node"]: node for node in response.json()["nodes"]}


def test_every_worker_reports_and_a_sessions_usage_comes_from_its_node(lab, lab_hub):
    manager = engine_client(lab)
    nodes = lab["FGPU_SWARM_NODES"].split(",")
    start = time.monotonic()
    fresh = wait_for(
        lambda: (
            (found := reports(lab_hub))
            and all(n in found and not found[n]["stale"] for n in nodes)
            and found
        ),
        timeout=240,
        what="a fresh report from every worker",
    )
    figures = {"deploy until every node reported (s)": round(time.monotonic() - start, 1)}
    assert set(fresh) == set(nodes), "the manager runs no agent"
    # The lab's engines run with "icc": false and "no-new-privileges": true (swarm-lab's
    # daemon.json), which each agent reads on its own node: the bridge, its own NoNewPrivs.
    for node in nodes:
        assert fresh[node]["daemon"] == {"icc": False, "no_new_privileges": True}, node
        assert fresh[node]["isolation_problems"] == [], node
    # `fgpu-hub doctor`, with an admin's token, reads the same reports.
    daemons = doctor.check_node_daemons(lab_hub.url, lab_hub.user_token("admin"), 30)
    assert daemons.status == doctor.OK, daemons
    # One agent per node, pinned to its node id, holding that node's key and no other's.
    keys = {c.node_id: c for c in NodeCredentials(lab_hub.workdir / CREDENTIALS_FILE).all()}
    assert sorted(c.hostname for c in keys.values()) == sorted(nodes)
    held = {}
    for service in agent_services(manager):
        spec = service.attrs["Spec"]
        assert spec["Mode"] == {"Replicated": {"Replicas": 1}}
        (constraint,) = spec["TaskTemplate"]["Placement"]["Constraints"]
        node_id = constraint.removeprefix("node.id==")
        held[node_id] = [s["SecretName"] for s in spec["TaskTemplate"]["ContainerSpec"]["Secrets"]]
    assert set(held) == set(keys)
    key_secrets = [names[1] for names in held.values()]
    assert len(set(key_secrets)) == len(nodes) and len({names[0] for names in held.values()}) == 1

    # A session's container on node 2, labelled as this hub's spawner labels them.
    session_id = secrets.token_hex(16)
    deployment = (lab_hub.workdir / "fgpu_deployment_id").read_text().strip()
    program = f"x = bytearray({SESSION_MEM})\nwhile True: sum(range(20000))"
    session = manager.services.create(
        f"{lab['FGPU_SWARM_REGISTRY']}/{IMAGE}",
        command=["python3", "-c", program],
        name=f"fgpu-agent-test-{session_id[:8]}",
        user="1000",
        constraints=[f"node.hostname=={nodes[1]}"],
        container_labels={"fgpu.session_id": session_id, "fgpu.deployment": deployment},
        resources=docker.types.Resources(cpu_limit=int(0.3e9), mem_limit=256 << 20),
        endpoint_spec=docker.types.EndpointSpec(mode="dnsrr"),
        restart_policy=docker.types.RestartPolicy(condition="none"),
    )
    try:

        def busy():
            found = reports(lab_hub)
            usage = found[nodes[1]]["sessions"].get(session_id)
            return (found, usage) if usage and usage["cpu_percent"] else None

        found, usage = wait_for(
            busy, timeout=180, what=f"the session's usage in {nodes[1]}'s report"
        )
        assert usage["mem_bytes"] >= SESSION_MEM and usage["mem_limit_bytes"] == 256 << 20
        assert 0 < usage["cpu_percent"] <= 35  # capped at 0.3 of a core by its node's cgroup
        for other in (nodes[0], nodes[2]):
            assert session_id not in found[other]["sessions"]
        for node in nodes:
            assert found[node]["gpus"] is None  # simulated GPUs: no NVML on the nodes
        figures["report bytes (1 session)"] = found[nodes[1]]["report_bytes"]
        figures["agent rss MiB"] = round(found[nodes[1]]["agent"]["rss_bytes"] / 2**20, 1)
        cpu_before, at = found[nodes[0]]["agent"]["cpu_seconds"], time.monotonic()
    finally:
        session.remove()
    # Gone from its node's report once the container is.
    wait_for(
        lambda: session_id not in reports(lab_hub)[nodes[1]]["sessions"],
        timeout=60,
        what="the removed session gone from the report",
    )
    # A figure, not an assertion: the agent's CPU over ten seconds of reports (the wait above
    # counts towards them).
    time.sleep(max(0.0, at + 10 - time.monotonic()))
    cpu_after = reports(lab_hub)[nodes[0]]["agent"]["cpu_seconds"]
    figures["agent CPU % at 1 report/s"] = round(
        (cpu_after - cpu_before) / (time.monotonic() - at) * 100, 2
    )
    print(f"\nnode agent figures: {figures}", file=sys.stderr)


def test_a_session_saved_on_node_2_by_its_agent_starts_on_node_3(lab, lab_hub):
    manager = engine_client(lab)
    nodes = lab["FGPU_SWARM_NODES"].split(",")
    registry = lab["FGPU_SWARM_REGISTRY"]
    session_id = secrets.token_hex(16)
    deployment = (lab_hub.workdir / "fgpu_deployment_id").read_text().strip()
    mark = secrets.token_hex(8)
    session = pinned_service(
        manager,
        f"{registry}/{IMAGE}",
        nodes[1],
        ["sh", "-c", f"echo {mark} > /tmp/mark && exec sleep 600"],
        labels={"fgpu.session_id": session_id, "fgpu.deployment": deployment},
    )
    try:
        wait_for(
            lambda: session_id in reports(lab_hub)[nodes[1]]["sessions"],
            timeout=120,
            what="the session in its node's report",
        )
        user = f"student-{secrets.token_hex(3)}"
        start = time.monotonic()
        saved = QueueUser(lab_hub, "admin").call(
            "POST",
            f"nodes/{nodes[1]}/commits",
            json={"session_id": session_id, "user": user, "tag": "t1"},
        )
        assert saved.status_code == 201, saved.text
        took = round(time.monotonic() - start, 1)
        result = saved.json()
        assert result["image"] == f"{registry}/fgpu-private/{user}:t1"
        assert result["node"] == nodes[1] and result["digest"].startswith("sha256:")
    finally:
        session.remove()
    # Node 3 never had it: it pulls it from the registry, and the session's file is there.
    restored = pinned_service(
        manager,
        result["image"],
        nodes[2],
        ["sh", "-c", f"grep -qx {mark} /tmp/mark && exec sleep 600"],
        labels={},
    )
    try:
        task = wait_for(
            lambda: next((t for t in restored.tasks() if t["Status"]["State"] == "running"), None),
            timeout=180,
            what="the saved image running on node 3",
        )
        node3 = next(
            n for n in manager.nodes.list() if n.attrs["Description"]["Hostname"] == nodes[2]
        )
        assert task["NodeID"] == node3.id
        time.sleep(2)  # grep ran first: had it failed, the task would have ended
        assert restored.tasks()[0]["Status"]["State"] == "running", restored.tasks()
        engine3 = engine_client({**lab, "DOCKER_HOST": f"tcp://{LAB_NET}.0.13:2376"})
        image = engine3.images.get(result["image"])
        assert image.labels["fgpu.private-owner"] == user
        assert image.labels["fgpu.session_id"] == ""  # the session's own labels are not carried
        print(f"\ncommit + push on node 2 through the agent: {took} s", file=sys.stderr)
    finally:
        restored.remove()


def pinned_service(manager, image: str, node: str, command: list[str], labels: dict):
    return manager.services.create(
        image,
        command=command,
        name=f"fgpu-agent-test-{secrets.token_hex(4)}",
        user="1000",
        constraints=[f"node.hostname=={node}"],
        container_labels=labels,
        endpoint_spec=docker.types.EndpointSpec(mode="dnsrr"),
        restart_policy=docker.types.RestartPolicy(condition="none"),
    )


def as_given(image: str) -> str:
    """The image the hub gave the agent's service: its pinned `name@digest` as it is, or the
    `name:tag` to which Swarm added the digest it resolved."""
    name = image.split("@")[0]
    return name if ":" in name.rsplit("/", 1)[-1] else image


def agent_services(manager) -> list:
    return [
        s
        for s in manager.services.list(filters={"label": "fgpu.role=node-agent"})
        if s.name.startswith("fgpu-node-agent-")
    ]


def test_deploying_again_changes_nothing_and_a_rotated_key_moves_one_node_to_it(
    lab, lab_hub, tmp_path, monkeypatch
):
    manager = engine_client(lab)
    nodes = lab["FGPU_SWARM_NODES"].split(",")
    wait_for(
        lambda: len(agent_services(manager)) == len(nodes),
        timeout=120,
        what="an agent service on every node",
    )
    before = {s.name: s.version for s in agent_services(manager)}
    (service, *_) = agent_services(manager)
    spec = service.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]
    env = dict(item.split("=", 1) for item in spec["Env"])
    settings = AgentSettings(
        token=(lab_hub.workdir / "fgpu_node_agent_token").read_text().strip(),
        report_url=env["FGPU_AGENT_URL"],
        image=as_given(spec["Image"]),
        interval=float(env["FGPU_AGENT_INTERVAL"]),
        deployment_id=env["FGPU_DEPLOYMENT"],
        docker_socket=LAB_SOCKET,
        # As the hub gives them: the registry's credentials, which the agents push with.
        registry_auth=json.dumps(
            read_registry_auth(lab["FGPU_SWARM_REGISTRY_AUTH_FILE"]), sort_keys=True
        ),
    )
    keys = NodeCredentials(lab_hub.workdir / CREDENTIALS_FILE)
    # A newer agent file on disk (an upgrade before the restart) is not deployed: the agents keep
    # the code this process imported, whose reports its service takes.
    newer = tmp_path / "agent.py"
    newer.write_text(node_agent_deploy.AGENT_SOURCE.read_text() + "\n# a newer version\n")
    monkeypatch.setattr(node_agent_deploy, "AGENT_SOURCE", newer)
    again = deploy_node_agents(manager, keys, settings)
    assert {s.name: s.version for s in again} == before

    # `fgpu-hub node-agent rotate NODE`, with an admin's token: only that node's agent moves.
    old = keys.by_hostname(nodes[0])
    since = time.monotonic()
    rotated = subprocess.run(
        [
            sys.executable,
            "-m",
            "fgpu_admin",
            "node-agent",
            "rotate",
            nodes[0],
            "--hub-url",
            lab_hub.url,
        ],
        env={**os.environ, "FGPU_ADMIN_TOKEN": lab_hub.user_token("admin")},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert rotated.returncode == 0, rotated.stderr
    assert f"node {nodes[0]} ({old.node_id}): new agent key made" in rotated.stdout
    new = keys.by_hostname(nodes[0])
    assert new.key != old.key
    after = {s.name: s.version for s in agent_services(manager)}
    moved = [name for name in after if after[name] != before[name]]
    assert moved == [f"fgpu-node-agent-{old.node_id[:12]}"]
    # The old key is refused from now on, for its own node too.
    url = f"{lab_hub.url}/services/queue/api/nodes/{nodes[0]}/report"
    data = json.dumps(agent.build_report(nodes[0], agent.now_iso(), {}, None)).encode()
    headers = agent.signed_headers(old.key, old.node_id, "POST", urlsplit(url).path, data)
    token = (lab_hub.workdir / "fgpu_node_agent_token").read_text().strip()
    headers.update({"Authorization": f"token {token}", "Content-Type": "application/json"})
    refused = requests.post(url, data=data, headers=headers, timeout=30)
    assert refused.status_code == 403 and "signature does not match" in refused.text
    # ... while the node's agent, restarted with the new key, reports again.
    wait_for(
        lambda: (
            reports(lab_hub).get(nodes[0], {"age_seconds": math.inf})["age_seconds"]
            < time.monotonic() - since
        ),
        timeout=180,
        what=f"{nodes[0]}'s agent reporting with its new key",
    )
    print(
        f"\nkey rotation until the node reported again: {round(time.monotonic() - since, 1)} s",
        file=sys.stderr,
    )
