"""The node agent (node_agent/agent.py): its pure report building, the NVML ctypes boundary with a
fake library, and its engine client against this machine's real dockerd (socket, list, stats,
commit), with a real report posted to a real HTTP server."""

from __future__ import annotations

import ast
import asyncio
import base64
import contextlib
import ctypes
import json
import secrets
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import warnings
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import docker
import pytest
from tornado.testing import bind_unused_port

from node_agent import agent
from queue_service import private_images
from queue_service.engine import container_commits, stats
from queue_service.engine.node_reports import parse_report
from queue_service.engine.session_exec import Frames

from .harness import TEST_LABEL, remove_containers
from .harness import wait_until as _poll
from .test_registry_images import tiny_image
from .test_stats import V1_STATS, V2_STATS

AGENT_FILE = Path(agent.__file__)
IMAGE = "fgpu/jupyter-base:py3.11"
KEY = "5e" * 32
NODE_ID = "x3q8k2m5n7p9r1t4v6w8y0z2a"


def container(session_id, container_id="c1", state="running"):
    return {"Id": container_id, "State": state, "Labels": {agent.SESSION_LABEL: session_id}}


def sample(total, system, online=2, usage=100 << 20, limit=1 << 30):
    return {
        "cpu_stats": {
            "cpu_usage": {"total_usage": total},
            "system_cpu_usage": system,
            "online_cpus": online,
        },
        "memory_stats": {"usage": usage, "stats": {"total_inactive_file": 0}, "limit": limit},
    }


# -- the signature of a report and of its answer ----------------------------------------------


def test_a_reports_signature_covers_its_node_path_time_nonce_and_body():
    body = b'{"version": 1}'
    headers = agent.signed_headers(KEY, NODE_ID, "POST", "/r", body, now=1000.5, nonce="n1")
    assert headers[agent.NODE_ID_HEADER] == NODE_ID
    assert (headers[agent.TIME_HEADER], headers[agent.NONCE_HEADER]) == ("1000.500000", "n1")
    signature = headers[agent.SIGNATURE_HEADER]
    assert len(signature) == 64
    parts = ("POST", "/r", NODE_ID, "1000.500000", "n1", body)
    assert agent.request_signature(KEY, *parts) == signature
    for position, changed in enumerate(("GET", "/s", "other-node", "1000.6", "n2", b"{}")):
        altered = list(parts)
        altered[position] = changed
        assert agent.request_signature(KEY, *altered) != signature, changed
    assert agent.request_signature("00" * 32, *parts) != signature
    # Every report gets a nonce of its own.
    again = agent.signed_headers(KEY, NODE_ID, "POST", "/r", body, now=1000.5)
    assert (
        again[agent.NONCE_HEADER]
        != agent.signed_headers(KEY, NODE_ID, "POST", "/r", body)[agent.NONCE_HEADER]
    )


def test_an_answer_is_genuine_only_for_its_key_its_reports_nonce_and_its_body():
    signature = agent.answer_signature(KEY, "n1", b'{"orders": []}')
    assert agent.answer_is_genuine(KEY, "n1", b'{"orders": []}', signature)
    assert not agent.answer_is_genuine(KEY, "n2", b'{"orders": []}', signature)
    assert not agent.answer_is_genuine(KEY, "n1", b'{"orders": [{}]}', signature)
    assert not agent.answer_is_genuine("00" * 32, "n1", b'{"orders": []}', signature)
    assert not agent.answer_is_genuine(KEY, "n1", b'{"orders": []}', None)


# -- the file itself ------------------------------------------------------------------------------


def test_the_agent_is_one_file_of_the_standard_library_alone():
    """Shipped as a Swarm config and run by any image's python3: no import outside the stdlib."""
    tree = ast.parse(AGENT_FILE.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import would not exist on the node"
            imported.add(node.module.split(".")[0])
    assert imported - {"__future__"} <= sys.stdlib_module_names, imported
    # Swarm configs are at most 500 KB; the agent (reports, commits, shells) is far below.
    assert AGENT_FILE.stat().st_size < 50_000


# -- pure: usage and the report -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("previous", "current"),
    [((1_000, 10_000, 2), (6_000, 20_000, 2)), (None, (1, 2, 2)), ((9_000, 10_000, 2), (1, 2, 2))],
)
def test_cpu_and_memory_follow_the_queue_services_own_formulas(previous, current):
    """The agent cannot import queue_service.engine.stats on a node; both must give the same figures."""
    assert agent.cpu_percent(previous, current) == stats.cpu_percent(previous, current)
    for answer in (V1_STATS, V2_STATS, {}):
        assert agent.memory(answer) == stats.memory(answer)
        if answer:
            assert agent.cpu_times(answer) == stats.cpu_times(answer)


