"""The hub in Swarm mode (`FGPU_ENGINE=swarm`) on the run's Swarm lab of 3 one-GPU nodes.

One real hub, started with the shipped config and the environment `scripts/swarm-lab up` prints,
serves the module: sessions are Swarm services pinned to the node of their grant, and the queue
service reads the nodes from the manager. What is checked on the nodes themselves (cgroups, files)
is read through each node's own engine, as an admin of the node would. Every user's quota is 1
fGPU, so that a user's second GPU session waits for the first one's slice.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from urllib.parse import urlparse

import docker
import pytest
import requests
from dockerspawner import DockerSpawner
from jupyterhub.spawner import SpawnException
from playwright.sync_api import expect

from fgpu_spawner.container_spec import ContainerContext
from fgpu_spawner.grant import Grant
from fgpu_spawner.request import ResourceRequest
from fgpu_spawner.swarm_spawner import LIVE_STATES, FGPUSwarmSpawner
from queue_service.engine import job_services
from queue_service.engine.swarm_engine import SwarmEngine

from .browser import log_in, screenshot
from .harness import TEST_LABEL, QueueUser, engine_backend, running_hub, wait_until
from .job_helpers import job_ended, job_record, training_notebook
from .swarm_lab import IMAGE, LAB_ENV, LAB_NAME, Lab, hub_container, swarm_lab, wait_for
from .test_security_registry import probe_registry, unreachable

GPU_SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "512M", "fgpu": 1}
NODE_DOWN_GRACE = 6
EXTRA_CONFIG = f"""
c.SwarmEngine.node_down_grace = {NODE_DOWN_GRACE}
c.QueueService.reconcile_interval = 1
# The registry is asked which images sessions can run every second.
c.QueueService.engine_images_interval = 1
# The nodes pull ahead the base image (which they hold for their agents) and the test's own.
c.SwarmEngine.prepull_names = ["python-3.11", "prepull-*"]
"""


@pytest.fixture(scope="module")
def swarm_hub(lab: Lab, tmp_path_factory):
    env = {**lab.env, "FGPU_USER_QUOTA": '{"fgpu": 1}'}
    with running_hub(tmp_path_factory.mktemp("swarm-hub"), EXTRA_CONFIG, env=env) as hub:
        hub.lab = lab
        yield hub
    # The sessions the hub left, and the node agents its service deployed: once it is gone, so
    # that its next deploy round cannot bring them back.
    manager = lab.manager()
    for service in manager.services.list(filters={"label": f"{TEST_LABEL}={hub.run_id}"}):
        service.remove()
    for service in manager.services.list(filters={"name": "fgpu-node-agent"}):
        service.remove()


@pytest.fixture(scope="module")
def admin(swarm_hub) -> QueueUser:
    return QueueUser(swarm_hub, "admin")


@pytest.fixture
def started(swarm_hub):
    """(user, server) pairs a test starts; stopped afterwards, whatever happened."""
    servers: list[tuple[str, str]] = []
    yield servers
    swarm_hub.stop_servers(set(servers) & swarm_hub.active_servers())


def node_urls() -> dict[str, str]:
    """Each worker's engine URL, from `swarm-lab status`."""
    lines = swarm_lab("status").stdout.splitlines()
    return {line.split()[0]: line.split()[1] for line in lines}


def session_of(admin: QueueUser, user: str, server: str) -> dict:
    return next(s for s in admin.sessions() if s["user"] == user and s["server_name"] == server)


def start(hub, started, user: str, server: str, options=GPU_SESSION):
    response = hub.start_server(user, options, server)
    assert response.status_code in (201, 202), response.text
    started.append((user, server))


def session_container(lab: Lab, node: str, session_id: str):
    engine = lab.engine(node_urls()[node])
    found = engine.containers.list(filters={"label": f"fgpu.session_id={session_id}"})
    assert len(found) == 1, f"{node} runs {len(found)} containers of session {session_id}"
    return found[0]


def cgroup_value(node: str, controller: str, container_id: str, name: str) -> str:
    """A limit as the node's kernel holds it: the lab puts each node's containers under
    /<lab>/<node> with cgroup-parent (cgroup v1 here)."""
    return (
        Path("/sys/fs/cgroup", controller, LAB_NAME, node, container_id, name).read_text().strip()
    )


