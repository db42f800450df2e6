"""`scripts/swarm-lab` (docs/source/explanation/contracts.md, contract 6) against a real lab of 3 worker nodes.

The lab is the run's shared one (tests/swarm_lab.py). The tests run in file order: the last one
takes the lab down and checks that nothing of it is left.
"""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

import docker
import pytest
import requests

from .harness import docker_client
from .swarm_lab import (
    CGROUPS,
    GPUS,
    IMAGE,
    LAB_DIR,
    LAB_NAME,
    LAB_NET,
    NODES,
    alive,
    engine_pids,
    lab_pids,
    node_states,
    swarm_lab,
    timed,
    wait_for,
)


def test_up_prints_only_export_lines_and_a_rerun_reuses_the_nodes(lab):
    assert lab.env["FGPU_ENGINE"] == "swarm"
    assert lab.env["DOCKER_HOST"] == f"tcp://{LAB_NET}.0.10:2376"
    assert lab.env["DOCKER_TLS_VERIFY"] == "1"
    assert Path(lab.env["DOCKER_CERT_PATH"], "key.pem").is_file()
    assert lab.env["FGPU_SWARM_REGISTRY"] == f"{LAB_NET}.0.1:5000"
    assert lab.env["FGPU_HUB_CONNECT_IP"] == f"{LAB_NET}.0.1"
    assert lab.env["FGPU_SIMULATED_GPUS"] == GPUS
    assert lab.nodes == [f"{LAB_NAME}-{i}" for i in range(1, NODES + 1)]

    before = {n.id for n in lab.manager().nodes.list()}
    pids = engine_pids()
    assert len(pids) == NODES + 1
    again = timed(lab, "up (warm)", "up", "--nodes", str(NODES), "--gpus", GPUS)
    assert again.stdout == lab.stdout
    assert {n.id for n in lab.manager().nodes.list()} == before
    assert engine_pids() == pids, "a re-run restarted engines"


def test_status_lists_every_node_ready_with_its_engine_and_labels(lab):
    lines = swarm_lab("status").stdout.splitlines()
    assert len(lines) == NODES
    for i, (line, name) in enumerate(zip(lines, lab.nodes, strict=True), start=1):
        url = f"tcp://{LAB_NET}.0.{10 + i}:2376"
        assert line.split() == [name, url, "Ready"]
        # Each node's own engine answers on its URL, over TLS, under its own hostname.
        assert lab.engine(url).info()["Name"] == name
    labels = {
        n.attrs["Description"]["Hostname"]: n.attrs["Spec"]["Labels"]
        for n in lab.manager().nodes.list()
    }
    for name in lab.nodes:
        assert labels[name] == {"fgpu.simulated_gpus": GPUS, "fgpu.resource_group": "default"}


UNREACHABLE = (docker.errors.DockerException, requests.exceptions.ConnectionError)


def test_engines_refuse_clients_without_the_lab_certificate(lab):
    """A session can reach the engines' addresses; without the client certificate it gets nowhere."""
    ca = str(Path(lab.env["DOCKER_CERT_PATH"], "ca.pem"))
    tls = docker.tls.TLSConfig(ca_cert=ca, verify=True)
    with pytest.raises(UNREACHABLE):
        docker.DockerClient(
            base_url=lab.env["DOCKER_HOST"], tls=tls, version="1.41", timeout=10
        ).version()
    assert lab.manager().version()["ApiVersion"]