def test_session_usage_takes_cpu_between_two_rounds_and_skips_what_is_gone():
    containers = [container("s1", "c1"), container("s2", "c2"), {"Id": "c3", "Labels": {}}]
    first, samples = agent.session_usage(
        containers, {"c1": sample(1_000, 10_000), "c2": None, "c3": sample(1, 1)}, {}
    )
    assert list(first) == ["s1"]  # c2's stats are gone (removed meanwhile), c3 is no session
    assert first["s1"] == {
        "container": "c1",
        "state": "running",
        "cpu_percent": None,  # one sample: no rate yet
        "mem_bytes": 100 << 20,
        "mem_limit_bytes": 1 << 30,
    }
    second, _ = agent.session_usage(containers[:1], {"c1": sample(6_000, 20_000)}, samples)
    assert second["s1"]["cpu_percent"] == 100.0  # one core of two busy


def test_a_built_report_is_what_the_queue_service_takes():
    sessions, _ = agent.session_usage([container("s1")], {"c1": sample(1, 2)}, {})
    gpus = [
        {
            "uuid": "GPU-1",
            "name": "A100",
            "index": 0,
            "memory_total": 40 << 30,
            "memory_used": 1 << 30,
            "util_percent": 12.0,
        }
    ]
    results = [{"id": "o1", "kind": "commit", "ok": True}]
    report = agent.build_report("node-1", "2026-01-01T00:00:00+00:00", sessions, gpus, results)
    body = json.loads(json.dumps(report))
    parsed = parse_report("node-1", body)
    assert parsed.sessions["s1"].mem_bytes == 100 << 20
    assert parsed.gpus[0].uuid == "GPU-1" and parsed.gpus[0].util_percent == 12.0
    assert parsed.order_results == ({"id": "o1", "kind": "commit", "ok": True},)
    # No NVML on the node: gpus is null, and the service takes that as "not read here".
    assert parse_report("node-1", agent.build_report("node-1", "t", {}, None)).gpus is None


def test_a_nodes_images_are_the_repository_digests_its_engine_lists():
    images = [
        {"RepoDigests": ["r/a@sha256:1", "r/b@sha256:2"], "RepoTags": ["r/a:1"]},
        {"RepoDigests": None},
        {"RepoDigests": ["<none>@<none>", "r/a@sha256:1"]},
        {},
    ]
    assert agent.repo_digests(images) == ["<none>@<none>", "r/a@sha256:1", "r/b@sha256:2"]
    assert agent.repo_digests(None) == []


def test_filters_orders_urls_and_image_names():
    assert agent.session_filters() == {
        "label": ["fgpu.session_id"],
        "status": ["running", "paused"],
    }
    assert agent.session_filters("d1")["label"] == ["fgpu.session_id", "fgpu.deployment=d1"]
    assert agent.orders_of(
        {"orders": [{"id": "a", "kind": "commit"}, {"id": "b", "kind": "rm"}, 3, {"kind": "pull"}]}
    ) == [{"id": "a", "kind": "commit"}]
    assert agent.orders_of({"node": "x"}) == [] and agent.orders_of(None) == []
    assert agent.report_url("http://h:8000/services/queue/", "n 1") == (
        "http://h:8000/services/queue/api/nodes/n%201/report"
    )
    assert agent.split_image("10.0.0.1:5000/fgpu/private:t1") == (
        "10.0.0.1:5000/fgpu/private",
        "t1",
    )
    assert agent.split_image("10.0.0.1:5000/fgpu/private") == (
        "10.0.0.1:5000/fgpu/private",
        "latest",
    )
    assert agent.own_usage("Name:\tpython3\nVmRSS:\t   20480 kB\n", 1.23456) == {
        "rss_bytes": 20480 * 1024,
        "cpu_seconds": 1.235,
    }


