"""The local Swarm lab (`scripts/swarm-lab`) for tests: one lab of 3 worker nodes for the whole run.

Bringing a lab up is the slow part, so one lab, under a name and network of its own (a developer's
lab on this machine is never touched), serves every module that needs it: `tests/test_swarm_hub.py`
(a hub in Swarm mode), `tests/test_swarm_ssh_hub.py` (SSH into sessions on its workers) and `tests/test_swarm_lab.py` (the script itself, whose last test takes the
lab down and checks that nothing of it is left). A file lock makes two test runs on one machine take
turns.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import shlex
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import docker
import pytest

from fgpu_shared.registry_auth import log_in, read_registry_auth

from .harness import docker_client
from .harness import wait_until as wait_for  # noqa: F401 (the lab tests import it from here)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "swarm-lab"
NODES = 3
GPUS = "1x8GiB"
IMAGE = "fgpu/jupyter-base:py3.11"

# A developer whose own lab must not be touched by a run points the tests at another
# (FGPU_TEST_SWARM_LAB_NAME, _NET, _POOL); the run takes it down and up as its own.
LAB_NAME = os.environ.get("FGPU_TEST_SWARM_LAB_NAME", "fgpu-labt")
LAB_NET = os.environ.get("FGPU_TEST_SWARM_LAB_NET", "10.212")
LAB_DIR = Path("/var/lib/fgpu-swarm-lab") / LAB_NAME
LAB_ENV = {
    "FGPU_SWARM_LAB_NAME": LAB_NAME,
    "FGPU_SWARM_LAB_NET": LAB_NET,
    "FGPU_SWARM_LAB_POOL": os.environ.get("FGPU_TEST_SWARM_LAB_POOL", "10.215.0.0/16"),
    "FGPU_PYTHON": sys.executable,
}
LOCK_PATH = (
    "/run/lock/fgpu-swarm-lab-test" + ("" if LAB_NAME == "fgpu-labt" else f"-{LAB_NAME}") + ".lock"
)
# Where the lab tracks its processes: cgroup v1's pids hierarchy, or the v2 tree.
CGROUPS = (
    Path("/sys/fs/cgroup/pids") if Path("/sys/fs/cgroup/pids").is_dir() else Path("/sys/fs/cgroup")
)
EXPORT_LINE = re.compile(r"^export ([A-Z_][A-Z0-9_]*)=(\S*)$")


@dataclass
class Lab:
    stdout: str
    env: dict[str, str]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def nodes(self) -> list[str]:
        return self.env["FGPU_SWARM_NODES"].split(",")

    def manager(self) -> docker.DockerClient:
        return engine_client(self.env)

    def engine(self, url: str) -> docker.DockerClient:
        return engine_client({**self.env, "DOCKER_HOST": url})


def engine_client(env: dict[str, str], **tls: object) -> docker.DockerClient:
    """A client of a lab engine, over TLS with the lab's certificates (or the `tls` given)."""
    kwargs = docker.utils.kwargs_from_env(environment=env)
    if tls:
        kwargs["tls"] = docker.tls.TLSConfig(**tls)
    # The lab's engines are dockerd 20.10 (API 1.41): no version round trip before trust_env is off.
    client = docker.DockerClient(**kwargs, version="1.41", timeout=60)
    # requests would otherwise verify against REQUESTS_CA_BUNDLE (when set) instead of the lab's CA.
    client.api.trust_env = False
    # The lab's registry wants a login for every pull and push, as the hub's client gives it.
    if env.get("FGPU_SWARM_REGISTRY_AUTH_FILE"):
        log_in(client.api, read_registry_auth(env["FGPU_SWARM_REGISTRY_AUTH_FILE"]))
    return client


def swarm_lab(
    *args: str, check: bool = True, lab_env: dict[str, str] = LAB_ENV
) -> subprocess.CompletedProcess:
    """Run `scripts/swarm-lab` on the lab `lab_env` names (the test run's by default)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    return subprocess.run(
        [str(SCRIPT), *args],
        env={**env, **lab_env},
        capture_output=True,
        text=True,
        timeout=900,
        check=check,
    )


def timed(lab: Lab, what: str, *args: str) -> subprocess.CompletedProcess:
    start = time.monotonic()
    done = swarm_lab(*args)
    lab.timings[what] = round(time.monotonic() - start, 2)
    return done


def parse_exports(stdout: str) -> dict[str, str]:
    """The variables, as the shell's `eval` would set them (values may be quoted)."""
    env = {}
    for line in stdout.splitlines():
        match = EXPORT_LINE.match(line)
        assert match, f"not an export line on stdout: {line!r}"
        env[match[1]] = "".join(shlex.split(match[2]))
    return env


