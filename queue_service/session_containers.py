"""The Docker engine's view of sessions: containers that carry the spawner's session label.

The reconciler, the usage sampler and private images all look containers up by the
`fgpu.session_id` label that the spawner puts on every session container (DESIGN.md, contract 5).
Only running containers count: an exited one holds no slice and has no usage. A paused one is
still alive (the engine pauses a container while it commits it to an image, and resumes it after):
the reconciler takes it as running, so a session being saved is not taken for a lost one.
"""

from __future__ import annotations

SESSION_LABEL = "fgpu.session_id"


#: Engine states of a container whose processes still exist (frozen, when paused).
ALIVE = ("running", "paused")


def running_session_containers(
    client, session_id: str | None = None, statuses: tuple[str, ...] = ("running",)
) -> dict:
    """Running session containers by session id (one session's, when `session_id` is given);
    `statuses=ALIVE` adds the paused ones.

    Sparse listing reads only the engine's list answer, instead of inspecting every container in
    turn; a container removed while the engine answers is left out rather than failing the call.
    """
    label = SESSION_LABEL if session_id is None else f"{SESSION_LABEL}={session_id}"
    containers = client.containers.list(
        filters={"label": label, "status": list(statuses)}, sparse=True, ignore_removed=True
    )
    return {c.attrs["Labels"][SESSION_LABEL]: c for c in containers}


def alive_session_containers(client) -> dict:
    """Session containers that run or are paused (being committed), by session id."""
    return running_session_containers(client, statuses=ALIVE)