def test_the_commit_config_is_the_services_own():
    """The agent commits on its node as the service commits on its own engine."""
    image = {"Env": ["PATH=/bin", "LANG=C"], "Labels": {"a": "1"}, "Cmd": ["jupyterhub-singleuser"]}
    image |= {"User": "1000", "WorkingDir": "/home/jovyan"}
    container = {
        "Env": ["PATH=/bin", "JUPYTERHUB_API_TOKEN=secret"],
        "Labels": {"fgpu.session_id": "s1", "a": "2"},
        "Cmd": ["sh"],
        "User": "0",
    }
    labels = {private_images.LABEL_OWNER: "alice"}
    assert agent.commit_config(image, container, labels) == container_commits.commit_config(
        image, container, labels
    )
    conf = agent.commit_config(image, container, labels)
    assert "JUPYTERHUB_API_TOKEN=" in conf["Env"] and conf["Labels"]["fgpu.session_id"] == ""


def test_a_push_stream_gives_its_digest_or_fails_on_its_error():
    ok = b'{"status":"Pushing"}\n{"status":"t1: digest","aux":{"Tag":"t1","Digest":"sha256:ab"}}\n'
    assert agent.push_digest(ok) == "sha256:ab"
    with pytest.raises(agent.EngineError, match="connection refused"):
        agent.push_digest(b'{"status":"Pushing"}\n{"error":"connection refused"}\n')


def test_registry_credentials_become_the_push_header_docker_sends():
    credentials = (
        '{"username": "fgpu-nodes", "password": "p/+w", "serveraddress": "r:5000", "x": 1}'
    )
    header = agent.registry_auth_header(credentials)
    assert "+" not in header and "/" not in header  # base64url, as the docker CLI sends it
    assert json.loads(base64.urlsafe_b64decode(header)) == {
        "username": "fgpu-nodes",
        "password": "p/+w",
        "serveraddress": "r:5000",
    }
    for bad, why in [
        ("not json", "not JSON"),
        ("[]", "no JSON object"),
        ('{"username": "u", "password": ""}', "lack password, serveraddress"),
    ]:
        with pytest.raises(ValueError, match=why):
            agent.registry_auth_header(bad)


def test_the_agent_pushes_with_the_credentials_file_it_is_given(tmp_path):
    assert agent.read_registry_auth({}) == agent.NO_REGISTRY_AUTH == "e30="
    path = tmp_path / "auth.json"
    path.write_text('{"username": "u", "password": "p", "serveraddress": "r:5000"}')
    environ = {"FGPU_AGENT_REGISTRY_AUTH_FILE": str(path)}
    assert agent.read_registry_auth(environ) == agent.registry_auth_header(path.read_text())
    assert agent.Engine(registry_auth=agent.read_registry_auth(environ)).registry_auth != "e30="
    path.write_text("")
    with pytest.raises(SystemExit, match="no registry credentials in .*auth.json"):
        agent.read_registry_auth(environ)
    path.write_text('{"username": "u"}')
    with pytest.raises(SystemExit, match="FGPU_AGENT_REGISTRY_AUTH_FILE.*lack password"):
        agent.read_registry_auth(environ)


# -- NVML through ctypes, with a fake library -----------------------------------------------------