def record(hub, session_id: str) -> dict:
    """A record, ended or not, as the spawner reads it (the grants API, with the spawner's token)."""
    reply = requests.get(
        f"{hub.url}/services/queue/api/grants/{session_id}",
        headers={"Authorization": f"token {hub.spawner_token}"},
        timeout=30,
    )
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_session_lands_on_its_granted_node_with_its_limits_in_that_nodes_cgroup(
    swarm_hub, admin, started
):
    start(swarm_hub, started, "ada", "s1")
    model = swarm_hub.wait_ready("ada", "s1", timeout=180)
    record = session_of(admin, "ada", "s1")
    node = record["grant"]["node"]
    assert node in swarm_hub.lab.nodes

    # The manager placed the task where the queue granted it.
    manager = swarm_hub.lab.manager()
    (service,) = manager.services.list(filters={"label": f"fgpu.session_id={record['id']}"})
    (task,) = service.tasks()
    assert manager.nodes.get(task["NodeID"]).attrs["Description"]["Hostname"] == node
    assert service.attrs["Spec"]["TaskTemplate"]["Placement"]["Constraints"] == [
        f"node.hostname=={node}"
    ]

    # The slice is the node kernel's limit on the session's container.
    container = session_container(swarm_hub.lab, node, record["id"])
    assert container.attrs["Config"]["Labels"]["fgpu.user"] == "ada"
    assert container.attrs["Config"]["User"] == "1000:100"
    assert cgroup_value(node, "memory", container.id, "memory.limit_in_bytes") == (str(512 * 2**20))
    quota = int(cgroup_value(node, "cpu", container.id, "cpu.cfs_quota_us"))
    period = int(cgroup_value(node, "cpu", container.id, "cpu.cfs_period_us"))
    assert quota / period == 0.5
    assert cgroup_value(node, "pids", container.id, "pids.max") == "1024"
    status = container.exec_run(["grep", "-E", "^(CapEff|NoNewPrivs)", "/proc/self/status"])
    assert status.output.decode().split() == ["CapEff:", "0000000000000000", "NoNewPrivs:", "1"]
    # Its image is the one the registry's digest names (pulled with the hub's credentials, which
    # the service carried to the node); the registry itself is out of the session's reach:
    # neither the catalog nor a push of a manifest gets through (test_security_registry.py).
    pinned = admin.call("GET", "images/python-3.11").json()["digest"]
    spec_image = service.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"]
    assert (
        spec_image == f"{swarm_hub.lab.env['FGPU_SWARM_REGISTRY']}/{IMAGE.split(':')[0]}@{pinned}"
    )
    found = probe_registry(container)
    assert unreachable(found), found

    # The proxy reaches the server on its node.
    token = swarm_hub.user_token("ada")
    reply = requests.get(
        f"{swarm_hub.url}{model['url']}api/status",
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    assert reply.status_code == 200, reply.text
    # Told its planned end through the proxy as on one host, with its own key and no token of
    # the service's (session_end_notice.py): the key is in the session's environment.
    env = dict(line.split("=", 1) for line in container.attrs["Config"]["Env"])
    assert len(env["FGPU_END_NOTICE_KEY"]) == 64
    end_url = f"{swarm_hub.url}{model['url']}fgpu/session-end"
    owner = {"Authorization": f"token {token}"}
    told = wait_until(
        lambda: requests.get(end_url, headers=owner, timeout=10).json()["ends"],
        90,
        "the Swarm session told its planned end",
        interval=2,
    )
    assert told["why"] == "idle", told


def test_on_host_port_a_session_reaches_anothers_server_which_is_why_it_needs_the_sites_word(
    swarm_hub, admin, started
):
    """Why `host_port` starts only with FGPU_SWARM_REACHABLE_SESSIONS=1 (this hub, the lab's, has
    it): the server's port is published on every address of its node, and a session on another
    node, whose engine has `"icc": false`, still reaches it there, as the proxy does."""
    for user in ("una", "vic"):
        start(swarm_hub, started, user, "h")
    models = {user: swarm_hub.wait_ready(user, "h", timeout=180) for user in ("una", "vic")}
    records = {user: session_of(admin, user, "h") for user in models}
    nodes = {user: record["grant"]["node"] for user, record in records.items()}
    assert nodes["una"] != nodes["vic"]  # one GPU per node, 1 fGPU each
    vic = session_container(swarm_hub.lab, nodes["vic"], records["vic"]["id"])
    una_target = proxy_target(swarm_hub, models["una"]["url"])
    reached = fetch_from(vic, f"{una_target}{models['una']['url']}api")
    assert reached == {"status": 200}, reached


def test_three_one_gpu_sessions_run_on_three_nodes_and_a_fourth_waits(swarm_hub, admin, started):
    users = ["bea", "cal", "dee"]
    for user in users:
        start(swarm_hub, started, user, "g")
    for user in users:
        swarm_hub.wait_ready(user, "g", timeout=180)
    nodes = {session_of(admin, user, "g")["grant"]["node"] for user in users}
    assert nodes == set(swarm_hub.lab.nodes)

    start(swarm_hub, started, "eve", "g")
    waiting = wait_for(
        lambda: (
            session_of(admin, "eve", "g")["status"] == "PENDING" and session_of(admin, "eve", "g")
        ),
        timeout=30,
        what="eve's request waiting",
    )
    assert waiting["position"] == 1
    assert waiting["grant"] is None
    # Waiting is still waiting a few reconciler rounds later: nothing is granted twice.
    time.sleep(3)
    assert session_of(admin, "eve", "g")["status"] == "PENDING"

    freed_node = session_of(admin, "bea", "g")["grant"]["node"]
    swarm_hub.stop_server("bea", "g")
    swarm_hub.wait_ready("eve", "g", timeout=180)
    assert session_of(admin, "eve", "g")["grant"]["node"] == freed_node


def test_a_node_that_goes_down_frees_its_slice_and_the_waiting_request_starts_elsewhere_then_rejoins(
    swarm_hub, admin, started
):
    start(swarm_hub, started, "fay", "one")
    swarm_hub.wait_ready("fay", "one", timeout=180)
    lost_node = session_of(admin, "fay", "one")["grant"]["node"]
    # fay's quota is 1 fGPU: her second session waits for the first one's slice.
    start(swarm_hub, started, "fay", "two")
    wait_for(
        lambda: session_of(admin, "fay", "two")["status"] == "PENDING",
        timeout=30,
        what="fay's second request waiting on her quota",
    )
    first_id = session_of(admin, "fay", "one")["id"]
    stopped_at = time.monotonic()
    swarm_lab("stop-node", lost_node)
    try:
        lost = wait_for(
            lambda: (found := record(swarm_hub, first_id))["status"] != "RUNNING" and found,
            timeout=60,
            what="fay's first session ended as lost",
        )
        assert time.monotonic() - stopped_at >= NODE_DOWN_GRACE - 1
        assert lost["status"] == "TERMINATED"
        assert f"its node {lost_node} went down" in lost["reason"], lost
        swarm_hub.wait_ready("fay", "two", timeout=180)
        assert session_of(admin, "fay", "two")["grant"]["node"] != lost_node
        # The last GPU left goes to gil; hal waits while the lost node is away...
        start(swarm_hub, started, "gil", "g")
        swarm_hub.wait_ready("gil", "g", timeout=180)
        start(swarm_hub, started, "hal", "g")
        wait_for(
            lambda: session_of(admin, "hal", "g")["status"] == "PENDING",
            timeout=30,
            what="hal waiting for a GPU",
        )
    finally:
        swarm_lab("start-node", lost_node)
    # ...and starts on it once it is back: a node that joins adds its capacity.
    swarm_hub.wait_ready("hal", "g", timeout=180)
    assert session_of(admin, "hal", "g")["grant"]["node"] == lost_node


def test_a_paused_node_keeps_its_sessions_and_takes_no_new_one_and_homes_follow_the_user(
    swarm_hub, admin, started
):
    """...and so do storage folders: a folder written on one node is read on another (they
    live on the shared storage, as homes do)."""
    lab = swarm_hub.lab
    folder = QueueUser(swarm_hub, "gus").call("POST", "folders", json={"name": "data"})
    assert folder.status_code == 201, folder.text
    with_folder = {**GPU_SESSION, "folders": ["data"]}
    start(swarm_hub, started, "gus", "a", with_folder)
    swarm_hub.wait_ready("gus", "a", timeout=180)
    record = session_of(admin, "gus", "a")
    first_node = record["grant"]["node"]
    container = session_container(lab, first_node, record["id"])
    wrote = container.exec_run(["sh", "-c", "echo from-$(hostname) > ~/note.txt && cat ~/note.txt"])
    assert wrote.exit_code == 0, wrote.output
    in_folder = container.exec_run(["sh", "-c", "hostname > ~/folders/data/written-on"])
    assert in_folder.exit_code == 0, in_folder.output

    # Paused: Swarm's availability for "no new tasks, the running ones go on".
    lab.manager().nodes.get(first_node).update({**_spec(lab, first_node), "Availability": "pause"})
    try:
        time.sleep(3)  # a few reconciler rounds
        assert session_of(admin, "gus", "a")["status"] == "RUNNING"
        swarm_hub.stop_server("gus", "a")
        start(swarm_hub, started, "gus", "b", with_folder)
        swarm_hub.wait_ready("gus", "b", timeout=180)
        second = session_of(admin, "gus", "b")
        assert second["grant"]["node"] != first_node
        container = session_container(lab, second["grant"]["node"], second["id"])
        note = container.exec_run(["cat", "/home/jovyan/note.txt"])
        assert note.output.decode().strip() == wrote.output.decode().strip()
        written_on = container.exec_run(["cat", "/home/jovyan/folders/data/written-on"])
        assert written_on.exit_code == 0, written_on.output
        first_host = wrote.output.decode().strip().removeprefix("from-")
        assert written_on.output.decode().strip() == first_host
    finally:
        lab.manager().nodes.get(first_node).update(
            {**_spec(lab, first_node), "Availability": "active"}
        )


def _spec(lab: Lab, hostname: str) -> dict:
    return lab.manager().nodes.get(hostname).attrs["Spec"]


def test_resource_groups_are_node_labels_and_the_cluster_page_shows_nodes_and_groups(
    swarm_hub, admin, started, pages
):
    lab = swarm_hub.lab
    relabelled = lab.nodes[2]
    node = lab.manager().nodes.get(relabelled)
    spec = node.attrs["Spec"]
    node.update({**spec, "Labels": {**spec["Labels"], "fgpu.resource_group": "gpu-b"}})
    try:
        resources = wait_for(
            lambda: (
                (r := admin.call("GET", "resources").json())["resource_groups"].get("gpu-b") and r
            ),
            timeout=30,
            what="the relabelled node's group in the inventory",
        )
        assert {n["name"]: n["resource_group"] for n in resources["nodes"]} == {
            **{name: "default" for name in lab.nodes[:2]},
            relabelled: "gpu-b",
        }
        start(swarm_hub, started, "ida", "b", {**GPU_SESSION, "resource_group": "gpu-b"})
        swarm_hub.wait_ready("ida", "b", timeout=180)
        assert session_of(admin, "ida", "b")["grant"]["node"] == relabelled

        page = pages()
        log_in(page, swarm_hub, "admin")
        page.goto(f"{swarm_hub.url}/services/queue/cluster")
        nodes = page.locator("#fgpu-nodes .fgpu-node")
        expect(nodes).to_have_count(len(lab.nodes))
        expect(page.locator(f'.fgpu-node[data-node="{relabelled}"]')).to_contain_text(
            "(resource group gpu-b)"
        )
        expect(page.locator("#fgpu-running")).to_contain_text(relabelled)
        screenshot(page, "swarm-cluster-nodes-and-groups")
    finally:
        node = lab.manager().nodes.get(relabelled)
        spec = node.attrs["Spec"]
        node.update({**spec, "Labels": {**spec["Labels"], "fgpu.resource_group": "default"}})


def test_the_node_agent_reports_usage_and_a_session_saved_on_its_node_starts_on_another(
    swarm_hub, admin, started
):
    lab = swarm_hub.lab
    start(swarm_hub, started, "jo", "s1")
    swarm_hub.wait_ready("jo", "s1", timeout=180)
    record = session_of(admin, "jo", "s1")
    first_node = record["grant"]["node"]
    container = session_container(lab, first_node, record["id"])
    wrote = container.exec_run(["sh", "-c", "echo saved-on-$(hostname) > /tmp/marker"])
    assert wrote.exit_code == 0, wrote.output

    # The manager cannot read a container on another node: its node's agent reports the usage.
    usage = wait_for(
        lambda: session_of(admin, "jo", "s1")["usage"],
        timeout=90,
        what="jo's usage, reported by the agent of its node",
    )
    assert usage["mem_bytes"] > 0 and usage["mem_limit_bytes"] == 512 * 2**20
    # The agents (root, with their node's engine) run from the digest the hub pinned for their
    # image, so a tag moved in the registry behind the hub's back does not change them.
    agents = lab.manager().services.list(filters={"label": "fgpu.role=node-agent"})
    assert agents
    for agent_service in agents:
        image = agent_service.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"]
        assert "/fgpu/jupyter-base@sha256:" in image, image

    saved = admin.call("POST", f"sessions/{record['id']}/image", json={"tag": "v1"})
    assert saved.status_code == 201, saved.text
    assert saved.json()["node"] == first_node
    assert saved.json()["catalog"]["owner"] == "jo"
    name = saved.json()["catalog"]["name"]

    node = lab.manager().nodes.get(first_node)
    node.update({**node.attrs["Spec"], "Availability": "pause"})
    try:
        swarm_hub.stop_server("jo", "s1")
        start(swarm_hub, started, "jo", "s2", {**GPU_SESSION, "image": name})
        swarm_hub.wait_ready("jo", "s2", timeout=240)
        second = session_of(admin, "jo", "s2")
        assert second["grant"]["node"] != first_node
        moved = session_container(lab, second["grant"]["node"], second["id"])
        marker = moved.exec_run(["cat", "/tmp/marker"]).output.decode().strip()
        assert marker == f"saved-on-{container.attrs['Config']['Hostname']}"
    finally:
        node = lab.manager().nodes.get(first_node)
        node.update({**node.attrs["Spec"], "Availability": "active"})


def test_an_image_is_offered_once_the_registry_the_nodes_pull_from_holds_it(
    swarm_hub, admin, started
):
    """An admin adds an image that the manager holds (and checks) but the registry does not: no
    node could pull it, so students are not offered it; once it is pushed, they are. Its tag then
    moved behind the hub's back (a student's push of a backdoored image), the next
    session still runs the image whose digest was recorded."""
    manager, registry = swarm_hub.lab.manager(), swarm_hub.lab.env["FGPU_SWARM_REGISTRY"]
    name, reference = f"unpushed-{secrets.token_hex(3)}", f"fgpu/unpushed:{secrets.token_hex(3)}"
    # The same layers as a pushed image that every node already holds: a quick push below, and
    # a quick start of the session from it.
    source = manager.images.pull(f"{registry}/{IMAGE.split(':')[0]}", tag=IMAGE.split(":")[1])
    source.tag(reference)
    pushed = f"{registry}/{reference}"
    try:
        added = admin.call("POST", "images", json={"name": name, "image": reference})
        assert added.status_code == 201, added.text
        student = QueueUser(swarm_hub, f"stu-{secrets.token_hex(3)}")
        offered = lambda: {i["name"] for i in student.call("GET", "images").json()["images"]}  # noqa: E731
        time.sleep(3)  # three looks at the registry
        assert name not in offered() and "python-3.11" in offered()

        manager.images.get(reference).tag(pushed)
        for line in manager.api.push(pushed, stream=True, decode=True):
            assert "error" not in line, line
        wait_for(lambda: name in offered(), timeout=30, what=f"{name} offered once pushed")

        # Pinned: the tag moved behind the hub's back (another image pushed under it) changes
        # nothing; every session of this module starts from `<registry>/<name>@<digest>`.
        pinned = admin.call("GET", f"images/{name}").json()["digest"]
        digests = manager.images.get(pushed).attrs["RepoDigests"]
        assert f"{pushed.rsplit(':', 1)[0]}@{pinned}" in digests, (pinned, digests)
        other = manager.images.pull(f"{registry}/fgpu/scikit-learn", tag="1.5.2")
        other.tag(pushed)
        for line in manager.api.push(pushed, stream=True, decode=True):
            assert "error" not in line, line
        time.sleep(3)  # three looks at the registry
        assert admin.call("GET", f"images/{name}").json()["digest"] == pinned
        assert "points at another image than the one pinned" in swarm_hub.log_text()
        assert other.id != source.id

        # The next session: started from the digest, it runs the image first pushed.
        start(swarm_hub, started, student.name, "moved", {"image": name, "cpu": 0.5, "mem": "512M"})
        swarm_hub.wait_ready(student.name, "moved", timeout=180)
        record = session_of(admin, student.name, "moved")
        (service,) = manager.services.list(filters={"label": f"fgpu.session_id={record['id']}"})
        spec_image = service.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"]
        assert spec_image == f"{registry}/fgpu/unpushed@{pinned}"
        container = session_container(swarm_hub.lab, record["grant"]["node"], record["id"])
        assert container.image.id == source.id
    finally:
        admin.call("DELETE", f"images/{name}")
        for tag in (reference, pushed):
            with contextlib.suppress(docker.errors.ImageNotFound):
                manager.images.remove(tag)


def test_an_image_added_to_the_catalog_is_pulled_on_every_node_ahead_and_shown_per_node(
    swarm_hub, admin, pages
):
    """An image pushed to the registry and added to the catalog: before any session asks for it,
    each node's agent is ordered to pull it, each node's engine then holds its digest, and the
    API says so per image (Images page) and per node (Cluster page)."""
    lab = swarm_hub.lab
    manager, registry = lab.manager(), lab.env["FGPU_SWARM_REGISTRY"]
    tag = secrets.token_hex(3)
    name, reference = f"prepull-{tag}", f"fgpu/prepull:{tag}"
    # The layers of an image every node holds: the pull is the manifest's, a second or so.
    source = manager.images.pull(f"{registry}/{IMAGE.split(':')[0]}", tag=IMAGE.split(":")[1])
    source.tag(reference)
    source.tag(f"{registry}/{reference}")
    for line in manager.api.push(f"{registry}/{reference}", stream=True, decode=True):
        assert "error" not in line, line
    nodes, digest, started = sorted(node_urls()), None, time.time()
    try:
        added = admin.call("POST", "images", json={"name": name, "image": reference})
        assert added.status_code == 201, added.text

        def on_every_node():
            images = admin.call("GET", "images?all=1").json()["images"]
            found = next(i for i in images if i["name"] == name)["nodes"]
            return found if found and found["present"] == found["of"] == len(nodes) else None

        shown = wait_for(on_every_node, timeout=90, what=f"{name} on every node")
        # An image left out of SwarmEngine.prepull_names is pulled at its first session alone.
        images = admin.call("GET", "images?all=1").json()["images"]
        assert next(i for i in images if i["name"] == "scikit-learn-1.5")["nodes"] is None
        assert [(s["node"], s["state"]) for s in shown["nodes"]] == [(n, "present") for n in nodes]
        digest = admin.call("GET", f"images/{name}").json()["digest"]
        # Pulled by digest on each node's engine, by its agent's order: no session asked for it.
        pulled = f"{registry}/fgpu/prepull@{digest}"
        for node, url in node_urls().items():
            engine = lab.engine(url)
            assert pulled in engine.images.get(pulled).attrs["RepoDigests"], node
            events = engine.events(
                since=started, until=time.time(), decode=True, filters={"type": "image"}
            )
            assert any(e["Action"] == "pull" and e["id"] == pulled for e in events), node
        cluster = admin.call("GET", "resources").json()["nodes"]
        assert {n["name"]: n["images"]["present"] for n in cluster} == dict.fromkeys(nodes, 2)
        assert all(n["images"]["offered"] == 2 and not n["images"]["lacking"] for n in cluster)
        # A student's list of images carries no node's state; an instructor's says how many
        # nodes hold it, not which (node names and pull errors are the cluster's).
        student = QueueUser(swarm_hub, f"stu-{secrets.token_hex(3)}")
        assert all("nodes" not in i for i in student.call("GET", "images").json()["images"])
        teacher = f"teacher-{secrets.token_hex(3)}"
        assert swarm_hub.request("POST", f"users/{teacher}").status_code == 201
        assert swarm_hub.request("POST", "groups/instructors").status_code in (201, 409)
        joined = {"users": [teacher]}
        assert swarm_hub.request("POST", "groups/instructors/users", json=joined).status_code == 200
        as_seen = QueueUser(swarm_hub, teacher).call("GET", "images?all=1").json()["images"]
        assert next(i for i in as_seen if i["name"] == name)["nodes"] == {
            "present": len(nodes),
            "pulling": 0,
            "of": len(nodes),
        }

        # The pages: per image on the Images page (each node's state unfolded), per node on the
        # Cluster page.
        page = pages()
        log_in(page, swarm_hub, "admin")
        page.goto(f"{swarm_hub.url}/services/queue/images")
        on_nodes = page.locator(f'tr[data-image="{name}"] .fgpu-image-nodes')
        expect(on_nodes.locator("summary")).to_have_text("✓ on 3 of 3 nodes")
        on_nodes.locator("summary").click()
        expect(on_nodes.locator("li")).to_have_text([f"{n}: present" for n in nodes])
        page.goto(f"{swarm_hub.url}/services/queue/cluster")
        expect(page.locator(".fgpu-node-images")).to_have_text(
            ["✓ Catalog images here: 2 of 2"] * 3
        )
        for width in (800, 1280):
            page.set_viewport_size({"width": width, "height": 900})
            screenshot(page, f"swarm-cluster-node-images-{width}")
            page.goto(f"{swarm_hub.url}/services/queue/images")
            page.locator(f'tr[data-image="{name}"] .fgpu-image-nodes summary').click()
            screenshot(page, f"swarm-images-on-nodes-{width}")
            page.goto(f"{swarm_hub.url}/services/queue/cluster")
    finally:
        admin.call("DELETE", f"images/{name}")
        for tagged in (reference, f"{registry}/{reference}"):
            with contextlib.suppress(docker.errors.ImageNotFound):
                manager.images.remove(tagged)
        for url in node_urls().values() if digest else ():
            with contextlib.suppress(docker.errors.ImageNotFound):
                lab.engine(url).images.remove(f"{registry}/fgpu/prepull@{digest}")


_OCTETS = {"Content-Type": "application/octet-stream"}
#: A notebook job's notebook: its parameter cell, then a cell that holds the GPU for a while (the
#: fourth job must find every GPU taken) and prints from the parameter.
_NOTEBOOK = training_notebook("import time\ntime.sleep(12)\n")


def _moment(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_batch_jobs_run_on_worker_nodes_end_with_their_own_reason_and_hand_their_slice_on(
    swarm_hub, admin
):
    """A job is a service like a session, with the job runner for its command: its task ends
    `complete` or `failed`, and the reconciler's round ends the job with its exit code and the end
    of its log, read from the manager (the node's container is out of the service's reach), then
    grants its slice to the request waiting for it. The job's log is followed while it runs and
    kept after, and its file lands in the user's `~/jobs` on the shared storage; a notebook job's
    executed copy lands in the storage folder it names; a running job its owner cancels ends
    `cancelled`."""
    tag = secrets.token_hex(2)
    users = {
        role: QueueUser(swarm_hub, f"job{role}-{tag}") for role in ("ok", "bad", "fill", "next")
    }
    whole_gpu = {**GPU_SESSION, "type": "batch"}
    folder = users["fill"].call("POST", "folders", json={"name": "runs"}).json()
    url = f"folders/{folder['id']}/files/train.ipynb"
    notebook = json.dumps(_NOTEBOOK).encode()
    put = users["fill"].call("PUT", url, data=notebook, headers=_OCTETS)
    assert put.status_code == 201, put.text
    what = {
        # Its last line is the moment it exits, on the machine's clock (the lab's nodes share it).
        "ok": {"command": "echo step one; sleep 8; echo step two; date +%s.%N"},
        "bad": {"command": "echo working; echo 'no data found' >&2; sleep 8; exit 3"},
        "fill": {
            "notebook": "folders/runs/train.ipynb",
            "parameters": {"epochs": 7},
            "folders": ["runs"],
        },
    }
    jobs = {}
    try:
        for role, job in what.items():
            answer = users[role].call("POST", "sessions", json={**whole_gpu, **job})
            assert answer.status_code == 201, answer.text
            jobs[role] = answer.json()["servers"][0]["session"]
        for role, job in jobs.items():
            users[role].wait_for(
                lambda s, job=job: any(
                    r["id"] == job["id"] and r["status"] == "RUNNING" for r in s
                ),
                timeout=180,
            )
        # Every node's GPU is taken: a fourth job waits for a slice.
        answer = users["next"].call(
            "POST", "sessions", json={**whole_gpu, "command": "sleep 300; echo never"}
        )
        assert answer.status_code == 201, answer.text
        jobs["next"] = answer.json()["servers"][0]["session"]
        assert job_record(users["next"], jobs["next"]["id"])["status"] == "PENDING"

        # On a worker node, as its service's task, with the job's label.
        running = job_record(users["ok"], jobs["ok"]["id"])
        node = running["grant"]["node"]
        assert node in swarm_hub.lab.nodes
        manager = swarm_hub.lab.manager()
        (service,) = manager.services.list(filters={"label": f"fgpu.session_id={jobs['ok']['id']}"})
        assert service.attrs["Spec"]["Labels"]["fgpu.kind"] == "batch"
        (task,) = service.tasks()
        assert manager.nodes.get(task["NodeID"]).attrs["Description"]["Hostname"] == node

        # The log, read on the manager while the job runs, then followed to its end.
        now = users["ok"].call("GET", f"sessions/{jobs['ok']['id']}/logs")
        assert now.status_code == 200, now.text
        follow = users["ok"].call("GET", f"sessions/{jobs['ok']['id']}/logs?follow=1", stream=True)
        assert follow.status_code == 200
        streamed = b"".join(follow.iter_content(chunk_size=None)).decode()
        assert streamed.index("step one") < streamed.index("step two")
        assert "[fgpu job] exited with code 0" in streamed

        done = job_ended(users["ok"], jobs["ok"]["id"], 180)
        assert (done["status"], done["end_reason"], done["exit_code"]) == (
            "TERMINATED",
            "finished",
            0,
        )
        kept = users["ok"].call("GET", f"sessions/{jobs['ok']['id']}/logs").text
        assert "step two" in kept and "~/jobs/job-" in kept
        exited_at = float(next(line for line in kept.splitlines() if line[:1].isdigit()))
        latency = _moment(done["ended"]) - exited_at
        print(f"\njob exit to its end on the Swarm: {latency:.2f} s")
        assert latency < 10

        # The waiting job got a slice in the pass that ended one of them (it runs for a while, so
        # that its grant is read from the active list, which has it).
        (granted,) = users["next"].wait_for(
            lambda s: any(r["id"] == jobs["next"]["id"] and r["scheduled"] for r in s), timeout=60
        )
        first_ends = []
        for role in ("ok", "bad", "fill"):
            first_ends += [r for r in [job_record(users[role], jobs[role]["id"])] if r["ended"]]
        first_end = min(_moment(r["ended"]) for r in first_ends)
        assert 0 <= _moment(granted["scheduled"]) - first_end < 1

        failed = job_ended(users["bad"], jobs["bad"]["id"], 180)
        assert (failed["end_reason"], failed["exit_code"]) == ("failed", 3)
        assert "code 3" in failed["reason"] and "no data found" in failed["reason"]
        assert (
            "no data found" in users["bad"].call("GET", f"sessions/{jobs['bad']['id']}/logs").text
        )
        # Cancelled by its owner while it runs: its service removed, it ends `cancelled`, not
        # as a job that exited nor as a lost one.
        users["next"].wait_for(
            lambda s: any(r["id"] == jobs["next"]["id"] and r["status"] == "RUNNING" for r in s),
            timeout=120,
        )
        cancel = users["next"].call("DELETE", f"sessions/{jobs['next']['id']}")
        assert cancel.status_code in (200, 202), cancel.text
        cancelled = job_ended(users["next"], jobs["next"]["id"], 180)
        assert (cancelled["status"], cancelled["end_reason"]) == ("TERMINATED", "cancelled")

        # The log's file in the user's home on the shared storage; the ended job's service gone.
        homes = Path(swarm_hub.lab.env["FGPU_SWARM_HOME_ROOT"])
        (log_file,) = homes.glob(f"{users['ok'].name}*/jobs/{jobs['ok']['server_name']}-*.log")
        assert "step two" in log_file.read_text()
        notebook_job = job_ended(users["fill"], jobs["fill"]["id"], 180)
        assert notebook_job["end_reason"] == "finished", notebook_job["reason"]
        listing = users["fill"].call("GET", f"folders/{folder['id']}/files/").json()["entries"]
        (copy,) = [e["name"] for e in listing if e["name"].startswith("train-output-")]
        executed = users["fill"].call("GET", f"folders/{folder['id']}/files/{copy}").json()
        outputs = [
            "".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", [])
        ]
        assert "trained for 70\n" in outputs
        wait_for(
            lambda: (
                not manager.services.list(filters={"label": f"fgpu.session_id={jobs['ok']['id']}"})
            ),
            60,
            "the ended job's service to be removed",
        )
    finally:
        for role, job in jobs.items():
            users[role].call("DELETE", f"sessions/{job['id']}")


def _lab_backend(lab: Lab) -> SwarmEngine:
    return engine_backend(SwarmEngine, lab.manager(), node_down_grace=NODE_DOWN_GRACE)


def test_a_job_services_exit_code_and_log_are_read_from_the_manager(lab: Lab):
    """What the queue service reads of a job on a Swarm (engine/job_services.py), on real tasks:
    the exit code of a task that ended `complete` or `failed`, the end of the service's log, a
    followed log that a reader's close ends from another thread (the manager's stream would wait
    on for another task), and the service's removal."""
    backend = _lab_backend(lab)
    manager = lab.manager()
    commands = {"ok": "echo all done", "bad": "echo working; echo 'no data' >&2; exit 3"}
    session_ids = {role: f"jobtest{secrets.token_hex(4)}" for role in commands}
    services = {
        role: manager.services.create(
            f"{lab.env['FGPU_SWARM_REGISTRY']}/{IMAGE}",
            command=["sh", "-c", command],
            name=f"fgpu-job-test-{role}-{secrets.token_hex(3)}",
            labels={"fgpu.session_id": session_ids[role], "fgpu.kind": "batch"},
            restart_policy=docker.types.RestartPolicy(condition="none"),
            constraints=["node.role==worker"],
        )
        for role, command in commands.items()
    }
    try:
        ended = {
            role: wait_for(lambda sid=sid: backend.job_exit(sid), 120, f"{role}'s task to end")
            for role, sid in session_ids.items()
        }
        for role, service in services.items():
            (task,) = service.tasks()
            print(f"\n{role} task status: {json.dumps(task['Status'])}")
        assert ended["ok"] == (0, ended["ok"][1]) and "all done" in ended["ok"][1]
        assert ended["bad"][0] == 3
        assert "working" in ended["bad"][1] and "no data" in ended["bad"][1]
        # stdout and stderr are two streams, whose order the tail does not keep.
        assert set(backend.job_log(session_ids["bad"], 2).split()) == {"working", "no", "data"}
        # What the service looks for every second (a Swarm reports no task events).
        assert set(session_ids.values()) <= set(backend.exited_jobs(""))
        assert not set(session_ids.values()) & set(backend.exited_jobs("another-hub"))

        stream = backend.follow_job_log(session_ids["bad"], 10)
        read: list[bytes] = []
        reader = threading.Thread(target=lambda: read.extend(job_services.chunks_of(stream)))
        reader.start()
        reader.join(5)
        print(f"a followed service log ended by itself after its task: {not reader.is_alive()}")
        stream.close()
        reader.join(10)
        assert not reader.is_alive(), "the followed log went on after its close"
        assert b"no data" in b"".join(read)

        backend.remove_job(session_ids["ok"])
        assert backend.job_exit(session_ids["ok"]) is None
        assert backend.job_log(session_ids["ok"], 10) is None
    finally:
        for service in services.values():
            with contextlib.suppress(docker.errors.NotFound):
                service.remove()


def test_a_session_overlay_left_without_its_service_is_removed_by_the_reconciler(swarm_hub):
    """The spawner removes a session's own overlay when the session stops; one it left (a hub
    that stopped meanwhile) goes in the queue service's reconciler rounds, once its service has
    been missing for the node-down grace, with the hub's container sent away from it first."""
    manager = swarm_hub.lab.manager()
    name = f"fgpu-orphan-{secrets.token_hex(3)}"
    member = manager.containers.run(
        f"{swarm_hub.lab.env['FGPU_SWARM_REGISTRY']}/{IMAGE}", ["sleep", "600"], detach=True
    )
    network = manager.networks.create(
        name, driver="overlay", attachable=True, labels={"fgpu.role": "session"}
    )
    left_at = time.monotonic()
    try:
        network.connect(member)
        wait_for(
            lambda: not manager.networks.list(names=[name]),
            timeout=NODE_DOWN_GRACE + 30,
            what=f"the orphan overlay {name} removed",
        )
        assert time.monotonic() - left_at >= NODE_DOWN_GRACE - 1
        member.reload()
        assert name not in member.attrs["NetworkSettings"]["Networks"]
    finally:
        member.remove(force=True)
        with contextlib.suppress(docker.errors.NotFound):
            network.remove()


class _LabSpawner(FGPUSwarmSpawner):
    """The Swarm spawner with an engine client of its own (DockerSpawner keeps one per class)."""


def _service_without_task(lab: Lab):
    """A real session-like service whose task is not made yet (0 replicas), and a spawner of it."""
    service = lab.manager().services.create(
        f"{lab.env['FGPU_SWARM_REGISTRY']}/{IMAGE}",
        command=["sleep", "600"],
        name=f"fgpu-late-task-{secrets.token_hex(3)}",
        mode=docker.types.ServiceMode("replicated", replicas=0),
        restart_policy=docker.types.RestartPolicy(condition="none"),
    )
    spawner = _LabSpawner(
        client_kwargs=docker.utils.kwargs_from_env(environment=lab.env),
        object_name=service.name,
        task_start_timeout=180,
    )
    spawner.object_id = service.id
    return service, spawner


def test_a_task_the_manager_has_not_made_yet_is_waited_for_not_taken_for_a_failure(lab: Lab):
    """The manager stores a service and makes its task a moment later; a spawner looking in
    between saw no task and failed the spawn ("did not start (missing)", seen in the benchmark on
    a loaded machine). The gap is held open here: the service has 0 replicas at first, and gets
    its task a few seconds later, as a late orchestrator would give it."""
    service, spawner = _service_without_task(lab)

    async def start_while_the_task_comes_late():
        starting = asyncio.ensure_future(spawner.start_object())
        await asyncio.sleep(3)
        assert not starting.done(), f"gave up on a service without a task yet: {starting}"
        await asyncio.to_thread(service.scale, 1)
        await asyncio.wait_for(starting, 180)

    try:
        run_apart(start_while_the_task_comes_late())
        (task,) = service.tasks()
        assert task["Status"]["State"] == "running"
    finally:
        service.remove()

    # A service removed before its task came is a failure at once, not a wait for the timeout.
    service, spawner = _service_without_task(lab)
    service.remove()
    with pytest.raises(SpawnException, match="the service was removed"):
        run_apart(asyncio.wait_for(spawner.start_object(), 30))


def run_apart(coroutine):
    """Run `coroutine` on a loop of its own in another thread: the module's Chromium test leaves
    Playwright's loop running in this one until the module ends."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, coroutine).result()


class _OverlaySpawner(FGPUSwarmSpawner):
    """The Swarm spawner with `endpoint="overlay"`, without a hub: its context is made from its
    own traits, leaving out what only a hub gives (the API token and URLs in the environment,
    `jupyterhub-singleuser`'s arguments). Everything else is the spawner's own: the overlay it
    makes, the spec, the service it creates, its wait for the task, the address it reports."""

    async def container_context(self) -> ContainerContext:
        return ContainerContext(
            name=self.object_name,
            user="ovl",
            server_name="",
            command=self.cmd,
            env={},
            port=self.port,
            network=(await self.session_network()).id,
            run_as=self.run_as,
            pids_limit=self.pids_limit,
        )


#: What the probe runs on the other node: the service's name as the overlay's DNS resolves it,
#: and the session's answer at the address and port the spawner reported.
PROBE = """
import json, socket, sys, urllib.request
name, url = sys.argv[1:]
out = {"resolved": sorted(socket.gethostbyname_ex(name)[2])}
with urllib.request.urlopen(url, timeout=3) as reply:
    out["status"], out["body"] = reply.status, reply.read().decode().strip()
print(json.dumps(out))
"""


def test_an_overlay_session_is_reached_at_its_reported_address_from_another_node(lab: Lab):
    """`endpoint="overlay"` end to end, as far as a hub beside the Swarm allows: the proxy of a
    hub on the overlay is stood in for by a probe container attached to the same attachable
    overlay on another node. The session serves HTTP on its port with a plain command (the
    spawner's `cmd`), since `jupyterhub-singleuser` needs a hub; the hub's own proxy on the
    overlay is not run here."""
    session_node, probe_node = lab.nodes[0], lab.nodes[1]
    tag = secrets.token_hex(3)
    image = f"{lab.env['FGPU_SWARM_REGISTRY']}/{IMAGE}"
    spawner = _OverlaySpawner(
        client_kwargs=docker.utils.kwargs_from_env(environment=lab.env),
        endpoint="overlay",
        network_per_session=False,  # the shared overlay, on purpose
        allow_reachable_sessions=True,
        network_name=f"fgpu-ovl-{tag}",
        registry=lab.env["FGPU_SWARM_REGISTRY"],
        registry_auth_file=lab.env["FGPU_SWARM_REGISTRY_AUTH_FILE"],
        object_name=f"fgpu-overlay-{tag}",
        task_start_timeout=180,
    )
    # Serves a file naming the container, so the answer says which container gave it.
    spawner.cmd = [
        "sh",
        "-c",
        "mkdir -p /tmp/www && hostname > /tmp/www/who && cd /tmp/www && "
        f"exec python3 -m http.server {spawner.port}",
    ]
    spawner.resource_request = ResourceRequest("python-3.11", IMAGE, cpu=0.5, mem=256 * 2**20)
    spawner.grant = Grant(f"ovl-{tag}", session_node)
    manager = lab.manager()
    probe = None
    try:
        # DockerSpawner's start, as FGPUSpawner.start runs it once the grant is there.
        ip, port = run_apart(DockerSpawner.start(spawner))
        (task,) = manager.services.get(spawner.object_id).tasks()
        assert manager.nodes.get(task["NodeID"]).attrs["Description"]["Hostname"] == session_node
        network = manager.networks.get(spawner.network_name)
        assert network.attrs["Driver"] == "overlay" and network.attrs["Attachable"]

        # The address is the task's on the overlay (from the Swarm's pool), and the port the
        # server's own: nothing is published on the node.
        assert ipaddress.ip_address(ip) in ipaddress.ip_network(LAB_ENV["FGPU_SWARM_LAB_POOL"])
        assert port == spawner.port
        assert not (task["Status"].get("PortStatus") or {}).get("Ports")
        container = session_container_by_task(lab, session_node, task)
        assert container.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"] == ip

        probe_engine = lab.engine(node_urls()[probe_node])
        probe = probe_engine.containers.run(
            image, ["sleep", "600"], network=network.name, user="1000", detach=True
        )
        assert probe.attrs["Config"]["Hostname"] != container.attrs["Config"]["Hostname"]

        def reached() -> dict | None:
            url = f"http://{ip}:{port}/who"
            done = probe.exec_run(["python3", "-c", PROBE, spawner.object_name, url])
            return done.exit_code == 0 and json.loads(done.output.decode().splitlines()[-1])

        answer = wait_for(
            reached, timeout=60, interval=1, what=f"the session at {ip}:{port} from {probe_node}"
        )
        assert answer["status"] == 200
        assert answer["body"] == container.attrs["Config"]["Hostname"]
        # DNS round robin: the service's name is its one task's address, no virtual IP.
        assert answer["resolved"] == [ip]
    finally:
        if probe is not None:
            probe.remove(force=True)
        if spawner.object_id:
            run_apart(spawner.remove_object())
        _remove_network_once_unused(lab, spawner.object_name, spawner.network_name)


def session_container_by_task(lab: Lab, node: str, task: dict):
    engine = lab.engine(node_urls()[node])
    return engine.containers.get(task["Status"]["ContainerStatus"]["ContainerID"])


def _remove_network_once_unused(lab: Lab, service_name: str, network_name: str) -> None:
    """The overlay goes once the removed service's task has left it on its node."""
    manager = lab.manager()

    def no_live_task() -> bool:
        tasks = manager.api.tasks(filters={"name": service_name})
        return not [t for t in tasks if t["Status"]["State"] in LIVE_STATES]

    wait_for(no_live_task, timeout=60, what=f"the tasks of {service_name} gone")

    def removed() -> bool:
        try:
            manager.networks.get(network_name).remove()
        except docker.errors.NotFound:
            return True
        except docker.errors.APIError:
            return False  # still has endpoints while the node detaches the task
        return True

    wait_for(removed, timeout=60, interval=1, what=f"the overlay {network_name} removed")


class _LateOverlaySpawner(FGPUSwarmSpawner):
    """A spawner that finds no overlay, and another hub's spawn makes it just after it looked:
    the gap between look-up and create, held open (it is a few milliseconds otherwise)."""

    made_meanwhile = ""

    def _find_overlay(self):
        found = super()._find_overlay()
        if found is None and not self.made_meanwhile:
            other_hub = self.client.create_network(
                self.network_name, driver="overlay", attachable=True
            )
            type(self).made_meanwhile = other_hub["Id"]
        return found


def test_spawns_that_race_to_make_the_overlay_all_use_the_one_the_manager_kept(lab: Lab):
    """The first overlay spawns of a hub all found no network and all made it; the manager kept
    the first and refused the others (409), whose spawns failed ("No overlay network ...:
    Conflict"; 3 of 8 spawners at once, before the fix)."""
    name = f"fgpu-ovl-race-{secrets.token_hex(3)}"
    kwargs = dict(
        client_kwargs=docker.utils.kwargs_from_env(environment=lab.env),
        endpoint="overlay",
        network_per_session=False,  # the shared overlay, on purpose
        allow_reachable_sessions=True,
        network_name=name,
    )
    try:
        late = run_apart(_LateOverlaySpawner(**kwargs).session_network())
        assert late.id == _LateOverlaySpawner.made_meanwhile

        async def at_once():
            return await asyncio.gather(
                *(
                    _OverlaySpawner(**{**kwargs, "network_name": f"{name}-b"}).session_network()
                    for _ in range(8)
                )
            )

        assert len({network.id for network in run_apart(at_once())}) == 1
    finally:
        for network in lab.manager().networks.list(names=[name, f"{name}-b"]):
            network.remove()


def test_the_hubs_container_joins_the_shared_overlay_once_however_many_spawns_race(lab: Lab):
    """On the shared overlay (no overlay per session) the first spawns of a hub all find the
    hub's container off the network and all join it; the engine refuses every join but one."""
    manager = lab.manager()
    tag = secrets.token_hex(3)
    hub_container = manager.containers.run(
        f"{lab.env['FGPU_SWARM_REGISTRY']}/{IMAGE}",
        ["sleep", "600"],
        name=f"fgpu-hubc-{tag}",
        detach=True,
        user="1000",
    )
    name = f"fgpu-ovl-shared-{tag}"
    kwargs = dict(
        client_kwargs=docker.utils.kwargs_from_env(environment=lab.env),
        endpoint="overlay",
        network_per_session=False,  # the shared overlay, on purpose
        allow_reachable_sessions=True,
        network_name=name,
        hub_container=hub_container.name,
    )
    try:

        async def at_once():
            return await asyncio.gather(
                *(_OverlaySpawner(**kwargs).session_network() for _ in range(6))
            )

        (network_id,) = {network.id for network in run_apart(at_once())}
        hub_container.reload()
        joined = hub_container.attrs["NetworkSettings"]["Networks"]
        assert joined[name]["NetworkID"] == network_id
        # Later spawns find it there and change nothing.
        assert run_apart(_OverlaySpawner(**kwargs).session_network()).id == network_id
    finally:
        hub_container.remove(force=True)
        for network in manager.networks.list(names=[name]):
            network.remove()


@pytest.fixture(scope="module")
def overlay_hub(lab: Lab, tmp_path_factory):
    """A hub in the shipped Swarm defaults for a hub in a container (`overlay`, an overlay per
    session: nothing but FGPU_SWARM_HUB_CONTAINER set), whose process and
    proxy run in the network of a container on the manager, as a site runs the hub's container
    there (`swarm_lab.hub_container`). Students reach the proxy at the port the container
    publishes on the manager's address."""
    with hub_container(lab.env, labels={TEST_LABEL: secrets.token_hex(3)}) as anchor:
        workdir = tmp_path_factory.mktemp("overlay-hub")
        env = {**lab.env, **anchor.env()}
        with running_hub(workdir, env=env, launcher=anchor.launcher, url=anchor.url) as hub:
            hub.lab, hub.anchor = lab, anchor.container
            try:
                yield hub
            finally:
                for service in lab.manager().services.list(
                    filters={"label": f"{TEST_LABEL}={hub.run_id}"}
                ):
                    service.remove()


def proxy_target(hub, path: str) -> str:
    """Where the hub's proxy sends `path` (the hub's own view of its routes)."""
    routes = hub.request("GET", "proxy").json()
    return routes[path]["target"]


#: Run in a session: GET a URL, print the status (or the error) as JSON.
FETCH = """
import json, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])) as reply:
        print(json.dumps({"status": reply.status}))
except Exception as e:
    print(json.dumps({"error": repr(e)}))
"""


def fetch_from(container, url: str, timeout: float = 5) -> dict:
    done = container.exec_run(["python3", "-c", FETCH, url, str(timeout)])
    return json.loads(done.output.decode().splitlines()[-1])


def test_the_hubs_proxy_reaches_sessions_on_other_nodes_over_their_own_overlays_and_they_not_each_other(
    overlay_hub, pages
):
    """A student's request through the public URL reaches a real `jupyterhub-singleuser` on a
    worker over the session's overlay; the session reaches the hub's API on it (JupyterLab's
    login is the server's OAuth exchange with the hub); two sessions on overlays of their own
    cannot reach each other; a stopped session's overlay goes."""
    hub, lab = overlay_hub, overlay_hub.lab
    manager = lab.manager()
    sessions = {"kim": "a", "lee": "b"}
    try:
        for user, server in sessions.items():
            response = hub.start_server(user, GPU_SESSION, server)
            assert response.status_code in (201, 202), response.text
        models = {
            user: hub.wait_ready(user, server, timeout=240) for user, server in sessions.items()
        }
        admin = QueueUser(hub, "admin")
        records = {user: session_of(admin, user, server) for user, server in sessions.items()}
        nodes = {user: record["grant"]["node"] for user, record in records.items()}
        # One GPU per node: the two sessions run on two workers, neither of them the hub's node.
        assert len(set(nodes.values())) == 2 and set(nodes.values()) <= set(lab.nodes)

        # Through the public URL: the proxy, beside the hub on the manager, reaches the server.
        token = hub.user_token("kim")
        reply = requests.get(
            f"{hub.url}{models['kim']['url']}api/status",
            headers={"Authorization": f"token {token}"},
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        target = proxy_target(hub, models["kim"]["url"])
        assert ipaddress.ip_address(urlparse(target).hostname) in ipaddress.ip_network(
            LAB_ENV["FGPU_SWARM_LAB_POOL"]
        )

        containers = {
            user: session_container(lab, nodes[user], record["id"])
            for user, record in records.items()
        }
        # Each session is on an overlay of its own, which the hub's container has joined.
        hub.anchor.reload()
        anchor_networks = hub.anchor.attrs["NetworkSettings"]["Networks"]
        for container in containers.values():
            own = set(container.attrs["NetworkSettings"]["Networks"])
            assert own == {container.labels["com.docker.swarm.service.name"]}, own
            assert own <= set(anchor_networks)

        # The session reaches the hub's API, at the hub container's name on its overlay.
        api_url = dict(e.split("=", 1) for e in containers["kim"].attrs["Config"]["Env"])[
            "JUPYTERHUB_API_URL"
        ]
        assert urlparse(api_url).hostname == hub.anchor.name
        assert fetch_from(containers["kim"], api_url) == {"status": 200}
        # On its overlay, as beside the hub, the session cannot reach the registry.
        found = probe_registry(containers["kim"])
        assert unreachable(found), found

        # kim, in a browser: the hub's login, then JupyterLab, once her server has had the
        # hub's API confirm the login (OAuth), over the overlay.
        page = pages()
        log_in(page, hub, "kim")
        page.goto(f"{hub.url}{models['kim']['url']}lab")
        expect(page.locator(".jp-Launcher")).to_be_visible(timeout=120_000)
        screenshot(page, "swarm-overlay-jupyterlab")

        # lee's session cannot reach kim's server, which the proxy reaches; lee's own server
        # answers the same request from there.
        lee_target = proxy_target(hub, models["lee"]["url"])
        own = fetch_from(containers["lee"], f"{lee_target}{models['lee']['url']}api")
        assert own == {"status": 200}
        other = fetch_from(containers["lee"], f"{target}{models['kim']['url']}api")
        assert "timed out" in other.get("error", "") or "unreachable" in other.get("error", ""), (
            other
        )

        # Stopped: kim's overlay is gone, and the hub's container has left it.
        kim_network = containers["kim"].labels["com.docker.swarm.service.name"]
        hub.stop_server("kim", "a")
        wait_for(
            lambda: not manager.networks.list(names=[kim_network]),
            timeout=60,
            what=f"{kim_network} removed",
        )
        hub.anchor.reload()
        assert kim_network not in hub.anchor.attrs["NetworkSettings"]["Networks"]
    finally:
        hub.stop_servers(set(sessions.items()) & hub.active_servers())
