"""The node agent on a real Swarm (scripts/swarm-lab, 3 workers) reporting to a real hub.

The hub runs on this machine with the shipped config; its queue service is pointed at the lab's
manager and given `node_agent_url`, so it deploys the agent itself (config, secret, global service)
at start, exactly as in Swarm mode. The hub's proxy listens on every address, so the agents reach it
at the lab's gateway (the root namespace, FGPU_HUB_CONNECT_IP). A session-labelled service pinned to
one node then shows up, with its usage, in that node's report, read back through `GET api/nodes`.

The lab is the run's shared one (tests/swarm_lab.py).
"""

from __future__ import annotations

import secrets
import sys
import time

import docker
import pytest

from fgpu_admin import doctor
from queue_service.node_agent_deploy import deploy_node_agent

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
    """The queue service talks to the lab's manager and deploys the agent; the hub stays as it is."""
    engine = {key: lab[key] for key in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")}
    image = f"{lab['FGPU_SWARM_REGISTRY']}/{IMAGE}"
    return f"""
import os
for service in c.JupyterHub.services:
    if service["name"] == "queue":
        service["environment"] = {engine!r}
        service["command"] += [
            f"--QueueService.node_agent_url=http://{GATEWAY}:{{os.environ['FGPU_HUB_PORT']}}/services/queue/",
            "--QueueService.node_agent_image={image}",
            "--QueueService.node_agent_interval={INTERVAL}",
            "--QueueService.node_agent_registry={lab["FGPU_SWARM_REGISTRY"]}",
            "--QueueService.registry_auth_file={lab["FGPU_SWARM_REGISTRY_AUTH_FILE"]}",
            "--QueueService.registry_ca={lab["FGPU_SWARM_REGISTRY_CA"]}",
            "--QueueService.node_agent_docker_socket={LAB_SOCKET}",
        ]
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
    (agent_service,) = manager.services.list(filters={"name": "fgpu-node-agent"})
    assert agent_service.attrs["Spec"]["Mode"] == {"Global": {}}

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


def test_deploying_again_changes_nothing_and_a_new_token_moves_the_agents_to_a_new_secret(
    lab, lab_hub
):
    manager = engine_client(lab)
    (service,) = manager.services.list(filters={"name": "fgpu-node-agent"})
    spec = service.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]
    env = dict(item.split("=", 1) for item in spec["Env"])
    same = {
        "report_url": env["FGPU_AGENT_URL"],
        "image": spec["Image"].split("@")[0],  # Swarm pins the digest it resolved
        "interval": float(env["FGPU_AGENT_INTERVAL"]),
        "deployment_id": env["FGPU_DEPLOYMENT"],
        "docker_socket": LAB_SOCKET,
    }
    token = (lab_hub.workdir / "fgpu_node_agent_token").read_text().strip()
    assert deploy_node_agent(manager, token=token, **same).version == service.version

    def token_secrets():
        return {
            s.name for s in manager.secrets.list() if s.name.startswith("fgpu-node-agent-token-")
        }

    (old,) = token_secrets()
    rolled = deploy_node_agent(manager, token=secrets.token_hex(32), **same)
    assert rolled.version > service.version
    (new,) = token_secrets()  # the old secret is gone with the spec that held it
    assert new != old
    assert rolled.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Secrets"][0]["SecretName"] == new
    # Back to the hub's token: every agent reports again.
    deploy_node_agent(manager, token=token, **same)
    assert token_secrets() == {old}
    since = time.monotonic()
    nodes = lab["FGPU_SWARM_NODES"].split(",")
    wait_for(
        lambda: all(reports(lab_hub)[n]["age_seconds"] < time.monotonic() - since for n in nodes),
        timeout=180,
        what="every agent reporting again with the hub's token",
    )