class FakeNvmlLibrary:
    """NVML's C functions as ctypes calls them: out-parameters come as byref() or buffers, and
    every call returns an nvmlReturn_t (0: success; 3: NOT_SUPPORTED; 15: GPU_IS_LOST)."""

    def __init__(self, gpus, fail=None):
        self.gpus, self.fail, self.calls = gpus, fail or {}, []
        self.nvmlErrorString = lambda code: {3: b"Not Supported", 15: b"GPU is lost"}[code]

    def nvmlInit_v2(self):
        self.calls.append("init")
        return 0

    def nvmlShutdown(self):
        self.calls.append("shutdown")
        return 0

    def nvmlDeviceGetCount_v2(self, count):
        count._obj.value = len(self.gpus)
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index, handle):
        handle._obj.value = 1000 + index.value
        return self.fail.get(("handle", index.value), 0)

    def _gpu(self, handle):
        return self.gpus[handle.value - 1000]

    def nvmlDeviceGetUUID(self, handle, buffer, size):
        buffer.value = self._gpu(handle)["uuid"].encode()[: size.value - 1]
        return 0

    def nvmlDeviceGetName(self, handle, buffer, size):
        buffer.value = self._gpu(handle)["name"].encode()
        return 0

    def nvmlDeviceGetMemoryInfo(self, handle, memory):
        gpu = self._gpu(handle)
        memory._obj.total, memory._obj.used = gpu["total"], gpu["used"]
        memory._obj.free = gpu["total"] - gpu["used"]
        return 0

    def nvmlDeviceGetUtilizationRates(self, handle, utilization):
        gpu = self._gpu(handle)
        if gpu.get("util") is None:
            return 3
        utilization._obj.gpu = gpu["util"]
        return 0


TWO_GPUS = [
    {
        "uuid": "GPU-aaaa",
        "name": "NVIDIA A100-SXM4-40GB",
        "total": 40 << 30,
        "used": 1 << 30,
        "util": 37,
    },
    {"uuid": "GPU-bbbb", "name": "Tesla T4", "total": 16 << 30, "used": 0, "util": None},
]


def test_nvml_gpus_are_read_through_the_c_api():
    library = FakeNvmlLibrary(TWO_GPUS)
    assert agent.Nvml(library).gpus() == [
        {
            "uuid": "GPU-aaaa",
            "name": "NVIDIA A100-SXM4-40GB",
            "index": 0,
            "memory_total": 40 << 30,
            "memory_used": 1 << 30,
            "util_percent": 37.0,
        },
        {
            "uuid": "GPU-bbbb",
            "name": "Tesla T4",
            "index": 1,
            "memory_total": 16 << 30,
            "memory_used": 0,
            "util_percent": None,  # the GPU does not sample utilisation: unknown, not an error
        },
    ]
    assert library.calls == ["init", "shutdown"]
    assert library.nvmlErrorString.restype is ctypes.c_char_p


def test_a_gpu_nvml_cannot_read_is_an_error_naming_it_and_nvml_is_shut_down():
    library = FakeNvmlLibrary(TWO_GPUS, fail={("handle", 1): 15})
    with pytest.raises(agent.NvmlError, match="GPU 1: GPU is lost"):
        agent.Nvml(library).gpus()
    assert library.calls == ["init", "shutdown"]


def test_a_gpu_nvml_cannot_read_leaves_the_rest_of_the_report(capsys):
    lost = agent.Nvml(FakeNvmlLibrary(TWO_GPUS, fail={("handle", 0): 15}))
    report = agent.Agent(agent.Engine(), lost, "here").collect()
    assert report["gpus"] is None and isinstance(report["sessions"], dict)
    assert "GPUs not read: GPU 0: GPU is lost" in capsys.readouterr().err


def test_a_node_without_the_nvidia_driver_has_no_nvml():
    # This machine has no NVIDIA driver: the library is not there, and that is not an error.
    assert agent.Nvml.load() is None


# -- a real engine, a real HTTP endpoint ---------------------------------------------------------


@pytest.fixture
def session_container(docker_engine):
    """A container labelled as a session of hub `deployment`, keeping a core partly busy."""
    run, session_id, deployment = secrets.token_hex(6), secrets.token_hex(16), secrets.token_hex(8)
    labels = {agent.SESSION_LABEL: session_id, agent.DEPLOYMENT_LABEL: deployment, TEST_LABEL: run}
    created = docker_engine.containers.run(
        IMAGE,
        ["python3", "-c", "import time\nx = bytearray(48 << 20)\nwhile True: sum(range(20000))"],
        detach=True,
        mem_limit="256m",
        labels=labels,
    )
    try:
        yield created, session_id, deployment
    finally:
        remove_containers({TEST_LABEL: run})


