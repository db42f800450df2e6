"""The session network: a user-defined bridge on which sessions cannot reach one another.

With `com.docker.network.bridge.enable_icc=false` the engine drops traffic between two containers
of the bridge, while the host still reaches every container (the proxy, the spawner's readiness
check) and every container still reaches the host (the hub's API, which listens on the bridge's
gateway). Every hub of one engine shares the network: a session is as cut off from another hub's
sessions as from its own hub's.

The pure helpers decide what the network is and whether an existing one isolates; only
`ensure_session_network` talks to the engine (docker-py's low-level `APIClient`, as the spawner
holds it). It is idempotent, and safe when several hubs call it at once: the engine refuses a
second network of the same name (409), and were two ever made anyway, every caller picks the
oldest and uses it by id, which is never ambiguous.
"""

from __future__ import annotations

from dataclasses import dataclass

import docker.errors

SESSION_NETWORK = "fgpu-sessions"
ICC_OPTION = "com.docker.network.bridge.enable_icc"
LABEL_NETWORK = "fgpu.network"


@dataclass(frozen=True)
class SessionNetwork:
    id: str
    name: str
    gateway: str


class NetworkError(RuntimeError):
    """The session network cannot be used; the message says what to do."""


def network_create_kwargs(name: str) -> dict:
    """`APIClient.create_network` arguments for a bridge with inter-container traffic off."""
    return {
        "name": name,
        "driver": "bridge",
        "options": {ICC_OPTION: "false"},
        "labels": {LABEL_NETWORK: "sessions"},
        "check_duplicate": True,
    }


def isolates_containers(attrs: dict) -> bool:
    """True when a network (the engine's JSON) keeps its containers from reaching each other."""
    options = attrs.get("Options") or {}
    return attrs.get("Driver") == "bridge" and options.get(ICC_OPTION) == "false"


def pick_network(name: str, networks: list[dict]) -> dict | None:
    """The network called exactly `name` (the engine's filter matches parts of names): the oldest
    when a race made two."""
    exact = [n for n in networks if n.get("Name") == name]
    return min(exact, key=lambda n: (n.get("Created", ""), n["Id"]), default=None)


def gateway_of(attrs: dict) -> str:
    for config in (attrs.get("IPAM") or {}).get("Config") or []:
        if config.get("Gateway"):
            return config["Gateway"]
    raise NetworkError(f"Docker network {attrs.get('Name')!r} has no IPv4 gateway")


def ensure_session_network(client, name: str = SESSION_NETWORK) -> SessionNetwork:
    """The session network, created when missing. Refuses one that lets containers talk."""
    attrs = pick_network(name, client.networks(names=[name]))
    if attrs is None:
        try:
            client.create_network(**network_create_kwargs(name))
        except docker.errors.APIError as e:
            if e.status_code != 409:  # 409: another hub made it just now
                raise
        attrs = pick_network(name, client.networks(names=[name]))
    if attrs is None:
        raise NetworkError(f"Docker network {name!r} could not be created")
    if not isolates_containers(attrs):
        raise NetworkError(
            f"Docker network {name!r} lets sessions reach one another ({ICC_OPTION} is not "
            f"false). Remove it (`docker network rm {name}`, once no container uses it) so the "
            "hub creates it isolated, or set FGPUSpawner.network_name to another name."
        )
    return SessionNetwork(attrs["Id"], name, gateway_of(attrs))
