"""Port forwarding through the hub's SSH service (queue_service/ssh/forwarding.py) with Debian's
OpenSSH client, as VS Code's Remote-SSH uses it: `ssh -T user@hub bash` with a script on its
input, then a SOCKS proxy (`ssh -D`) to a server on the session's own 127.0.0.1.

Every forward is opened from inside the login's session: `-L` and `-D` reach what listens on the
session's localhost (a small HTTP server started over SSH, as VS Code starts its own), not the
hub's; another session's address is as unreachable as from inside the session; a login without
a session, and `-R`, are refused with a reason, and no relay outlives its forward.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import socket
import subprocess
import time
from datetime import UTC, datetime

import asyncssh
import pytest
import requests

from queue_service.ssh.forwarding import MAX_FORWARDS

from .harness import QueueUser, free_port
from .test_ssh_hub import LAB, PASSWORD_ONLY, Client, ann, askpass, bob  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.docker, pytest.mark.hub]

MIB = 1024 * 1024
#: Where the session's test servers listen, inside the session (on 127.0.0.1).
HTTP_PORT = 8765
DIGEST_PORT = 8766
#: Where a session's HTTP server listens on every address.
OPEN_PORT = 8767
#: The session's own Jupyter server's port.
SERVER_PORT = 8888
#: Relays running in a session (the bracket keeps the probe's own command line out).
RELAYS = (
    "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -o '[c]reate_connection' | wc -l"
)
#: A server in the session that answers each connection with the SHA-256 of all it was sent,
#: once the sender has ended its side.
DIGEST_SERVER = (
    "import hashlib, socket\n"
    f"s = socket.create_server(('127.0.0.1', {DIGEST_PORT}))\n"
    "while True:\n"
    "    c, _ = s.accept()\n"
    "    h = hashlib.sha256()\n"
    "    try:\n"
    "        while d := c.recv(65536):\n"
    "            h.update(d)\n"
    "        c.sendall(h.hexdigest().encode())\n"
    "    except OSError:\n"
    "        pass\n"
    "    c.close()\n"
)


def start_servers(client: Client) -> None:
    """An HTTP server on the session's 127.0.0.1 (with an index and a 20 MiB file) and the digest
    server, started in the background over SSH as VS Code starts its server; back once both
    answer inside the session."""
    script = f"""
mkdir -p ~/www && cd ~/www && echo "hello from $FGPU_SESSION_ID" > index.html
head -c {20 * MIB} /dev/urandom > big.bin
nohup python3 -m http.server --bind 127.0.0.1 {HTTP_PORT} >/dev/null 2>&1 &
nohup python3 -c "$(cat ~/digest.py)" >/dev/null 2>&1 &
for i in $(seq 100); do
  python3 -c 'import socket; [socket.create_connection(("127.0.0.1", p)).close() for p in ({HTTP_PORT}, {DIGEST_PORT})]' 2>/dev/null && exit 0
  sleep 0.1