class Receiver(BaseHTTPRequestHandler):
    """Stands for the queue service: keeps the reports and answers with an order, signed with
    `key` (the node's key as the service holds it)."""

    reports: list = []
    headers_seen: list = []
    answer: dict = {}
    key = KEY

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.reports.append((self.path, json.loads(body), body))
        Receiver.headers_seen.append(dict(self.headers))
        data = json.dumps(Receiver.answer).encode()
        nonce = self.headers[agent.NONCE_HEADER]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header(agent.SIGNATURE_HEADER, agent.answer_signature(Receiver.key, nonce, data))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_the_agent_reports_a_real_session_containers_usage(docker_engine, session_container):
    created, session_id, deployment = session_container
    engine = agent.Engine("/var/run/docker.sock")
    node = engine.info()["Name"]
    assert node == docker_engine.info()["Name"]
    runner = agent.Agent(engine, nvml=None, node=node, deployment=deployment)
    first = runner.collect()
    assert list(first["sessions"]) == [session_id]  # other hubs' containers are not this agent's
    assert agent.Agent(engine, None, node, deployment="another-hub").collect()["sessions"] == {}

    def busy_report():
        report = runner.collect()
        usage = report["sessions"][session_id]
        return report if usage["cpu_percent"] and usage["mem_bytes"] >= 48 << 20 else None

    report = _poll(busy_report, 30, "a CPU figure and the 48 MiB the session holds")
    usage = report["sessions"][session_id]
    assert usage["container"] == created.id and usage["mem_limit_bytes"] == 256 << 20
    assert report["gpus"] is None and report["agent"]["rss_bytes"] > 0
    # This machine's engine keeps its default "icc" (on), and this test process runs without
    # no-new-privileges: the agent reads both as they are.
    bridge_options = docker_engine.networks.get("bridge").attrs["Options"]
    assert report["daemon"] == {
        "icc": bridge_options[agent.ICC_OPTION] == "true",
        "no_new_privileges": "NoNewPrivs:\t1" in Path("/proc/self/status").read_text(),
    }

    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        Receiver.answer = {"orders": [{"id": "o1", "kind": "commit", "session_id": "nope"}]}
        url = agent.report_url(f"http://127.0.0.1:{server.server_port}/services/queue/", node)
        answer = agent.post_report(url, "secret-token", KEY, NODE_ID, report)
        # An answer signed with another key (a forged one, or the node's rotated-away key) is
        # dropped with its orders.
        Receiver.key = "another" + KEY[7:]
        with pytest.raises(agent.UnsignedAnswer, match="not signed with this node's key"):
            agent.post_report(url, "secret-token", KEY, NODE_ID, report)
    finally:
        Receiver.key = KEY
        server.shutdown()
    path, received, body = Receiver.reports[-2]
    headers = Receiver.headers_seen[-2]
    assert path == f"/services/queue/api/nodes/{node}/report"
    assert headers["Authorization"] == "token secret-token"
    assert headers[agent.NODE_ID_HEADER] == NODE_ID
    assert headers[agent.SIGNATURE_HEADER] == agent.request_signature(
        KEY, "POST", path, NODE_ID, headers[agent.TIME_HEADER], headers[agent.NONCE_HEADER], body
    )
    assert parse_report(node, received).sessions[session_id].mem_bytes == usage["mem_bytes"]
    # The order it was given names no container here: its result says so in the next report.
    runner.run_orders(agent.orders_of(answer), wait=True)
    (result,) = runner.collect()["order_results"]
    assert result == {
        "id": "o1",
        "kind": "commit",
        "node": node,
        "ok": False,
        "error": "no such session container on this node",
    }


