"""SSH into a session on a Swarm worker node (engine/swarm_exec.py), with Debian's OpenSSH client,
against a hub in Swarm mode on the run's lab (tests/swarm_lab.py).

The service cannot reach a worker's engine: the node's agent takes the shell's order on its long
poll, starts the process on its engine and connects back (engine/exec_rendezvous.py), here through
the hub's proxy (configurable-http-proxy) as in a site whose hub runs in a container. The shell
lands in the session's container on its node (its hostname, its GPU, its CPU and memory limits),
passes input and output both ways, with or without a terminal, and ends with the command's exit
code. A connection back that no shell waits for, a replayed one, or one without the node's
signature or the agents' hub token is refused.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from urllib.parse import urlsplit

import asyncssh
import pytest
import requests

from node_agent import agent
from queue_service.engine.node_agent_deploy import TOKEN_FILE
from queue_service.engine.node_credentials import CREDENTIALS_FILE, NodeCredentials

from . import test_ssh_hub
from .harness import QueueUser, free_port, running_hub
from .swarm_lab import Lab
from .test_ssh_forwarding import HTTP_PORT, forwarding, listening, relays_in, start_servers
from .test_ssh_hub import Client
from .test_swarm_hub import EXTRA_CONFIG, GPU_SESSION, session_container, session_of

pytestmark = [pytest.mark.docker, pytest.mark.hub]
askpass = test_ssh_hub.askpass  # the password script ssh reads (a fixture)

MIB = 1024 * 1024


#: The agents reach the service through the hub's proxy, which listens where the nodes reach it.
THROUGH_THE_PROXY = """
import os
c.SwarmEngine.node_agent_url = (
    f"http://{os.environ['FGPU_HUB_CONNECT_IP']}:{os.environ['FGPU_HUB_PORT']}/services/queue/"
)
"""


@pytest.fixture(scope="module")
def swarm_hub(lab: Lab, tmp_path_factory):
    env = {**lab.env, "FGPU_HUB_IP": "0.0.0.0", "FGPU_DEMO_LOGIN_ON_NETWORK": "1"}
    workdir = tmp_path_factory.mktemp("swarm-ssh-hub")
    with running_hub(workdir, EXTRA_CONFIG + THROUGH_THE_PROXY, env=env) as hub:
        hub.lab = lab
        yield hub
    manager = lab.manager()
    for service in manager.services.list(filters={"name": "fgpu-node-agent"}):
        service.remove()


@pytest.fixture(scope="module")
def sam(swarm_hub):
    """A student with a running default session (half a core, 512 MiB, a GPU) on a worker."""
    user = QueueUser(swarm_hub, "sam")
    response = swarm_hub.start_server(user.name, GPU_SESSION)
    assert response.status_code in (201, 202), response.text
    swarm_hub.wait_ready(user.name, timeout=180)
    user.token = user.http.headers["Authorization"].split()[1]
    record = session_of(QueueUser(swarm_hub, "admin"), user.name, "")
    user.node, user.session_id = record["grant"]["node"], record["id"]
    yield user
    swarm_hub.stop_servers({(user.name, "")})


def test_a_shell_reaches_the_session_on_its_worker_node_with_its_limits(swarm_hub, sam, askpass):
    # The agents were given the proxy's address: every shell below goes through it.
    agents = swarm_hub.lab.manager().services.list(filters={"label": "fgpu.role=node-agent"})
    env = {e for s in agents for e in s.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Env"]}
    proxy = f"{swarm_hub.env['FGPU_HUB_CONNECT_IP']}:{swarm_hub.env['FGPU_HUB_PORT']}"
    assert f"FGPU_AGENT_URL=http://{proxy}/services/queue/" in env
    client = Client(swarm_hub, askpass, sam.name, sam.token)
    container = session_container(swarm_hub.lab, sam.node, sam.session_id)
    where = client.ssh('echo "$(hostname) $FGPU_SESSION_ID $(id -u) $PWD"')
    assert where.returncode == 0, where.stderr
    assert where.stdout.split() == [
        container.attrs["Config"]["Hostname"],
        sam.session_id,
        "1000",
        "/home/jovyan",
    ]
    python = client.ssh("python3", "-c", "'import sys; print(6 * 7); sys.exit(5)'")
    assert (python.returncode, python.stdout) == (5, "42\n"), python.stderr
    smi = client.ssh("nvidia-smi")
    assert smi.returncode == 0, smi.stderr
    assert "GPU 0:" in smi.stdout, smi.stdout
    assert client.limits() == (0.5, 512 * MIB)


def test_input_output_and_a_terminal_go_both_ways(swarm_hub, sam, askpass):
    client = Client(swarm_hub, askpass, sam.name, sam.token)
    # The client's end of input ends the command's: cat returns, its output whole.
    lines = "".join(f"line {n}\n" for n in range(2000))
    cat = client.ssh("cat; echo done >&2; exit 3", stdin=lines)
    assert (cat.returncode, cat.stdout, cat.stderr) == (3, lines, "done\n")
    terminal = client.ssh("tty; stty size; exit 4", terminal=True)
    assert terminal.returncode == 4, terminal.stderr
    assert terminal.stdout.splitlines()[0].startswith("/dev/pts/"), terminal.stdout


async def shown(process, command: str, wanted: str) -> None:
    """Type `command` in the terminal until its output shows `wanted` (a new size reaches the
    node's engine an order later than the shell's start: the first answer may be the old one)."""
    seen = ""
    for _ in range(60):
        process.stdin.write(command)
        try:
            while wanted not in seen:
                seen += await asyncio.wait_for(process.stdout.read(4096), 1)
            return
        except TimeoutError:
            continue
    raise AssertionError(f"{wanted!r} never shown; the terminal said {seen[-500:]!r}")


def test_a_terminal_takes_the_clients_size_and_its_changes(swarm_hub, sam):
    async def run() -> int:
        port = int(swarm_hub.env["FGPU_SSH_PORT"])
        async with asyncssh.connect(
            "127.0.0.1", port, username=sam.name, password=sam.token, known_hosts=None,
            client_keys=None,
        ) as connection:  # fmt: skip
            process = await connection.create_process(term_type="xterm", term_size=(100, 30))
            await shown(process, "stty size\n", "30 100")
            process.change_terminal_size(120, 40)
            await shown(process, "stty size\n", "40 120")
            process.stdin.write("exit 2\n")
            return (await process.wait()).exit_status

    assert asyncio.run(run()) == 2


def test_a_file_put_by_sftp_is_in_the_session_on_its_node(swarm_hub, sam, askpass, tmp_path):
    # SFTP serves the home from the shared storage, as the session on its node mounts it.
    (tmp_path / "sent.txt").write_text("from sftp\n")
    client = Client(swarm_hub, askpass, sam.name, sam.token)
    put = client.sftp("put sent.txt\n", cwd=tmp_path)
    assert put.returncode == 0, put.stderr
    seen = client.ssh("cat sent.txt")
    assert (seen.returncode, seen.stdout) == (0, "from sftp\n"), seen.stderr


def test_ssh_without_a_command_reaches_an_interactive_shell_on_the_worker(swarm_hub, sam, askpass):
    """What a student gets from a bare `ssh`: a login shell on a terminal, interactive (it
    prompts), in the session's container on its node, ending with the exit code typed. How long
    it takes against `docker exec` on the node is benchmarks/ssh_swarm.py's."""
    client = Client(swarm_hub, askpass, sam.name, sam.token)
    container = session_container(swarm_hub.lab, sam.node, sam.session_id)
    shell = client.ssh(terminal=True, stdin='echo "at $(hostname) flags $- $(tty)"; exit 6\n')
    assert shell.returncode == 6, shell.stderr
    hostname = container.attrs["Config"]["Hostname"]
    # The answer, not the terminal's echo of what was typed (which shows `$(hostname)` as is).
    answer = re.search(rf"\bat {re.escape(hostname)} flags (\S+) (/dev/pts/\d+)", shell.stdout)
    assert answer, shell.stdout
    assert "i" in answer[1], shell.stdout  # an interactive shell, which prints its prompt


