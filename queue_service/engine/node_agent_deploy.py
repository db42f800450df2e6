"""Deploying the node agent on every Swarm node: one service per node, pinned to its node id, its
code as a Swarm config, the hub token and that node's own key as Swarm secrets.

- `agent_service_kwargs` (pure) builds the `client.services.create` kwargs for one node: one
  replica constrained to `node.id == <its id>`, the agent file mounted at /fgpu/agent.py and run by
  the session base image's python3, the hub token and the node's key as secrets, the node's docker
  socket bound in, the report URL, interval, node id and hostname in its environment, restarted on
  failure. Only that node's agent ever holds that node's key (a global service would hand one
  secret to every node), so a report signed with it comes from that node (node_identity.py).
- `deploy_node_agents` (I/O) makes the config, the secrets and a service for every node but the
  manager (`node.labels.fgpu.role == manager`), or updates them; it removes the services of nodes
  that left the Swarm (and the single global service of earlier versions). Run again with the same
  inputs it changes nothing; the queue service runs it at start and every
  `node_agent_deploy_interval` seconds, so a node that joins gets its agent. Swarm configs and
  secrets are immutable, so each one's name carries a hash of its content: a new agent file, token
  or key is a new config or secret, the service moves to it (its task restarts), and the old one
  is removed. The agent file is the one this process imported (`AGENT_CODE`): the agents always
  speak the protocol of the service that deploys them, even while a new version waits on disk.
- `rotate_node_key` makes a new key for one node and moves its agent to it.
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
import logging
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
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
from queue_service.core.errors import Refusal
from queue_service.engine.node_credentials import NodeCredential, NodeCredentials
from queue_service.engine.registry_images import pinned_reference

log = logging.getLogger(__name__)
AGENT_SOURCE = Path(agent_module.__file__)
#: The agent's code as this process imported it: what every deploy hands the nodes. Read again at
#: each deploy, an upgrade on disk would reach the nodes before the service restarts, and this
#: service would refuse their reports (agent.REPORT_VERSION).
AGENT_CODE = AGENT_SOURCE.read_bytes()
AGENT_PATH = "/fgpu/agent.py"
TOKEN_SECRET_FILE = "fgpu-node-agent-token"
KEY_SECRET_FILE = "fgpu-node-agent-key"
REGISTRY_SECRET_FILE = "fgpu-registry-auth"
DOCKER_SOCKET = "/var/run/docker.sock"
TOKEN_FILE = "fgpu_node_agent_token"
#: Labels that mark what this module made (configs, secrets, the service).
ROLE_LABEL = "fgpu.role"
ROLE = "node-agent"
SPEC_LABEL = "fgpu.agent_spec"
NODE_ID_LABEL = "fgpu.node_id"
#: Small: one stats call per session every few seconds. Measured in the lab: about 20 MiB.
AGENT_CPU = 0.2
AGENT_MEM = 128 * 1024**2


def content_name(prefix: str, content: bytes) -> str:
    """A config's or secret's name for this content: `prefix-<12 hex of its sha256>`."""
    return f"{prefix}-{hashlib.sha256(content).hexdigest()[:12]}"


def agent_env(
    report_url: str,
    interval: float,
    deployment_id: str | None,
    node: tuple[str, str],
    registry: bool = False,
) -> list[str]:
    env = [
        f"FGPU_AGENT_URL={report_url}",
        f"FGPU_AGENT_INTERVAL={interval:g}",
        f"FGPU_AGENT_TOKEN_FILE=/run/secrets/{TOKEN_SECRET_FILE}",
        f"FGPU_AGENT_KEY_FILE=/run/secrets/{KEY_SECRET_FILE}",
        f"FGPU_NODE_ID={node[0]}",
        f"FGPU_NODE_NAME={node[1]}",
        "PYTHONDONTWRITEBYTECODE=1",
    ]
    if deployment_id:
        env.append(f"FGPU_DEPLOYMENT={deployment_id}")
    if registry:
        env.append(f"FGPU_AGENT_REGISTRY_AUTH_FILE=/run/secrets/{REGISTRY_SECRET_FILE}")
    return env


def service_name(name: str, node_id: str) -> str:
    """The agent service of one node: `<name>-<its node id's first 12 characters>`."""
    return f"{name}-{node_id[:12]}"


def _secret_reference(secret: tuple[str, str], filename: str) -> SecretReference:
    return SecretReference(secret[0], secret[1], filename=filename, uid="0", gid="0", mode=0o400)


def agent_service_kwargs(
    *,
    name: str,
    image: str,
    node: tuple[str, str],
    config: tuple[str, str],
    secret: tuple[str, str],
    key_secret: tuple[str, str],
    report_url: str,
    interval: float = 5.0,
    deployment_id: str | None = None,
    docker_socket: str = DOCKER_SOCKET,
    registry_secret: tuple[str, str] | None = None,
) -> dict:
    """`client.services.create(**kwargs)` for the agent of `node` (its Swarm id, its hostname);
    `config`, `secret` (the hub token), `key_secret` (the node's key) and `registry_secret` (the
    site registry's credentials, with which the agent pushes saved sessions) are (id, name).

    `docker_socket` is the node's engine socket as the node sees it; Swarm fills templates in a
    mount's source, so `/var/lib/fgpu-swarm-lab/LAB/nodes/{{.Node.Hostname}}/docker.sock` gives each
    node of the lab its own engine (there, /var/run/docker.sock is the machine's engine)."""
    labels = {ROLE_LABEL: ROLE, NODE_ID_LABEL: node[0]}
    if deployment_id:
        labels["fgpu.deployment"] = deployment_id
    kwargs = {
        "image": image,
        "command": ["python3", AGENT_PATH],
        "name": service_name(name, node[0]),
        "mode": ServiceMode("replicated", replicas=1),
        "constraints": [f"node.id=={node[0]}"],
        "configs": [ConfigReference(config[0], config[1], filename=AGENT_PATH, mode=0o444)],
        "secrets": [
            _secret_reference(secret, TOKEN_SECRET_FILE),
            _secret_reference(key_secret, KEY_SECRET_FILE),
            *(
                [_secret_reference(registry_secret, REGISTRY_SECRET_FILE)]
                if registry_secret
                else []
            ),
        ],
        "mounts": [Mount(DOCKER_SOCKET, docker_socket, type="bind")],
        "env": agent_env(report_url, interval, deployment_id, node, bool(registry_secret)),
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


def pinned_image(image: str, registry: str, digests: Mapping[str, str]) -> str:
    """The agent's image at the digest the hub pinned for it (`digests`: catalog reference →
    digest, registry_images.py), so that a tag moved in the registry behind the hub's back does
    not change what runs as root on every node; `image` as it is when none is pinned."""
    prefix = f"{registry.rstrip('/')}/" if registry else ""
    reference = image.removeprefix(prefix) if prefix else image
    digest = digests.get(reference)
    if not digest:
        return image
    pinned = pinned_reference(reference, digest)
    return prefix + pinned if prefix and image.startswith(prefix) else pinned


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


@dataclass(frozen=True)
class AgentSettings:
    """What every node's agent is deployed with (the queue service's node_agent_* settings)."""

    token: str
    report_url: str
    image: str
    name: str = "fgpu-node-agent"
    interval: float = 5.0
    deployment_id: str | None = None
    docker_socket: str = DOCKER_SOCKET
    #: The site registry's credentials file's content (JSON), or None: a registry without them.
    registry_auth: str | None = None


def agent_nodes(client: docker.DockerClient) -> list[tuple[str, str]]:
    """(id, hostname) of every Swarm node an agent runs on: all but the manager."""
    return sorted(
        (node.id, node.attrs["Description"]["Hostname"])
        for node in client.nodes.list()
        if (node.attrs["Spec"].get("Labels") or {}).get(ROLE_LABEL) != "manager"
    )


def deploy_node_agents(
    client: docker.DockerClient,
    credentials: NodeCredentials,
    settings: AgentSettings,
    source: bytes | None = None,
) -> list:
    """Create or update every node's agent (config, secrets, service); returns the services.

    `client` talks to a Swarm manager. Nothing changes when everything is as asked already."""
    source = AGENT_CODE if source is None else source
    name = settings.name
    config = _ensure(client.configs, content_name(f"{name}-code", source), source)
    token = settings.token.encode()
    secret = _ensure(client.secrets, content_name(f"{name}-token", token), token)
    registry = None
    if settings.registry_auth:
        auth = settings.registry_auth.encode()
        made = _ensure(client.secrets, content_name(f"{name}-registry", auth), auth)
        registry = (made.id, made.name)
    nodes = agent_nodes(client)
    # One listing for the whole round: a round runs every minute, over every node.
    existing = {s.name: s for s in client.services.list(filters={"label": f"{ROLE_LABEL}={ROLE}"})}
    services, keys = [], set()
    for node in nodes:
        try:
            key = credentials.ensure(*node).key.encode()
        except Refusal as e:  # a node named like another gets no agent until renamed
            log.error("No node agent on node %s: %s", node[0], e)
            continue
        key_secret = _ensure(client.secrets, content_name(f"{name}-key-{node[0][:12]}", key), key)
        keys.add(key_secret.name)
        kwargs = agent_service_kwargs(
            name=name,
            image=settings.image,
            node=node,
            config=(config.id, config.name),
            secret=(secret.id, secret.name),
            key_secret=(key_secret.id, key_secret.name),
            report_url=settings.report_url,
            interval=settings.interval,
            deployment_id=settings.deployment_id,
            docker_socket=settings.docker_socket,
            registry_secret=registry,
        )
        services.append(_create_or_update(client, kwargs, existing))
    _remove_other_services(existing, name, {service.name for service in services})
    credentials.keep_only(node_id for node_id, _ in nodes)
    _remove_unused(client.configs, f"{name}-code-", keep={config.name})
    _remove_unused(client.secrets, f"{name}-token-", keep={secret.name})
    _remove_unused(client.secrets, f"{name}-key-", keep=keys)
    _remove_unused(client.secrets, f"{name}-registry-", keep={registry[1]} if registry else set())
    return services


def rotate_node_key(
    client: docker.DockerClient, credentials: NodeCredentials, settings: AgentSettings, node: str
) -> NodeCredential:
    """A new key for `node` (its hostname or id), and its agent moved to it; the old key is
    refused from now on (reports in flight with it are lost: the next one carries the new key)."""
    rotated = credentials.rotate(node)
    deploy_node_agents(client, credentials, settings)
    return rotated


def _create_or_update(client: docker.DockerClient, kwargs: dict, existing: dict):
    service = existing.get(kwargs["name"])
    if service is None:
        return client.services.create(**kwargs)
    if (service.attrs["Spec"].get("Labels") or {}).get(SPEC_LABEL) != kwargs["labels"][SPEC_LABEL]:
        kwargs = {k: v for k, v in kwargs.items() if k != "mode"}  # a mode cannot change
        service.update(**kwargs)
        service.reload()
    return service


def _remove_other_services(existing: dict, name: str, keep: set[str]) -> None:
    """The agents of nodes that left, and an earlier version's global service `name`."""
    for service in existing.values():
        if service.name.startswith(name) and service.name not in keep:
            with contextlib.suppress(docker.errors.NotFound):
                service.remove()


def _ensure(collection, name: str, data: bytes):
    """The config or secret `name` (its content is in its name), made when missing."""
    found = [item for item in collection.list(filters={"name": name}) if item.name == name]
    if found:
        return found[0]
    try:
        created = collection.create(name=name, data=data, labels={ROLE_LABEL: ROLE})
    except docker.errors.APIError as e:
        if e.status_code != 409:
            raise
        return _ensure(collection, name, data)  # made meanwhile by another deploy (same content)
    return collection.get(created.id)


def _remove_unused(collection, prefix: str, keep: set[str]) -> None:
    """Earlier versions; one still held by a task that is stopping stays until the next deploy."""
    for item in collection.list(filters={"label": f"{ROLE_LABEL}={ROLE}"}):
        if item.name.startswith(prefix) and item.name not in keep:
            with contextlib.suppress(docker.errors.APIError):
                item.remove()