def test_a_commit_order_commits_the_session_container(docker_engine, session_container):
    created, session_id, _ = session_container
    engine = agent.Engine("/var/run/docker.sock")
    repository = f"fgpu-test/agent-commit-{secrets.token_hex(4)}"
    order = {"id": "o2", "kind": "commit", "session_id": session_id, "image": f"{repository}:t1"}
    order["labels"] = {private_images.LABEL_OWNER: "alice"}
    try:
        result = agent.run_order(engine, {**order, "push": False}, "here")
        assert result["ok"] is True, result
        image = docker_engine.images.get(f"{repository}:t1")
        assert image.id == result["image_id"]
        # The session's own labels are blanked, the owner's added, the image's command kept.
        assert image.labels[private_images.LABEL_OWNER] == "alice"
        assert image.labels[agent.SESSION_LABEL] == ""
        assert (
            image.attrs["Config"]["Cmd"] == docker_engine.images.get(IMAGE).attrs["Config"]["Cmd"]
        )
        assert created.reload() is None and created.status == "running"  # never paused
        # A push to no registry fails with the engine's message, in the result, not as a crash.
        failed = agent.run_order(engine, {**order, "image": f"127.0.0.1:1/{repository}:t1"}, "here")
        assert failed["ok"] is False and failed["error"], failed
    finally:
        for tag in (f"{repository}:t1", f"127.0.0.1:1/{repository}:t1"):
            with contextlib.suppress(docker.errors.ImageNotFound):
                docker_engine.images.remove(tag, force=True)


STATUS = "Name:\tpython3\nNoNewPrivs:\t{}\nSeccomp:\t2\n"


@pytest.mark.parametrize(
    ("options", "status", "daemon"),
    [
        ({agent.ICC_OPTION: "false"}, STATUS.format(1), {"icc": False, "no_new_privileges": True}),
        ({agent.ICC_OPTION: "true"}, STATUS.format(0), {"icc": True, "no_new_privileges": False}),
        # No default bridge, an option the engine leaves out, a kernel older than NoNewPrivs.
        (None, "Name:\tpython3\n", {"icc": None, "no_new_privileges": None}),
        ({}, STATUS.format(1), {"icc": None, "no_new_privileges": True}),
    ],
)
def test_the_daemons_isolation_settings_come_from_the_bridge_and_the_agents_own_status(
    options, status, daemon
):
    bridge = None if options is None else {"Name": "bridge", "Options": options}
    assert agent.daemon_settings(bridge, status) == daemon
    report = agent.build_report("node-1", "t", {}, None, daemon=daemon)
    assert parse_report("node-1", json.loads(json.dumps(report))).daemon == daemon


@pytest.fixture
def locked_registry(tmp_path):
    """A registry (Debian's docker-registry, as the lab runs it) on loopback that wants a login
    (htpasswd, bcrypt), and its credentials file's text."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # libxcrypt's bcrypt, as scripts/swarm-lab uses when htpasswd is missing

    password = secrets.token_hex(12)
    hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=32))
    (tmp_path / "htpasswd").write_text(f"fgpu-nodes:{hashed}\n")
    sock, port = bind_unused_port()
    sock.close()
    address = f"127.0.0.1:{port}"
    config = tmp_path / "registry.yml"
    config.write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {tmp_path / 'data'}\nauth:\n  htpasswd:\n    realm: test\n"
        f"    path: {tmp_path / 'htpasswd'}\nhttp:\n  addr: {address}\n"
    )
    process = subprocess.Popen(["docker-registry", "serve", str(config)])
    try:
        _poll(lambda: _answers(address), timeout=15, what=f"the registry on {address}")
        credentials = {"username": "fgpu-nodes", "password": password, "serveraddress": address}
        yield address, json.dumps(credentials)
    finally:
        process.terminate()
        process.wait(10)


def _answers(address: str) -> bool:
    try:
        urllib.request.urlopen(f"http://{address}/v2/", timeout=2)
    except urllib.error.HTTPError as e:
        return e.code == 401
    except OSError:
        return False
    return False


@pytest.mark.docker
def test_the_engine_pushes_and_pulls_with_the_header_and_not_without_it(
    docker_engine, locked_registry
):
    address, credentials = locked_registry
    pushed = f"{address}/fgpu-private/agent-{secrets.token_hex(3)}:t1"
    tiny_image(docker_engine, pushed)
    engine = agent.Engine("/var/run/docker.sock")
    digest = None
    try:
        with pytest.raises(agent.EngineError, match="no basic auth credentials"):
            engine.push(pushed.rsplit(":", 1)[0], "t1")
        header = agent.registry_auth_header(credentials)
        digest = engine.push(pushed.rsplit(":", 1)[0], "t1", registry_auth=header)
        assert digest.startswith("sha256:")
        # The engine's own default header, as main() sets it from the credentials file.
        logged_in = agent.Engine("/var/run/docker.sock", registry_auth=header)
        assert logged_in.push(pushed.rsplit(":", 1)[0], "t1") == digest

        # A pull order (a catalog image, ahead of its sessions) by digest, with the same login;
        # the node's next report lists the image's digest.
        by_digest = f"{pushed.rsplit(':', 1)[0]}@{digest}"
        docker_engine.images.remove(pushed, force=True)
        order = {"id": "p1", "kind": "pull", "image": by_digest}
        refused = agent.pull_order(engine, order, "here")
        assert refused["ok"] is False and "no basic auth credentials" in refused["error"]
        runner = agent.Agent(logged_in, nvml=None, node="here", deployment="none")
        runner.run_orders(agent.orders_of({"orders": [order]}), wait=True)
        report = runner.collect()
        assert report["order_results"] == [
            {"id": "p1", "kind": "pull", "node": "here", "image": by_digest, "ok": True}
        ]
        assert by_digest in report["images"]
        assert by_digest in parse_report("here", report).images
    finally:
        for reference in (pushed, f"{pushed.rsplit(':', 1)[0]}@{digest}" if digest else None):
            with contextlib.suppress(docker.errors.ImageNotFound):
                if reference:
                    docker_engine.images.remove(reference, force=True)


class BrokenEngine:
    """An engine whose socket answers garbage: http.client's own errors are not OSErrors."""

    def session_containers(self, deployment=None):
        import http.client

        raise http.client.BadStatusLine("garbage")


