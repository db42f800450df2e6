"""Deploying the node agent on every Swarm node: one global service, its code as a Swarm config,
its hub token as a Swarm secret.

- `agent_service_kwargs` (pure) builds the `client.services.create` kwargs: mode global, on every
  node but the manager (`node.labels.fgpu.role != manager`), the agent file mounted at
  /fgpu/agent.py and run by the session base image's python3, the token as a secret, the node's
  docker socket bound in, the report URL and interval in its environment, restarted on failure.
- `deploy_node_agent` (I/O) makes the config, the secret and the service, or updates them; run
  again with the same inputs it changes nothing. Swarm configs and secrets are immutable, so each
  one's name carries a hash of its content: a new agent file or token is a new config or secret,
  the service moves to it (its tasks restart), and the old one is removed.
- `node_agent_token` keeps the agents' hub token in the hub's state directory, so that the hub's
  config (which declares the `fgpu-node-agent` service with it) and the queue service (which puts
  it in the secret) agree, and a hub restart leaves the agents running as they were.

The agent runs as root in its container: it needs the node's docker socket to read its containers'
stats and to commit and push sessions, as cAdvisor and Portainer's agent do. It holds no other
capability, its root filesystem is read-only, and its CPU and memory are capped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from pathlib import Path

import docker
from docker.types import (
    ConfigReference,
    EndpointSpec,
    Mount,
    Resources,
    RestartPolicy,
    SecretReference,
    ServiceMode,
)

from node_agent import agent as agent_module

AGENT_SOURCE = Path(agent_module.__file__)
AGENT_PATH = "/fgpu/agent.py"
TOKEN_SECRET_FILE = "fgpu-node-agent-token"
DOCKER_SOCKET = "/var/run/docker.sock"
TOKEN_FILE = "fgpu_node_agent_token"
#: Labels that mark what this module made (configs, secrets, the service).
ROLE_LABEL = "fgpu.role"
ROLE = "node-agent"
SPEC_LABEL = "fgpu.agent_spec"
#: Small: one stats call per session every few seconds. Measured in the lab: about 20 MiB.
AGENT_CPU = 0.2
AGENT_MEM = 128 * 1024**2


def content_name(prefix: str, content: bytes) -> str:
    """A config's or secret's name for this content: `prefix-<12 hex of its sha256>`."""
    return f"{prefix}-{hashlib.sha256(content).hexdigest()[:12]}"


def agent_env(report_url: str, interval: float, deployment_id: str | None) -> list[str]:
    env = [
        f"FGPU_AGENT_URL={report_url}",
        f"FGPU_AGENT_INTERVAL={interval:g}",
        f"FGPU_AGENT_TOKEN_FILE=/run/secrets/{TOKEN_SECRET_FILE}",
        # Swarm fills the template per task: each agent knows its node without asking anyone.
        "FGPU_NODE_NAME={{.Node.Hostname}}",
        "PYTHONDONTWRITEBYTECODE=1",
    ]
    if deployment_id:
        env.append(f"FGPU_DEPLOYMENT={deployment_id}")
    return env


def agent_service_kwargs(
    *,
    name: str,
    image: str,
    config: tuple[str, str],
    secret: tuple[str, str],
    report_url: str,
    interval: float = 5.0,
    deployment_id: str | None = None,
    docker_socket: str = DOCKER_SOCKET,
) -> dict:
    """`client.services.create(**kwargs)` for the agent; `config` and `secret` are (id, name).

    `docker_socket` is the node's engine socket as the node sees it; Swarm fills templates in a
    mount's source, so `/var/lib/fgpu-swarm-lab/LAB/nodes/{{.Node.Hostname}}/docker.sock` gives each
    node of the lab its own engine (there, /var/run/docker.sock is the machine's engine)."""
    labels = {ROLE_LABEL: ROLE}
    if deployment_id:
        labels["fgpu.deployment"] = deployment_id
    kwargs = {
        "image": image,
        "command": ["python3", AGENT_PATH],
        "name": name,
        "mode": ServiceMode("global"),
        "constraints": ["node.labels.fgpu.role != manager"],
        "configs": [ConfigReference(config[0], config[1], filename=AGENT_PATH, mode=0o444)],
        "secrets": [
            SecretReference(
                secret[0], secret[1], filename=TOKEN_SECRET_FILE, uid="0", gid="0", mode=0o400
            )
        ],
        "mounts": [Mount(DOCKER_SOCKET, docker_socket, type="bind")],
        "env": agent_env(report_url, interval, deployment_id),
        "user": "0",
        "read_only": True,
        "cap_drop": ["ALL"],
        "resources": Resources(cpu_limit=int(AGENT_CPU * 1e9), mem_limit=AGENT_MEM),
        "restart_policy": RestartPolicy(condition="on-failure", delay=5_000_000_000),
        # No VIP: this kernel has no IPVS, and nothing connects to the agent anyway.
        "endpoint_spec": EndpointSpec(mode="dnsrr"),
        "labels": labels,
        "container_labels": dict(labels),
    }
    kwargs["labels"][SPEC_LABEL] = spec_digest(kwargs)
    return kwargs


def spec_digest(kwargs: dict) -> str:
    """A digest of the kwargs: equal digests mean the running service needs no update."""
    return hashlib.sha256(json.dumps(kwargs, sort_keys=True, default=repr).encode()).hexdigest()[
        :16
    ]


def node_agent_token(path: str | os.PathLike = TOKEN_FILE) -> str:
    """The agents' hub API token, kept (mode 0600) in `path` (relative: in the working directory,
    the hub's state directory), made on first use."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_token(path)
    token = secrets.token_hex(32)
    with os.fdopen(fd, "w") as file:
        file.write(token + "\n")
    return token


def _read_token(path: Path) -> str:
    if path.stat().st_mode & 0o077:
        raise SystemExit(f"{path} is readable by others: chmod 600 {path}")
    token = path.read_text().strip()
    if not token:
        raise ValueError(f"{path} is empty; remove it to make a new node agent token")
    return token


# -- I/O -----------------------------------------------------------------------------------------


def deploy_node_agent(
    client: docker.DockerClient,
    *,
    token: str,
    report_url: str,
    image: str,
    name: str = "fgpu-node-agent",
    interval: float = 5.0,
    deployment_id: str | None = None,
    docker_socket: str = DOCKER_SOCKET,
    source: bytes | None = None,
):
    """Create or update the agent's config, secret and global service; returns the service.

    `client` talks to a Swarm manager. Nothing changes when everything is as asked already."""
    source = AGENT_SOURCE.read_bytes() if source is None else source
    config = _ensure(client.configs, content_name(f"{name}-code", source), source)
    secret = _ensure(client.secrets, content_name(f"{name}-token", token.encode()), token.encode())
    kwargs = agent_service_kwargs(
        name=name,
        image=image,
        config=(config.id, config.name),
        secret=(secret.id, secret.name),
        report_url=report_url,
        interval=interval,
        deployment_id=deployment_id,
        docker_socket=docker_socket,
    )
    service = next(iter(client.services.list(filters={"name": name})), None)
    if service is not None and service.name != name:
        service = None  # the name filter matches prefixes
    if service is None:
        service = client.services.create(**kwargs)
    elif (service.attrs["Spec"].get("Labels") or {}).get(SPEC_LABEL) != kwargs["labels"][
        SPEC_LABEL
    ]:
        kwargs.pop("mode")  # a service's mode cannot change, and is global already
        service.update(**kwargs)
        service.reload()
    _remove_unused(client.configs, f"{name}-code-", keep=config.name)
    _remove_unused(client.secrets, f"{name}-token-", keep=secret.name)
    return service


def _ensure(collection, name: str, data: bytes):
    """The config or secret `name` (its content is in its name), made when missing."""
    found = [item for item in collection.list(filters={"name": name}) if item.name == name]
    if found:
        return found[0]
    created = collection.create(name=name, data=data, labels={ROLE_LABEL: ROLE})
    return collection.get(created.id)


def _remove_unused(collection, prefix: str, keep: str) -> None:
    """Earlier versions; one still held by a task that is stopping stays until the next deploy."""
    for item in collection.list(filters={"label": f"{ROLE_LABEL}={ROLE}"}):
        if item.name.startswith(prefix) and item.name != keep:
            with contextlib.suppress(docker.errors.APIError):
                item.remove()