def test_a_local_forward_reaches_a_server_on_the_sessions_localhost_on_its_node(
    swarm_hub, sam, askpass
):
    """VS Code's path on a Swarm: the relay runs in the session on its worker, through the
    node's agent, as a shell does."""
    client = Client(swarm_hub, askpass, sam.name, sam.token)
    start_servers(client)
    port = free_port()
    with forwarding(client, "-L", f"{port}:127.0.0.1:{HTTP_PORT}") as ssh:
        listening(ssh, port)
        index = requests.get(f"http://127.0.0.1:{port}/index.html", timeout=60)
        assert index.text == f"hello from {sam.session_id}\n", index.text
    assert relays_in(client) == 0


def test_without_a_running_session_the_login_is_told_to_start_one(swarm_hub, askpass):
    user = QueueUser(swarm_hub, "tom")
    token = user.http.headers["Authorization"].split()[1]
    told = Client(swarm_hub, askpass, user.name, token).ssh("hostname")
    assert told.returncode == 1
    assert "tom has no running session on the default server" in told.stderr, told.stderr


def service_address(hub) -> tuple[str, int, str]:
    """Where the agents reach the queue service: host, port, and its path prefix."""
    url = urlsplit(f"http://{hub.env['FGPU_HUB_CONNECT_IP']}:{hub.env['FGPU_QUEUE_PORT']}")
    return url.hostname, url.port, "/services/queue/"