def test_an_order_whose_engine_call_fails_in_any_way_is_answered_and_may_run_again():
    runner = agent.Agent(BrokenEngine(), nvml=None, node="worker-1")
    order = {"id": "o1", "kind": "commit", "session_id": "s1", "image": "r/i:t"}
    runner.run_orders([order], wait=True)
    (result,) = runner.results
    assert result["ok"] is False and "garbage" in result["error"]
    assert runner.running_orders == set()  # given again, it runs again


def test_shell_orders_are_taken_only_whole():
    exec_order = {
        "kind": "exec",
        "token": "t1",
        "container": "c1",
        "session_id": "s1",
        "command": ["sh"],
        "tty": True,
        "env": {"TERM": "xterm"},
    }
    resize = {"kind": "exec_resize", "token": "t1", "width": 80, "height": 24}
    broken = [
        {**exec_order, "command": "sh"},
        {**exec_order, "command": []},
        {**exec_order, "env": {"TERM": 1}},
        {**exec_order, "tty": "yes"},
        {**exec_order, "token": None},
        {**resize, "width": 0},
        {**exec_order, "kind": "commit"},
    ]
    answer = {"orders": [exec_order, *broken, resize]}
    assert agent.exec_orders_of(answer) == [exec_order, resize]
    # Whatever the order, the process is the session user's, in its home.
    config = agent.exec_config({**exec_order, "User": "0"})
    assert (config["User"], config["WorkingDir"], config["Env"]) == (
        "1000",
        "/home/jovyan",
        ["TERM=xterm"],
    )


