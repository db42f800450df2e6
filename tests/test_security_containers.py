"""A session container is hardened. Checked inside real sessions of a real hub.

Threat model: a student with a terminal in their session tries to become root, to reach another
student's server, to fill the engine's disk, or to shed their GPU limits.
"""

from __future__ import annotations

import os
import re
import secrets

import pytest
import requests

from fgpu_spawner.container_spec import (
    ContainerContext,
    build_container_spec,
    mount_options_of,
    writable_layer_support,
)
from fgpu_spawner.gpu_sharing import GpuPaths
from fgpu_spawner.grant import Grant
from fgpu_spawner.network import ICC_OPTION
from fgpu_spawner.request import ResourceRequest
from fgpu_spawner.spawner import FGPUSpawner

from .harness import containers_with, running_hub

pytestmark = [pytest.mark.docker, pytest.mark.hub]

IMAGE = "python-3.11"
SERVER_PORT = 8888
# Where a Debian image keeps programs; the s-bits are stripped from the whole root filesystem.
BIN_DIRS = "/bin /sbin /usr/bin /usr/sbin /usr/local/bin /usr/local/sbin /usr/lib /opt/venv/bin"
HOST_LIBRARIES = ("/lib/x86_64-linux-gnu/libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1")


def start(hub, user: str):
    response = hub.start_server(user, {"image": IMAGE, "cpu": 0.5, "mem": "512M"})
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(user)
    (container,) = containers_with({"fgpu.user": user})
    return container


@pytest.fixture(scope="module")
def two_sessions(hub):
    """Two students' running sessions, A and B."""
    users = [f"student-{secrets.token_hex(4)}" for _ in range(2)]
    containers = [start(hub, user) for user in users]
    yield list(zip(users, containers, strict=True))
    hub.stop_servers({(user, "") for user in users})


def run(container, *command: str, user: str = "") -> tuple[int, str]:
    result = container.exec_run(list(command), user=user)
    return result.exit_code, result.output.decode(errors="replace").strip()


def server_status(container) -> dict[str, str]:
    """/proc/<pid>/status of the container's jupyterhub-singleuser process, as a dict."""
    script = (
        "import os\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    cmd = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
        "    if any(part.endswith(b'jupyterhub-singleuser') for part in cmd[:2]):\n"
        "        print(open(f'/proc/{pid}/status').read()); break\n"
    )
    code, output = run(container, "python3", "-c", script)
    assert code == 0 and output, output
    return dict(line.split(":\t", 1) for line in output.splitlines() if ":\t" in line)


def ip_on_session_network(container) -> str:
    container.reload()
    (network,) = container.attrs["NetworkSettings"]["Networks"].values()
    return network["IPAddress"]