def node_states(lab: Lab) -> dict[str, str]:
    return {
        n.attrs["Description"]["Hostname"]: n.attrs["Status"]["State"]
        for n in lab.manager().nodes.list()
    }


def engine_pids() -> dict[str, int]:
    """The lab's dockerd processes (manager and workers), by node, from their pid files."""
    return {
        pidfile.parent.name: int(pidfile.read_text())
        for pidfile in (LAB_DIR / "nodes").glob("*/docker.pid")
    }


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie has ended: reaping it is its parent's business)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def lab_pids() -> set[int]:
    tree = CGROUPS / LAB_NAME
    return {int(p) for procs in tree.rglob("cgroup.procs") for p in procs.read_text().split()}


@pytest.fixture(scope="session")
def lab():
    docker_client()  # no engine: fail here, with a message that says so
    os.makedirs(os.path.dirname(LOCK_PATH), exist_ok=True)
    with open(LOCK_PATH, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        swarm_lab("down")  # whatever a crashed run left behind
        start = time.monotonic()
        up = swarm_lab("up", "--nodes", str(NODES), "--gpus", GPUS)
        running = Lab(up.stdout, parse_exports(up.stdout))
        running.timings["up"] = round(time.monotonic() - start, 2)
        try:
            yield running
        finally:
            swarm_lab("down", check=False)
            print(f"\nswarm-lab timings (s): {running.timings}", file=sys.stderr)


@dataclass
class HubContainer:
    """A container on the manager in whose network a hub runs (`FGPU_SWARM_HUB_CONTAINER`)."""

    container: object
    #: Runs a command in the container's network namespace (the hub's process, here).
    launcher: tuple[str, ...]
    #: The hub's public URL: the port the container publishes on the manager's address.
    url: str

    def env(self) -> dict[str, str]:
        """What the shipped config needs to run the hub in this container's network: the
        container's name, the rest (an overlay per session) left at the shipped defaults."""
        return {
            "FGPU_SWARM_HUB_CONTAINER": self.container.name,
            # The lab's own acceptance of reachable sessions (its hub beside the Swarm) is not
            # this hub's: it must be isolated without it.
            "FGPU_SWARM_REACHABLE_SESSIONS": "",
            "FGPU_HUB_IP": "0.0.0.0",
            "FGPU_HUB_PORT": str(HUB_CONTAINER_PORT),
            "FGPU_DEMO_LOGIN_ON_NETWORK": "1",
        }


HUB_CONTAINER_PORT = 8000


@contextmanager
def hub_container(lab_env: dict[str, str], labels: dict[str, str] | None = None):
    """A container on the lab's manager that a site's hub container stands for: no hub image is
    built here, so the hub's process enters this container's network namespace (`nsenter
    --net`, as the lab's engines enter theirs) and runs from this machine's files. It publishes
    the proxy's port on the manager's address. Removed at the end."""
    manager = engine_client(lab_env)
    container = manager.containers.run(
        f"{lab_env['FGPU_SWARM_REGISTRY']}/{IMAGE}",
        ["sleep", "infinity"],
        name=f"fgpu-hub-{secrets.token_hex(3)}",
        detach=True,
        ports={f"{HUB_CONTAINER_PORT}/tcp": None},
        user="1000",
        cap_drop=["ALL"],
        labels=labels or {},
    )
    try:
        container.reload()
        port = container.ports[f"{HUB_CONTAINER_PORT}/tcp"][0]["HostPort"]
        yield HubContainer(
            container,
            ("nsenter", f"--net=/proc/{container.attrs['State']['Pid']}/ns/net"),
            f"http://{urlparse(lab_env['DOCKER_HOST']).hostname}:{port}",
        )
    finally:
        container.remove(force=True)