def test_an_exec_order_enters_only_this_hubs_running_session_and_never_during_a_commit(
    docker_engine, session_container
):
    created, session_id, deployment = session_container
    engine = agent.Engine("/var/run/docker.sock")
    runner = agent.Agent(engine, None, "n1", deployment)
    channel = agent.ExecChannel(runner, "http://127.0.0.1:9/services/queue/", "t", KEY, NODE_ID)
    order = {
        "kind": "exec",
        "token": "t1",
        "container": created.id,
        "session_id": session_id,
        "command": ["sh", "-c", 'read line; id -u; pwd; echo "$X $line"; exit 6'],
        "tty": False,
        "env": {"X": "given"},
    }
    exec_id, process, first = channel.start(order)
    with process:
        process.sendall(b"typed\n")
        process.shutdown(socket.SHUT_WR)
        stream = first
        while data := process.recv(65536):
            stream += data
    output = b"".join(payload for _, payload in Frames().feed(stream)).decode()
    assert output == "1000\n/home/jovyan\ngiven typed\n"
    assert engine.exec_exit_code(exec_id) == 6
    with pytest.raises(ValueError, match="no such session container"):
        channel.start({**order, "session_id": "another"})
    other_hub = agent.ExecChannel(agent.Agent(engine, None, "n1", "another-hub"), "", "", KEY, "")
    with pytest.raises(ValueError, match="no such session container"):
        other_hub.start(order)
    runner.committing.add(session_id)
    with pytest.raises(agent.SessionBusy, match="being saved"):
        channel.start(order)


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 200_000])
@pytest.mark.parametrize("mask", [None, b"\x01\x80\xfe\x7f"])
def test_websocket_frames_come_back_whole_however_the_bytes_are_split(size, mask):
    payload = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    stream = agent.websocket_frame(payload, agent.BINARY, mask) + agent.websocket_frame(
        b"", agent.CLOSE, mask
    )
    frames, found = agent.WebSocketFrames(), []
    for start in range(0, len(stream), 7001):
        found += frames.feed(stream[start : start + 7001])
    assert found == [(agent.BINARY, payload), (agent.CLOSE, b"")]


def test_a_websocket_frame_too_large_is_refused_and_the_handshake_is_rfc_6455s():
    with pytest.raises(ValueError, match="at most"):
        agent.WebSocketFrames().feed(bytes([0x82, 127]) + (agent.MAX_FRAME + 1).to_bytes(8, "big"))
    # RFC 6455, section 1.3's example.
    assert agent.websocket_accept("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def self_signed(folder: Path) -> ssl.SSLContext:
    """A TLS server context with a certificate of its own for 127.0.0.1 (openssl's command)."""
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


async def as_the_service(reader, writer, sent: bytes) -> bytes:
    """What the service does with the agent's connection: `sent` in frames, then its close
    frame; the process's bytes read from the agent's frames until its end."""

    async def send():
        for start in range(0, len(sent), 50_000):
            writer.write(agent.websocket_frame(sent[start : start + 50_000]))
            await writer.drain()
        writer.write(agent.websocket_frame(b"", agent.CLOSE))
        await writer.drain()

    sending, frames, received = asyncio.create_task(send()), agent.WebSocketFrames(), b""
    while data := await reader.read(65536):
        received += b"".join(p for op, p in frames.feed(data) if op == agent.BINARY)
    await sending
    return received


@pytest.mark.parametrize("tls", [False, True])
def test_a_pipe_carries_megabytes_both_ways_and_each_end_over_plain_or_tls(tls, tmp_path):
    """More than the pipe holds, both ways at once (a process that writes while it is written
    to), over TLS too, which one thread must read and write alone."""
    output, sent = secrets.token_bytes(3 << 20), secrets.token_bytes(3 << 20)
    process, process_end = socket.socketpair()
    seen_input = []

    def the_process():
        writing = threading.Thread(target=process_end.sendall, args=(output,))
        writing.start()
        seen_input.append(b"".join(iter(lambda: process_end.recv(65536), b"")))
        writing.join()
        process_end.shutdown(socket.SHUT_WR)  # the process's output ends

    async def run():
        done = asyncio.get_running_loop().create_future()

        async def serve(reader, writer):
            done.set_result(await as_the_service(reader, writer, sent))
            writer.close()

        server_tls = self_signed(tmp_path) if tls else None
        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_tls)
        port = server.sockets[0].getsockname()[1]

        def connect():  # the TLS handshake blocks: not on the server's loop
            back = socket.create_connection(("127.0.0.1", port))
            if not tls:
                return back
            client = ssl.create_default_context(cafile=tmp_path / "cert.pem")
            return client.wrap_socket(back, server_hostname="127.0.0.1")

        back = await asyncio.to_thread(connect)
        threading.Thread(target=the_process, daemon=True).start()
        piping = asyncio.to_thread(agent.Pipe(process, b"first", back, b"", False).run)
        await piping
        back.sendall(agent.websocket_frame(b"", agent.CLOSE, b"abcd"))
        back.close()
        received = await done
        server.close()
        return received

    received = asyncio.run(run())
    assert received == b"first" + output
    assert seen_input == [sent]  # whole, and then its end