def test_the_server_process_holds_no_capability_and_no_new_privileges(two_sessions):
    _, container = two_sessions[0]
    status = server_status(container)
    assert status["Uid"].split()[0] == "1000"
    assert int(status["CapEff"], 16) == 0
    assert int(status["CapPrm"], 16) == 0
    # Empty bounding set: not even `docker exec -u root` gets a capability back.
    assert int(status["CapBnd"], 16) == 0
    assert status["NoNewPrivs"].strip() == "1"
    host = container.attrs["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert "no-new-privileges" in host["SecurityOpt"]


def test_there_is_no_sudo_and_su_does_not_make_root(two_sessions):
    _, container = two_sessions[0]
    code, output = run(container, "sh", "-c", "command -v sudo")
    assert code != 0, f"sudo is in the image: {output}"
    code, output = run(container, "sh", "-c", "su -c 'id -u' root </dev/null")
    assert code != 0 and output != "0", output


def test_no_setuid_or_setgid_programs_in_the_image(two_sessions):
    _, container = two_sessions[0]
    code, output = run(
        container, "sh", "-c", f"find {BIN_DIRS} -xdev -type f -perm /6000 2>/dev/null; true"
    )
    assert code == 0
    assert output == "", f"programs with s-bits: {output}"


def test_sessions_cannot_reach_each_other_while_host_and_hub_reach_both(hub, two_sessions):
    (user_a, session_a), (user_b, session_b) = two_sessions
    ip_b = ip_on_session_network(session_b)
    connect = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(({ip_b!r}, {SERVER_PORT}), timeout=5)\n"
        "except OSError as e:\n"
        "    print(type(e).__name__); sys.exit(1)\n"
        "print('connected')\n"
    )
    code, output = run(session_a, "python3", "-c", connect)
    assert code == 1, f"session A reached session B's server: {output}"
    # B's server does listen there: the host (where the proxy runs) reaches it directly...
    direct = requests.get(f"http://{ip_b}:{SERVER_PORT}/user/{user_b}/api", timeout=10)
    assert direct.status_code == 200, direct.text
    # ...and through the proxy, both servers answer.
    for user in (user_a, user_b):
        headers = {"Authorization": f"token {hub.user_token(user)}"}
        status = requests.get(f"{hub.url}/user/{user}/api/status", headers=headers, timeout=30)
        assert status.status_code == 200, status.text
    # Sessions still reach the hub's API, on the session network's gateway.
    code, output = run(
        session_a,
        "python3",
        "-c",
        "import os, urllib.request; "
        "print(urllib.request.urlopen(os.environ['JUPYTERHUB_API_URL'], timeout=10).status)",
    )
    assert (code, output) == (0, "200"), output


def connects(container, host: str, port: int) -> bool:
    script = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(({host!r}, {port}), timeout=3).close()\n"
        "except OSError:\n"
        "    sys.exit(1)\n"
    )
    return run(container, "python3", "-c", script)[0] == 0


def test_a_session_reaches_the_hubs_api_and_no_other_port_of_the_hub(hub, two_sessions):
    """Of the hub's own listeners on this host, a session reaches the hub's API alone (on the
    session network's gateway), where every call needs a token: not the proxy's public or API
    port, not the queue service, not PostgreSQL nor a Docker API port (the security guide's
    table, docs/source/explanation/security.md)."""
    _, session = two_sessions[0]
    session.reload()
    (network,) = session.attrs["NetworkSettings"]["Networks"].values()
    gateway = network["Gateway"]
    config = (hub.workdir / "test_config.py").read_text()
    hub_port = int(re.search(r"c.JupyterHub.hub_port = (\d+)", config).group(1))
    proxy_api = int(re.search(r'api_url = "http://127.0.0.1:(\d+)"', config).group(1))
    assert connects(session, gateway, hub_port), "the session no longer reaches the hub's API"
    others = {
        "the proxy": int(hub.url.rsplit(":", 1)[1]),
        "the proxy's API": proxy_api,
        "the queue service": int(hub.env["FGPU_QUEUE_PORT"]),
        "PostgreSQL": 5432,
        "a Docker API": 2375,
        "a Docker TLS API": 2376,
    }
    reached = [name for name, port in others.items() if connects(session, gateway, port)]
    assert reached == [], f"a session reaches {reached} on {gateway}"


def test_sessions_run_on_the_isolated_network(docker_engine, two_sessions):
    _, container = two_sessions[0]
    network_id = container.attrs["HostConfig"]["NetworkMode"]
    network = docker_engine.api.inspect_network(network_id)
    assert network["Name"] == FGPUSpawner.network_name.default_value
    assert network["Options"][ICC_OPTION] == "false"


def test_the_writable_layer_is_bounded_or_the_admin_is_warned(hub, docker_engine, two_sessions):
    """Here overlay2 sits on a filesystem without project quotas: no limit, and a warning."""
    _, container = two_sessions[0]
    info = docker_engine.info()
    with open("/proc/mounts") as mounts:
        options = mount_options_of(info["DockerRootDir"], mounts.read())
    support = writable_layer_support(info["Driver"], info["DriverStatus"], options)
    storage = container.attrs["HostConfig"].get("StorageOpt") or {}
    if support.supported:
        assert storage.get("size") == str(FGPUSpawner.writable_layer_size.default_value)
    else:
        assert "size" not in storage
        log = hub.log_text()
        assert "writable layers are NOT limited" in log
        assert support.reason in log