done
exit 1
"""
    put = client.ssh("cat > ~/digest.py", stdin=DIGEST_SERVER)
    assert put.returncode == 0, put.stderr
    started = client.ssh("bash", stdin=script)
    assert started.returncode == 0, started.stderr


@contextlib.contextmanager
def forwarding(client: Client, *options: str):
    """`ssh -N` with the forwarding `options`, running until the block ends; yields the process
    (its stderr holds the client's complaints)."""
    # (The first LogLevel counts: the client's word on a refused channel is at INFO.)
    argv = ["/usr/bin/ssh", "-N", "-o", "LogLevel=INFO", "-o", "ExitOnForwardFailure=yes"]
    argv += [*PASSWORD_ONLY, *options]
    argv += ["-p", client.port, f"{client.login}@127.0.0.1"]
    process = subprocess.Popen(
        argv, env=client.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def listening(process: subprocess.Popen, port: int) -> None:
    """Back once the client listens on `port` (after its login), or fails if it exited."""
    while process.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
            return
        time.sleep(0.1)
    pytest.fail(f"ssh exited {process.returncode}: {process.stderr.read()}")


def refusal(process: subprocess.Popen) -> str:
    """The client's line on a channel the hub refused."""
    for line in process.stderr:
        if "open failed" in line:
            return line
    return ""


def digest_through(port: int, data: bytes) -> str:
    """Sends `data` to the digest server through a forward on `port`, ends the sending side,
    and reads the answer."""
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while part := conn.recv(65536):
            answer += part
    return answer.decode()


def relays_in(client: Client) -> int:
    """The relays running in the session, once the ones ending have ended."""
    for _ in range(100):
        count = int(client.ssh(RELAYS).stdout)
        if count == 0:
            break
        time.sleep(0.1)
    return count


@pytest.fixture(scope="module")
def ann_servers(gpu_hub, ann, askpass):  # noqa: F811
    client = Client(gpu_hub, askpass, ann.name, ann.token)
    start_servers(client)
    return client


def test_vs_code_s_script_on_bash_s_input_runs_in_the_session(ann_servers, ann):  # noqa: F811
    """VS Code's first step: `ssh -T user@host bash`, its install script on the input."""
    script = 'echo "in $FGPU_SESSION_ID as $(id -un)"\nuname -s >&2\nexit 5\n'
    run = ann_servers.ssh("bash", stdin=script)
    (session,) = [s["id"] for s in ann.sessions() if s["status"] == "RUNNING"]
    assert (run.returncode, run.stdout, run.stderr) == (5, f"in {session} as jovyan\n", "Linux\n")


def test_a_local_forward_reaches_a_server_on_the_session_s_localhost(ann_servers):
    port, digest = free_port(), free_port()
    to_digest = f"{digest}:127.0.0.1:{DIGEST_PORT}"
    with forwarding(ann_servers, "-L", f"{port}:127.0.0.1:{HTTP_PORT}", "-L", to_digest) as ssh:
        listening(ssh, port)
        index = requests.get(f"http://127.0.0.1:{port}/index.html", timeout=60)
        assert index.text.startswith("hello from "), index.text
        big = requests.get(f"http://127.0.0.1:{port}/big.bin", timeout=120).content
        kept = ann_servers.ssh("sha256sum ~/www/big.bin").stdout.split()[0]
        assert (len(big), hashlib.sha256(big).hexdigest()) == (20 * MIB, kept)
        # The other way, to the end of the client's input: the server answers after it.
        data = secrets.token_bytes(8 * MIB)
        assert digest_through(digest, data) == hashlib.sha256(data).hexdigest()
    assert relays_in(ann_servers) == 0


def test_a_socks_proxy_reaches_the_session_s_localhost_as_vs_code_does(ann_servers):
    port = free_port()
    with forwarding(ann_servers, "-D", f"127.0.0.1:{port}") as ssh:
        listening(ssh, port)
        for host in ("127.0.0.1", "localhost"):  # names are looked up in the session
            curl = subprocess.run(
                ["curl", "-sS", "--socks5-hostname", f"127.0.0.1:{port}",
                 f"http://{host}:{HTTP_PORT}/index.html"],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert curl.returncode == 0 and curl.stdout.startswith("hello from "), curl.stderr
        # Several at once, as VS Code opens them.
        many = [
            subprocess.Popen(
                [
                    "curl",
                    "-sS",
                    "--socks5-hostname",
                    f"127.0.0.1:{port}",
                    f"http://127.0.0.1:{HTTP_PORT}/big.bin",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )  # fmt: skip
            for _ in range(4)
        ]
        sizes = [len(p.communicate(timeout=300)[0]) for p in many]
        assert sizes == [20 * MIB] * 4
    assert relays_in(ann_servers) == 0


def test_the_hub_s_own_ports_are_not_reached_the_session_s_localhost_is(gpu_hub, ann_servers):
    """127.0.0.1 is the session's: the SSH service's own port, open on the hub's 127.0.0.1, is
    closed there; a port nothing listens on says so, and leaves no relay behind."""
    port = free_port()
    hub_ssh = gpu_hub.env["FGPU_SSH_PORT"]
    with forwarding(ann_servers, "-L", f"{port}:127.0.0.1:{hub_ssh}") as ssh:
        listening(ssh, port)
        with socket.create_connection(("127.0.0.1", port)) as conn:
            assert conn.recv(100) == b""  # no SSH banner: closed at once
        said = refusal(ssh)
    assert "open failed: connect failed: Connection refused" in said, said
    assert relays_in(ann_servers) == 0


def test_another_session_is_not_reached(gpu_hub, ann_servers, askpass):  # noqa: F811
    dora = QueueUser(gpu_hub, f"dora-{secrets.token_hex(3)}")
    response = gpu_hub.start_server(dora.name, LAB)
    assert response.status_code in (201, 202), response.text
    gpu_hub.wait_ready(dora.name)
    token = dora.http.headers["Authorization"].split()[1]
    own = Client(gpu_hub, askpass, dora.name, token)
    start_servers(own)
    started = own.ssh(
        "bash",
        stdin=f"""
cd ~/www && nohup python3 -m http.server --bind 0.0.0.0 {OPEN_PORT} >/dev/null 2>&1 &
for i in $(seq 100); do
  python3 -c 'import socket; socket.create_connection(("127.0.0.1", {OPEN_PORT}))' 2>/dev/null && exit 0
  sleep 0.1
done
exit 1
""",
    )
    assert started.returncode == 0, started.stderr
    address = own.ssh(
        "python3 -c 'import socket; print(socket.gethostbyname(socket.gethostname()))'"
    ).stdout.strip()
    port = free_port()
    # Dora reaches her server on her own address; ann, from her session, does not.
    with forwarding(own, "-L", f"{port}:{address}:{OPEN_PORT}") as ssh:
        listening(ssh, port)
        assert requests.get(f"http://127.0.0.1:{port}/index.html", timeout=60).ok
    with forwarding(ann_servers, "-L", f"{port}:{address}:{OPEN_PORT}") as ssh:
        listening(ssh, port)
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{port}/index.html", timeout=120)
        said = refusal(ssh)
    assert "open failed: connect failed" in said, said
    assert relays_in(ann_servers) == 0
    gpu_hub.stop_server(dora.name)


def test_without_a_session_a_forward_is_refused_with_the_reason(gpu_hub, bob, askpass):  # noqa: F811
    client = Client(gpu_hub, askpass, bob.name, bob.token)
    port = free_port()
    with forwarding(client, "-L", f"{port}:127.0.0.1:{HTTP_PORT}") as ssh:
        listening(ssh, port)
        with socket.create_connection(("127.0.0.1", port)) as conn:
            assert conn.recv(100) == b""
        said = refusal(ssh)
    assert f"open failed: administratively prohibited: {bob.name} has no running session" in said
    assert gpu_hub.server_model(bob.name) is None  # nothing started behind his back


def test_remote_forwarding_is_refused(ann_servers):
    with forwarding(ann_servers, "-R", f"{free_port()}:127.0.0.1:22") as ssh:
        assert ssh.wait(timeout=120) == 255
        said = ssh.stderr.read()
    assert "remote port forwarding failed" in said, said


def last_activity(hub, user: str, server: str) -> datetime:
    model = hub.request("GET", f"users/{user}").json()["servers"][server]
    return datetime.fromisoformat(model["last_activity"].replace("Z", "+00:00"))


def test_use_over_ssh_counts_as_the_session_s_activity(gpu_hub, askpass):  # noqa: F811
    """The idle culler reads the hub's last activity: a student working only in VS Code (through
    forwards) or in an ssh shell keeps the session in use, as in JupyterLab. (One server each:
    a server is reported at most once a minute.)"""
    eve = QueueUser(gpu_hub, f"eve-{secrets.token_hex(3)}")
    for server in ("", "lab"):
        response = gpu_hub.start_server(eve.name, LAB, server=server)
        assert response.status_code in (201, 202), response.text
        gpu_hub.wait_ready(eve.name, server)
    token = eve.http.headers["Authorization"].split()[1]
    mark = datetime.now(UTC)
    assert max(last_activity(gpu_hub, eve.name, s) for s in ("", "lab")) < mark
    typed = Client(gpu_hub, askpass, eve.name, token).ssh("cat", stdin="typing\n")
    assert typed.stdout == "typing\n"
    # Bytes through a forward to the session's own server port (which answers them with an
    # error: a request it never takes counts as no activity of its own).
    port = free_port()
    lab = Client(gpu_hub, askpass, f"{eve.name}-lab", token)
    with forwarding(lab, "-L", f"{port}:127.0.0.1:{SERVER_PORT}") as ssh:
        listening(ssh, port)
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(b"not http\r\n\r\n")
            assert conn.recv(100).startswith(b"HTTP/1.1 400")
    for server in ("", "lab"):
        for _ in range(300):  # the report goes once the bytes have
            if last_activity(gpu_hub, eve.name, server) >= mark:
                break
            time.sleep(0.1)
        assert last_activity(gpu_hub, eve.name, server) >= mark, server
    gpu_hub.stop_servers({(eve.name, ""), (eve.name, "lab")})


def test_one_connection_holds_a_bounded_number_of_forwards(gpu_hub, ann, ann_servers):  # noqa: F811
    """Each forward is a process in the session and an exec on the engine: past the bound a
    channel is refused with the reason (asyncssh's client, which opens channels as it is told),
    room comes back as one closes, and none outlives its connection."""

    async def hold_open() -> tuple[int, str, bool]:
        async with asyncssh.connect(
            "127.0.0.1", int(gpu_hub.env["FGPU_SSH_PORT"]), username=ann.name,
            password=ann.token, known_hosts=None, client_keys=None,
        ) as connection:  # fmt: skip
            held, refusal = [], ""
            try:
                for _ in range(MAX_FORWARDS + 1):
                    held.append(await connection.open_connection("127.0.0.1", HTTP_PORT))
            except asyncssh.ChannelOpenError as e:
                refusal = e.reason
            _, writer = held.pop()
            writer.close()
            await writer.channel.wait_closed()
            reader, writer = await connection.open_connection("127.0.0.1", HTTP_PORT)
            writer.write(b"GET /index.html HTTP/1.0\r\n\r\n")
            answered = (await reader.read()).startswith(b"HTTP/1.0 200")
            return len(held) + 1, refusal, answered

    held, refusal, answered = asyncio.run(hold_open())
    assert (held, refusal) == (MAX_FORWARDS, f"At most {MAX_FORWARDS} forwards at once.")
    assert answered  # room again once one closed
    assert relays_in(ann_servers) == 0


def test_a_client_that_leaves_while_a_forward_opens_leaves_no_relay(gpu_hub, ann, ann_servers):  # noqa: F811
    """The relay connects to a server that keeps an idle connection open (the HTTP server);
    the client is gone by then, so the channel is never confirmed: the relay ends too."""

    async def leave_at_once() -> None:
        connection = await asyncssh.connect(
            "127.0.0.1", int(gpu_hub.env["FGPU_SSH_PORT"]), username=ann.name,
            password=ann.token, known_hosts=None, client_keys=None,
        )  # fmt: skip
        opening = asyncio.ensure_future(connection.open_connection("127.0.0.1", HTTP_PORT))
        await asyncio.sleep(0.05)  # the request is on its way; the relay takes longer to start
        connection.abort()
        with contextlib.suppress(Exception):
            await opening

    asyncio.run(leave_at_once())
    assert relays_in(ann_servers) == 0
