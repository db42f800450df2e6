"""A real JupyterHub in a subprocess, on free ports, driven through its REST API.

Shared by the tests and the benchmarks so that both measure the same hub. The hub loads the shipped
`jupyterhub_config.py` and changes only ports, an admin token, and what a caller adds.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import docker
import requests
import websocket

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
TEST_LABEL = "fgpu.test_run"


_handed_out: set[int] = set()
#: scripts/test runs two pytest processes side by side; each takes ports of one parity, so that
#: neither hands out a port the other has just handed out (and not yet bound).
_PARITY = {"even": 0, "odd": 1}.get(os.environ.get("FGPU_TEST_PORTS", ""))


def free_port() -> int:
    """A port nothing listens on, and never one this process handed out before: a hub's own
    port, its proxy's API and its queue service each get one before any of them binds, and
    the kernel may offer a just-closed port again (the queue service once answered on the
    hub's port, whose 404 failed a launch)."""
    while True:
        port = _bindable_port()
        if port is not None and port not in _handed_out:
            _handed_out.add(port)
            return port


#: Where test servers listen: below Linux's ephemeral range (ip_local_port_range, 32768–60999),
#: whose ports outgoing connections take. A hub on the session network's gateway once could not
#: bind a port that a connection from that gateway to a session held.
PORTS = range(20000, 32768)


def _bindable_port() -> int | None:
    """A port of this process's parity (the two halves of a run never pick the same one) that
    nothing is bound to on any address, or None to try again."""
    port = random.choice(PORTS)
    if _PARITY is not None and port % 2 != _PARITY:
        port = port + 1 if port + 1 in PORTS else port - 1
    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return None
    return port


def docker_client() -> docker.DockerClient:
    """The engine, or a failure that says so: a test that needs Docker never skips."""
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as e:
        raise RuntimeError(f"No Docker engine answers ({e}); run scripts/up --setup-only") from e
    return client


class Hub:
    """A running hub and an admin session on its REST API."""

    def __init__(
        self, workdir: Path, port: int, token: str, run_id: str, process: subprocess.Popen
    ):
        self.workdir = workdir
        self.url = f"http://127.0.0.1:{port}"
        self.run_id = run_id
        self.process = process
        self.api = requests.Session()
        self.api.headers["Authorization"] = f"token {token}"

    def request(self, method: str, path: str, **kwargs) -> requests.Response:
        return self.api.request(
            method, f"{self.url}/hub/api/{path.lstrip('/')}", timeout=120, **kwargs
        )

    def create_user(self, name: str) -> None:
        response = self.request("POST", f"users/{name}")
        assert response.status_code in (201, 409), response.text

    def user_token(self, name: str) -> str:
        response = self.request("POST", f"users/{name}/tokens", json={"note": "test"})
        assert response.status_code == 201, response.text
        return response.json()["token"]

    def start_server(self, user: str, options: dict, server: str = "") -> requests.Response:
        self.create_user(user)
        return self.request("POST", f"users/{user}/servers/{server}", json=options)

    def server_model(self, user: str, server: str = "") -> dict | None:
        response = self.request("GET", f"users/{user}")
        assert response.status_code == 200, response.text
        return response.json()["servers"].get(server)

    def active_servers(self) -> set[tuple[str, str]]:
        """(user, server name) of every server that runs, or is starting or waiting in the queue."""
        response = self.request("GET", "users", params={"state": "active", "limit": 1000})
        assert response.status_code == 200, response.text
        return {(user["name"], name) for user in response.json() for name in user["servers"]}

    def wait_ready(self, user: str, server: str = "", timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = self.server_model(user, server)
            if model and model["ready"]:
                return model
            if model is None:
                raise AssertionError(f"{user}'s server {server!r} stopped while starting")
            time.sleep(0.2)
        raise AssertionError(f"{user}'s server {server!r} not ready in {timeout} s")

    def stop_server(self, user: str, server: str = "", timeout: float = 60) -> None:
        self.stop_servers({(user, server)}, timeout)

    def stop_servers(
        self, servers: set[tuple[str, str]], timeout: float = 60, request_timeout: float = 120
    ) -> None:
        """Stop each (user, server name) and wait until the hub has let them all go. The hub
        answers a stop once it is done (a second or two), so the stops are asked for together,
        each on a connection of its own, and take about as long as one."""
        targets = sorted(servers)
        if not targets:
            return
        with ThreadPoolExecutor(max_workers=min(len(targets), 20)) as pool:
            answers = list(pool.map(lambda t: self._ask_to_stop(t, request_timeout), targets))
        for response in answers:
            assert response.status_code in (202, 204), response.text
        wait_until(
            lambda: all(self.server_model(user, server) is None for user, server in targets),
            timeout,
            f"the hub to let go of {targets}",
        )

    def _ask_to_stop(self, target: tuple[str, str], timeout: float) -> requests.Response:
        user, server = target
        url = f"{self.url}/hub/api/users/{user}/servers/{server}"
        return requests.delete(url, headers=dict(self.api.headers), timeout=timeout)

    def join_group(self, user: str, properties: dict) -> str:
        """A new hub group with these properties (quotas, lifetimes, idle policies), `user` its
        one member; its name."""
        group = f"course-{secrets.token_hex(3)}"
        assert self.request("POST", f"groups/{group}").status_code == 201
        response = self.request("PUT", f"groups/{group}/properties", json=properties)
        assert response.status_code == 200, response.text
        members = {"users": [user]}
        assert self.request("POST", f"groups/{group}/users", json=members).status_code == 200
        return group

    def log_text(self) -> str:
        return (self.workdir / "hub.log").read_text(errors="replace")

    def stored_times(self, session_id: str) -> dict[str, float | None]:
        """A session's `scheduled_at` and `ended` as its queue service's SQLite DB holds them
        (epoch seconds, None when not yet)."""
        with contextlib.closing(sqlite3.connect(self.workdir / "fgpu_queue.sqlite")) as db:
            row = db.execute(
                "SELECT scheduled_at, ended FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
        return {
            key: datetime.fromisoformat(value).timestamp() if value else None
            for key, value in zip(("scheduled_at", "ended"), row, strict=True)
        }


class QueueUser:
    """A hub user with a token of their own, calling the queue service through the hub's proxy."""

    def __init__(self, hub: Hub, name: str):
        hub.create_user(name)
        self.hub, self.name = hub, name
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"token {hub.user_token(name)}"

    def call(self, method: str, path: str, **kwargs) -> requests.Response:
        url = f"{self.hub.url}/services/queue/api/{path}"
        return self.http.request(method, url, timeout=120, **kwargs)

    def sessions(self) -> list[dict]:
        response = self.call("GET", "sessions")
        assert response.status_code == 200, response.text
        return response.json()["sessions"]

    def end_all(self) -> None:
        """Stop or cancel every live session and job of this user: a test on a shared hub
        leaves its capacity as it found it."""
        for session in self.sessions():
            response = self.call("DELETE", f"sessions/{session['id']}")
            assert response.status_code in (200, 404), response.text

    def wait_for(self, predicate, timeout: float = 90) -> list[dict]:
        """The user's sessions, once `predicate` holds for them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sessions = self.sessions()
            if predicate(sessions):
                return sessions
            time.sleep(0.3)
        raise AssertionError(f"not reached in {timeout} s: {json.dumps(self.sessions(), indent=1)}")


def logged_in(hub, name: str) -> requests.Session:
    """A browser-like session: the hub's pages take the login cookie, not API tokens."""
    browser = requests.Session()
    browser.get(f"{hub.url}/hub/login", timeout=60)
    response = browser.post(
        f"{hub.url}/hub/login",
        data={"username": name, "password": "", "_xsrf": browser.cookies.get("_xsrf")},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return browser


def hub_xsrf(browser: requests.Session) -> str:
    """The hub's own XSRF cookie (path /hub/). A login lands on the queue's Sessions page
    (fgpu_spawner/landing.py), whose service sets an `_xsrf` cookie of its own at its path."""
    return browser.cookies.get("_xsrf", path="/hub/")


def _config_text(port: int, token: str, run_id: str, spawner_token: str, extra_config: str) -> str:
    return textwrap.dedent(
        f"""
        load_subconfig({str(ROOT / "jupyterhub_config.py")!r})
        for service in c.JupyterHub.services:
            if service["name"] == "fgpu-spawner":
                service["api_token"] = {spawner_token!r}
        c.FGPUSpawner.queue_token = {spawner_token!r}
        c.JupyterHub.hub_port = {free_port()}
        c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
        c.JupyterHub.services.append({{"name": "test-admin", "api_token": {token!r}}})
        c.JupyterHub.load_roles.append({{"name": "admin", "services": ["test-admin"]}})
        c.DockerSpawner.extra_create_kwargs = {{"labels": {{{TEST_LABEL!r}: {run_id!r}}}}}
        c.JupyterHub.log_level = "DEBUG"
        # Swarm hubs: the nodes pull ahead only the base image (which they hold already, for
        # their agents), not a few GB of framework images into the lab's tmpfs at every run.
        c.SwarmEngine.prepull_names = ["python-3.11"]
        """
    ) + textwrap.dedent(extra_config)


def refused_start(workdir: Path, extra_config: str = "", env: dict | None = None) -> str:
    """The end of the log of a hub that must not start with this config: it exits at its
    start, and the log says why."""
    try:
        with running_hub(workdir, extra_config, env=env):
            pass
    except RuntimeError as e:
        assert "the hub exited" in str(e), e
        return str(e)
    raise AssertionError("the hub started")


def queue_option(trait: str, value, section: str = "QueueService") -> str:
    """Hub config that sets the queue service's `trait` to `value` (or its engine backend's,
    with `section` DockerEngine), as a site does."""
    return f"\nc.{section}.{trait} = {value!r}\n"


def wait_until(predicate, timeout: float, what: str, interval: float = 0.2):
    """`predicate()`'s first true value, polled every `interval` seconds; a failure naming
    `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"not within {timeout:g} s: {what}")


@contextmanager
def running_hub(
    workdir: Path,
    extra_config: str = "",
    env: dict | None = None,
    ignore_sigint: bool = False,
    launcher: tuple[str, ...] = (),
    url: str = "",
):
    """Start a hub in `workdir`; on exit stop its servers, the hub, and any container it left.

    `ignore_sigint` starts it as a shell's `cmd &` does (scripts/up in the background): with SIGINT
    ignored, which its children inherit. `launcher` is a command that runs the hub's command
    (`nsenter --net=...`: the hub in another network namespace), and `url` its public URL
    where it is not http://127.0.0.1:<port>."""
    workdir.mkdir(parents=True, exist_ok=True)
    port, token, run_id = free_port(), secrets.token_hex(16), secrets.token_hex(6)
    # The spawner's own token is known to the tests, so they can call the grants API as it does.
    spawner_token = secrets.token_hex(16)
    config = _config_text(port, token, run_id, spawner_token, extra_config)
    (workdir / "test_config.py").write_text(config)
    hub_env = {
        **os.environ,
        "FGPU_HUB_PORT": str(port),
        "FGPU_HUB_IP": "127.0.0.1",
        "FGPU_QUEUE_PORT": str(free_port()),
        # Each hub its own SSH port (tests/test_ssh_hub.py): hubs of a run live side by side.
        "FGPU_SSH_PORT": str(free_port()),
        # No test hub builds the heavy images behind itself unless a test asks (scripts/test
        # builds them before the suite; test_image_builds.py tests the builds themselves).
        "FGPU_BUILD_IMAGES": "0",
        **(env or {}),
    }
    hub_env["PATH"] = f"{VENV_BIN}:{hub_env['PATH']}"
    process = _start_process(workdir, hub_env, ignore_sigint, launcher)
    hub = Hub(workdir, port, token, run_id, process)
    hub.url = url or hub.url
    hub.env = hub_env
    hub.launcher = launcher
    hub.spawner_token = spawner_token
    try:
        _wait_for_hub(hub)
        yield hub
    finally:
        _shut_down(hub)


def _start_process(
    workdir: Path, env: dict, ignore_sigint: bool = False, launcher: tuple[str, ...] = ()
) -> subprocess.Popen:
    with open(workdir / "hub.log", "ab") as log:
        return subprocess.Popen(
            [*launcher, str(VENV_BIN / "jupyterhub"), "-f", "test_config.py"],
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_ignore_sigint if ignore_sigint else None,
        )


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def restart(hub: Hub) -> None:
    """Stop the hub as an admin would (SIGTERM) and start it again on the same state and ports."""
    hub.process.terminate()
    hub.process.wait(30)
    hub.process = _start_process(hub.workdir, hub.env, launcher=hub.launcher)
    _wait_for_hub(hub)


def _wait_for_hub(hub: Hub, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if hub.process.poll() is not None:
            # A negative code is the signal that ended it (-9: killed), which its log cannot say.
            code = hub.process.returncode
            raise RuntimeError(f"the hub exited with code {code}:\n{hub.log_text()[-3000:]}")
        try:
            if hub.request("GET", "").status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the hub did not answer in {timeout} s:\n{hub.log_text()[-3000:]}")


def _shut_down(hub: Hub) -> None:
    try:
        servers = hub.active_servers() if hub.process.poll() is None else set()
        for user, server in servers:
            hub.request("DELETE", f"users/{user}/servers/{server}")
    except (requests.RequestException, AssertionError):
        # Not answering, or not through its proxy yet (a 404: a start that timed out): it is
        # stopped all the same, never left running behind the test.
        pass
    hub.process.terminate()
    try:
        hub.process.wait(20)
    except subprocess.TimeoutExpired:
        hub.process.kill()
    remove_containers({TEST_LABEL: hub.run_id})
    remove_volumes({TEST_LABEL: hub.run_id})


def containers_with(labels: dict[str, str]) -> list:
    filters = {"label": [f"{key}={value}" for key, value in labels.items()]}
    # A container removed between the listing and its inspection is gone, not an error.
    return docker_client().containers.list(all=True, filters=filters, ignore_removed=True)


def remove_containers(labels: dict[str, str]) -> None:
    for container in containers_with(labels):
        container.remove(force=True)


def remove_volumes(labels: dict[str, str]) -> None:
    """Home volumes carry the containers' labels (fgpu_spawner.storage), the test run's among them."""
    filters = {"label": [f"{key}={value}" for key, value in labels.items()]}
    for volume in docker_client().volumes.list(filters=filters):
        volume.remove(force=True)


def relaunch(hub: Hub) -> None:
    """Start the hub again on the same state and ports, after its process ended (killed, say)."""
    hub.process.wait(30)
    hub.process = _start_process(hub.workdir, hub.env, launcher=hub.launcher)
    _wait_for_hub(hub)


#: The shell's colour, title and bracketed-paste sequences, which a terminal would not show as text.
TERMINAL_ESCAPES = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|\][^\x07]*\x07)")


def in_terminal(hub, username: str, command: str, server: str = "") -> str:
    """What `command` prints in a new web terminal of `username`'s `server` (terminado's
    websocket through the hub's proxy, as JupyterLab's terminal uses it), up to a marker echoed
    after it, as plain text."""
    headers = {"Authorization": f"token {hub.user_token(username)}"}
    prefix = f"/user/{username}/{server + '/' if server else ''}"
    created = requests.post(f"{hub.url}{prefix}api/terminals", headers=headers, timeout=30)
    assert created.status_code == 200, created.text
    name = created.json()["name"]
    ws_url = f"{hub.url.replace('http', 'ws', 1)}{prefix}terminals/websocket/{name}"
    ws = websocket.create_connection(ws_url, header=headers, timeout=30)
    # The terminal echoes what is typed: $((6*7)) is only "42" in what the shell prints.
    end = "end-of-output-42"
    try:
        ws.send(json.dumps(["stdin", f"{command}; echo end-of-output-$((6*7))\r"]))
        output = ""
        while end not in output:
            message = json.loads(ws.recv())
            if message[0] == "stdout":
                output += message[1]
        return TERMINAL_ESCAPES.sub("", output).replace("\r", "")
    finally:
        ws.close()


def in_kernel(hub, username: str, code: str, server: str = "", timeout: float = 300) -> str:
    """What `code` prints in a new Python kernel of `username`'s `server`, run as a notebook
    runs it: the Jupyter server's kernels API and its websocket (the messaging protocol's JSON
    form) through the hub's proxy. An error in the kernel fails with its traceback."""
    headers = {"Authorization": f"token {hub.user_token(username)}"}
    prefix = f"/user/{username}/{server + '/' if server else ''}"
    created = requests.post(f"{hub.url}{prefix}api/kernels", headers=headers, json={}, timeout=60)
    assert created.status_code == 201, created.text
    kernel = created.json()["id"]
    ws_url = f"{hub.url.replace('http', 'ws', 1)}{prefix}api/kernels/{kernel}/channels"
    ws = websocket.create_connection(ws_url, header=headers, timeout=timeout)
    try:
        msg_id = secrets.token_hex(8)
        ws.send(json.dumps(_execute_request(msg_id, code)))
        return _kernel_output(ws, msg_id)
    finally:
        ws.close()
        requests.delete(f"{hub.url}{prefix}api/kernels/{kernel}", headers=headers, timeout=60)


def _execute_request(msg_id: str, code: str) -> dict:
    header = {
        "msg_id": msg_id,
        "msg_type": "execute_request",
        "session": secrets.token_hex(8),
        "username": "test",
        "version": "5.3",
        "date": datetime.now().astimezone().isoformat(),
    }
    content = {"code": code, "silent": False, "store_history": False, "allow_stdin": False}
    return {"header": header, "parent_header": {}, "metadata": {}, "content": content,
            "channel": "shell", "buffers": []}  # fmt: skip


def _kernel_output(ws, msg_id: str) -> str:
    """The streams the request printed, up to the kernel's going idle after it."""
    output = ""
    while True:
        message = json.loads(ws.recv())
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = message["header"]["msg_type"], message["content"]
        if kind == "stream":
            output += content["text"]
        elif kind == "error":
            raise AssertionError("the kernel raised:\n" + "\n".join(content["traceback"]))
        elif kind == "status" and content["execution_state"] == "idle":
            return output


def engine_backend(cls, client, *, node_reports=None, registry_auth=None, **settings):
    """An engine backend of `cls` over `client` with `settings` (its traits), as the queue
    service makes it, without the service: the hooks it asks of the service are empty."""
    from queue_service.engine.backend import ServiceHooks
    from queue_service.engine.node_reports import NodeReports

    hooks = ServiceHooks(
        running_ids=lambda: [],
        registry_auth=lambda: registry_auth,
        image_digests=lambda: {},
        deployment_id="test",
        container_calls=None,
        container_locks=None,
        node_reports=node_reports if node_reports is not None else NodeReports(stale_after=60),
        node_credentials=None,
        agent_service="fgpu-node-agent",
    )
    return cls(client, hooks, **settings)
