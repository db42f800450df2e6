"""The Docker engine's view of sessions: containers that carry the spawner's session label.

The reconciler, the usage sampler and private images all look containers up by the
`fgpu.session_id` label that the spawner puts on every session container (docs/source/explanation/contracts.md, contract 5).
Only live containers count: an exited one holds no slice and has no usage. A paused one (`docker
pause` or a `docker commit` by hand; the service's own commits do not pause) is alive: it still
holds its slice and comes back as it was (frozen_containers.py thaws one left frozen).

`fgpu.deployment` names the hub that made the container (its id, kept in the hub's state
directory): a container of another hub on the same engine is never adopted or stopped here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import docker.errors

from .errors import ENGINE_ERRORS

SESSION_LABEL = "fgpu.session_id"
DEPLOYMENT_LABEL = "fgpu.deployment"
LIVE_STATES = ["running", "paused"]


def running_session_containers(client, session_id: str | None = None) -> dict:
    """Live session containers by session id (one session's, when `session_id` is given).

    Sparse listing reads only the engine's list answer, instead of inspecting every container in
    turn; a container removed while the engine answers is left out rather than failing the call.
    """
    label = SESSION_LABEL if session_id is None else f"{SESSION_LABEL}={session_id}"
    containers = client.containers.list(
        filters={"label": label, "status": LIVE_STATES}, sparse=True, ignore_removed=True
    )
    return {c.attrs["Labels"][SESSION_LABEL]: c for c in containers}


class DockerSessionLister:
    """Lists the engine's live session containers for the reconciler (single-host mode); the
    Swarm's twin is `session_services.SwarmSessionLister`."""

    def __init__(self, client):
        self.client = client

    def __call__(self) -> dict:
        return running_session_containers(self.client)

    def why_gone(self, session_id: str) -> str | None:
        """A container that is not live has simply stopped: nothing more to say."""
        return None

    def remove_gone(self, session_ids) -> None:
        """Stopped containers are the spawner's to remove."""


def stop_and_remove(container, log=None) -> bool:
    """Stop and remove a session's container (or a Swarm's session service) for the reconciler;
    True once it is gone, False if the engine refused (the next pass tries again)."""
    try:
        container.stop(timeout=5)
        container.remove(force=True)
    except docker.errors.NotFound:
        pass  # gone already: what was wanted
    except ENGINE_ERRORS as e:
        if log:
            log.warning("reconciler: could not stop and remove %s: %s", container.id[:12], e)
        return False
    return True


def deployment_of(container) -> str | None:
    """The id of the hub that made the container; None for containers made before ids existed."""
    return (container.attrs.get("Labels") or {}).get(DEPLOYMENT_LABEL)


def server_of(container) -> tuple[str, str] | None:
    """(user, server name) of the hub server the container was started for, from its labels."""
    labels = container.attrs.get("Labels") or {}
    if "fgpu.user" not in labels:
        return None
    return labels["fgpu.user"], labels.get("fgpu.server_name", "")


@dataclass(frozen=True)
class LabelledSession:
    """What a session container says about itself: enough to account for it without the DB."""

    id: str
    user: str
    server_name: str
    image: str
    cpu: float
    mem: int
    fgpu: float
    node: str
    grant_json: str


def session_from_labels(container) -> LabelledSession | None:
    """The session a container's labels describe, or None when they do not describe one whole
    (a container made by hand with a session label, say)."""
    labels = container.attrs.get("Labels") or {}
    try:
        request = json.loads(labels["fgpu.request"])
        grant = json.loads(labels["fgpu.grant"])
        return LabelledSession(
            id=labels[SESSION_LABEL],
            user=labels["fgpu.user"],
            server_name=labels.get("fgpu.server_name", ""),
            image=labels.get("fgpu.image", ""),
            cpu=float(request["cpu"]),
            mem=int(request["mem"]),
            fgpu=float(request.get("fgpu") or 0),
            node=str(grant["node"]),
            grant_json=json.dumps(
                {"session_id": labels[SESSION_LABEL], "node": grant["node"], "gpus": grant["gpus"]}
            ),
        )
    except (KeyError, TypeError, ValueError):
        return None