def connect_back(hub, node: str, token: str, headers: dict) -> str:
    """A connection back to the service for `token`, as an agent opens it: the refusal's status
    line and message (or the 101's)."""
    host, port, prefix = service_address(hub)
    path = f"{prefix}api/nodes/{node}/exec/{token}"
    handshake = {"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "13"}
    request = agent.upgrade_request(
        "GET", path, f"{host}:{port}", {**handshake, **headers(path)}, protocol="websocket"
    )
    with socket.create_connection((host, port), timeout=30) as sock:
        try:
            agent.upgraded(sock, request)
        except agent.UpgradeRefused as refused:
            return str(refused)
    return "101"


def test_a_connection_back_no_shell_waits_for_is_refused(swarm_hub, sam):
    credential = NodeCredentials(swarm_hub.workdir / CREDENTIALS_FILE).by_hostname(sam.node)
    agents_token = (swarm_hub.workdir / TOKEN_FILE).read_text().strip()
    token = "made-up-token-0123456789abcdef"

    def signed(now=None, nonce=None):
        def headers(path):
            return {
                "Authorization": f"token {agents_token}",
                **agent.signed_headers(
                    credential.key, credential.node_id, "GET", path, b"", now, nonce
                ),
            }

        return headers

    refused = connect_back(swarm_hub, sam.node, token, signed())
    assert refused.startswith("HTTP/1.1 403") and "No shell waits" in refused, refused
    # The same signed request again: its nonce is taken.
    again = signed(now=time.time(), nonce="a-nonce-used-once")
    assert "No shell waits" in connect_back(swarm_hub, sam.node, token, again)
    replayed = connect_back(swarm_hub, sam.node, token, again)
    assert replayed.startswith("HTTP/1.1 403") and "already taken" in replayed, replayed
    # Another node's name on this node's key; no signature; a student's token.
    other = next(node for node in swarm_hub.lab.nodes if node != sam.node)
    assert "cannot report for node" in connect_back(swarm_hub, other, token, signed())
    unsigned = connect_back(
        swarm_hub, sam.node, token, lambda path: {"Authorization": f"token {agents_token}"}
    )
    assert unsigned.startswith("HTTP/1.1 403") and "not signed" in unsigned, unsigned
    student = connect_back(
        swarm_hub,
        sam.node,
        token,
        lambda path: {**signed()(path), "Authorization": f"token {sam.token}"},
    )
    assert student.startswith("HTTP/1.1 403") and "node agents" in student, student
