"""The Docker engine's view of sessions: containers that carry the spawner's session label.

The reconciler, the usage sampler and private images all look containers up by the
`fgpu.session_id` label that the spawner puts on every session container (DESIGN.md, contract 5).
Only running containers count: an exited one holds no slice and has no usage.
"""

from __future__ import annotations

SESSION_LABEL = "fgpu.session_id"


def running_session_containers(client, session_id: str | None = None) -> dict:
    """Running session containers by session id (one session's, when `session_id` is given).

    Sparse listing reads only the engine's list answer, instead of inspecting every container in
    turn; a container removed while the engine answers is left out rather than failing the call.
    """
    label = SESSION_LABEL if session_id is None else f"{SESSION_LABEL}={session_id}"
    containers = client.containers.list(
        filters={"label": label, "status": "running"}, sparse=True, ignore_removed=True
    )
    return {c.attrs["Labels"][SESSION_LABEL]: c for c in containers}