def test_a_service_pinned_to_node_2_pulls_from_the_registry_and_runs_there(lab):
    manager = lab.manager()
    node2 = lab.nodes[1]
    node2_id = next(
        n.id for n in manager.nodes.list() if n.attrs["Description"]["Hostname"] == node2
    )
    image = f"{lab.env['FGPU_SWARM_REGISTRY']}/{IMAGE}"
    service = manager.services.create(
        image,
        command=["python3", "-m", "http.server", "8888"],
        name="fgpu-lab-test-pinned",
        user="1000",
        constraints=[f"node.hostname=={node2}"],
        endpoint_spec=docker.types.EndpointSpec(mode="dnsrr"),
        restart_policy=docker.types.RestartPolicy(condition="none"),
    )
    try:
        start = time.monotonic()
        task = wait_for(
            lambda: next((t for t in service.tasks() if t["Status"]["State"] == "running"), None),
            timeout=180,
            what="the pinned service's task running",
        )
        lab.timings["service on node 2 (pull + start)"] = round(time.monotonic() - start, 2)
        assert task["NodeID"] == node2_id

        engine2 = lab.engine(f"tcp://{LAB_NET}.0.12:2376")
        container = engine2.containers.get(task["Status"]["ContainerStatus"]["ContainerID"])
        assert any(
            d.startswith(f"{lab.env['FGPU_SWARM_REGISTRY']}/fgpu/jupyter-base@")
            for d in container.image.attrs["RepoDigests"]
        )
        # Under the node's cgroup, so the lab can account for (and end) exactly its own processes.
        assert (CGROUPS / LAB_NAME / node2 / container.id).is_dir()
        # The node's engine sets what a service cannot ask for: no new privileges.
        status = container.exec_run(["grep", "NoNewPrivs", "/proc/self/status"]).output.decode()
        assert status.split() == ["NoNewPrivs:", "1"], status
        # The hub (in the root namespace) reaches the session's address on its node directly.
        address = container.attrs["NetworkSettings"]["Networks"]["bridge"]["IPAddress"]
        reply = wait_for(
            lambda: _get(f"http://{address}:8888/"),
            timeout=30,
            what=f"the session at {address}:8888 answering",
        )
        assert reply == 200
        # Not on the machine's engine (ids only: other tests remove their containers meanwhile).
        on_machine = {c["Id"] for c in docker_client().api.containers(all=True)}
        assert task["Status"]["ContainerStatus"]["ContainerID"] not in on_machine
    finally:
        service.remove()


def _get(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status
    except OSError:
        return None


def test_stop_node_is_down_for_the_manager_and_start_node_brings_it_back(lab):
    node3 = lab.nodes[2]
    start = time.monotonic()
    timed(lab, "stop-node", "stop-node", node3)
    wait_for(
        lambda: node_states(lab)[node3] == "down",
        timeout=60,
        what=f"{node3} Down in the manager's view",
    )
    lab.timings["stop-node until Down"] = round(time.monotonic() - start, 2)
    assert f"{node3} tcp://{LAB_NET}.0.13:2376 Down" in swarm_lab("status").stdout.splitlines()
    with pytest.raises(UNREACHABLE):
        lab.engine(f"tcp://{LAB_NET}.0.13:2376").version()

    timed(lab, "start-node", "start-node", node3)
    assert node_states(lab)[node3] == "ready"
    assert swarm_lab("status").stdout.split().count("Ready") == NODES


def test_bad_input_is_refused_with_a_message_and_changes_nothing(lab):
    pids = engine_pids()
    for args, message in [
        (("up", "--nodes", "0"), "--nodes takes a number of worker nodes"),
        (("up", "--nodes", "2"), "run 'scripts/swarm-lab down' before making a smaller one"),
        (("up", "--nodes", "3", "--gpus", "lots"), "--gpus takes simulated GPUs per node"),
        (("stop-node", "no-such-node"), "is not a worker of the lab"),
    ]:
        refused = swarm_lab(*args, check=False)
        assert refused.returncode != 0
        assert refused.stdout == ""
        assert message in refused.stderr
    assert engine_pids() == pids
    assert swarm_lab("status").stdout.split().count("Ready") == NODES


def test_down_leaves_no_process_namespace_mount_or_interface_behind(lab):
    pids = lab_pids()
    assert pids
    timed(lab, "down", "down")
    assert not [p for p in pids if alive(p)], "processes of the lab survive"
    assert not list(Path("/sys/fs/cgroup").glob(f"*/{LAB_NAME}")) + list(
        Path("/sys/fs/cgroup").glob(LAB_NAME)
    )
    netns = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=True
    ).stdout
    assert not [line for line in netns.splitlines() if line.startswith(f"{LAB_NAME}-")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert f" {LAB_NAME}@" not in links and f" {LAB_NAME}:" not in links
    assert str(LAB_DIR) not in Path("/proc/self/mountinfo").read_text()
    assert not LAB_DIR.exists()
    assert swarm_lab("status").stdout == ""
    docker_client().ping()  # the machine's own engine is untouched
