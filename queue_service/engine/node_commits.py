"""A session saved as a private image on the node it runs on, through that node's agent, so that
a session saved on node A starts on node B.

In Swarm mode the service cannot reach a session's container (it runs on another node's engine),
so the commit is an order to the node's agent (`node_reports.NodeReports.run_order`): the agent
commits the container as `container_commits.commit_container` does on one engine (the source
image's command, user and folder; the owner and source-session labels; not paused: the session
keeps running), and pushes the image to the site's registry, from which any node pulls it.

`commit_order` is pure; `commit_on_node` waits for the agent's result.
"""

from __future__ import annotations

from queue_service.core.errors import Refusal

from .backend import SessionCommit
from .node_reports import NodeReports

#: A commit copies the session's writable layer, and a push sends it: minutes, not seconds.
COMMIT_TIMEOUT_SECONDS = 900


def registry_reference(registry: str, reference: str) -> str:
    """`<registry>/<reference>`: the image's reference in the site's registry."""
    registry = registry.strip().rstrip("/")
    if not registry or "/" in registry:
        raise Refusal(f"{registry!r} is not a registry address such as 10.213.0.1:5000.", "invalid")
    return f"{registry}/{reference}"


def commit_order(session_id: str, commit: SessionCommit, registry: str) -> dict:
    """The order to an agent to commit `session_id` as `commit` names it, and push it."""
    return {
        "kind": "commit",
        "session_id": session_id,
        "image": registry_reference(registry, commit.reference),
        "labels": commit.labels,
        "message": commit.message,
        "push": True,
    }


async def commit_on_node(
    store: NodeReports,
    node: str,
    session_id: str,
    commit: SessionCommit,
    registry: str,
    timeout: float = COMMIT_TIMEOUT_SECONDS,
) -> dict:
    """Commit and push on `node`; the agent's result (image, image_id, digest), or a Refusal."""
    running = store.session_ids(node)
    if running is not None and session_id not in running:
        raise Refusal(f"Node {node} runs no container of session {session_id}.", "conflict")
    result = await store.run_order(node, commit_order(session_id, commit, registry), timeout)
    if not result.get("ok"):
        raise Refusal(
            f"The agent of node {node} could not save session {session_id}: {result.get('error')}",
            "engine",
        )
    return result