# --- HAMi-core through /etc/ld.so.preload, on the real engine (no GPU: the mounts alone) ----------


def test_the_preloaded_library_loads_without_ld_preload_and_cannot_be_changed(
    tmp_path, docker_engine
):
    """A stand-in for libvgpu.so (a library of the host, which is Debian bookworm like the image)
    at HAMi-core's path: every process of the session loads it, LD_PRELOAD unset, and the session
    user cannot rewrite the preload file."""
    library = next(path for path in HOST_LIBRARIES if os.path.exists(path))
    # HAMi-core's shrreg-tool, which starts every hami session, stands in as a no-op.
    tool = tmp_path / "shrreg-tool"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    paths = GpuPaths(
        hami_library_path=library,
        hami_cache_base=str(tmp_path / "cache"),
        hami_lock_dir=str(tmp_path / "lock"),
        hami_preload_path=str(tmp_path / "ld.so.preload"),
        hami_shrreg_tool_path=str(tool),
    )
    FGPUSpawner(hami_preload_path=paths.hami_preload_path).write_hami_preload_file()
    grant = Grant(f"sess-{secrets.token_hex(4)}", "local", {"GPU-a": 0.5})
    request = ResourceRequest(IMAGE, "fgpu/jupyter-base:py3.11", cpu=0.5, mem=2**29, fgpu=0.5)
    ctx = ContainerContext(
        name=f"fgpu-test-preload-{secrets.token_hex(4)}",
        user="nobody",
        server_name="",
        command=[
            "sh",
            "-c",
            "env -u LD_PRELOAD grep -c /usr/local/vgpu/libvgpu.so /proc/self/maps; "
            "echo /tmp/mine.so > /etc/ld.so.preload && echo rewritten",
        ],
        env={},
        port=SERVER_PORT,
        network="none",
        gpu_sharing="hami",
        gpu_memory={"GPU-a": 2**34},
        gpu_paths=paths,
    )
    spec = build_container_spec(request, grant, ctx)
    # No GPU here: everything but the device request. No fgpu labels: no hub's reconciler may
    # take this container for a session.
    host_config = {k: v for k, v in spec.host_config.items() if k != "device_requests"}
    create_kwargs = {**spec.create_kwargs, "labels": {}}
    api = docker_engine.api
    created = api.create_container(
        **create_kwargs, host_config=api.create_host_config(**host_config)
    )
    try:
        api.start(created)
        assert api.wait(created, timeout=60)["StatusCode"] != 0
        # Apart: the engine may log the two streams out of order.
        output = api.logs(created, stderr=False).decode(errors="replace")
        errors = api.logs(created, stdout=False).decode(errors="replace")
    finally:
        api.remove_container(created, force=True)
    assert int(output.splitlines()[0]) >= 1, output
    assert "rewritten" not in output
    assert "Read-only file system" in errors or "Permission denied" in errors, errors


# --- the engine refuses a container (a full disk, a setting it cannot apply) ----------------------


def test_an_engine_refusal_fails_the_spawn_with_the_engines_words(tmp_path, username):
    """What a full disk does to a spawn, with a refusal this engine gives for sure: CPUs it does
    not have. The user sees why, the admin's log says it, and nothing stays behind."""
    extra = 'c.FGPUSpawner.extra_host_config = {"cpuset_cpus": "4095"}\n'
    with running_hub(tmp_path / "hub", extra_config=extra) as refusing:
        response = refusing.start_server(username, {"image": IMAGE, "cpu": 0.5})
        assert response.status_code == 500, response.text
        message = response.json()["message"]
        assert "The Docker engine could not create the session container" in message
        assert "4095" in message, message
        assert "The engine could not create" in refusing.log_text()
        assert refusing.server_model(username) is None
        assert containers_with({"fgpu.user": username}) == []
