"""A process inside a running session on a Swarm node, for the SSH service's shells and commands
(queue_service/ssh/shell.py): session_exec.py's `SessionExec`, for a Swarm.

The manager says which node runs a user's session, and its container's id (the session
service's running task); the service does not reach that node's engine, so the node's agent
starts the process there and opens the connection back (exec_rendezvous.py). The process is the
same as on one host: the session's user (uid 1000) in its home, in its container's cgroup, with
its mounts and environment; the connection carries the same bytes (a terminal's, or the engine's
frames without one), so shell.py pipes it unchanged. The agent refuses a process while it commits
that session's container (SessionBusy), as the one-host engine does.

Blocking calls, as `SessionExec`'s: shell.py runs them off the event loop, and they hand the
rendezvous's work to the loop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from .exec_rendezvous import ExecRendezvous, ExecStartRefused
from .session_containers import DEPLOYMENT_LABEL, SESSION_LABEL
from .session_exec import Exec, SessionBusy

#: How long a shell waits for the agent to start its process and connect back: one long poll's
#: round trip, an exec on the node's engine, one connection.
OPEN_TIMEOUT_SECONDS = 30.0
#: How long an ended process's exit code is waited for (the agent posts it before it closes the
#: connection: only a lost node or agent makes this wait).
EXIT_WAIT_SECONDS = 10.0


@dataclass(frozen=True)
class NodeContainer:
    """A session's container, on the node that runs it."""

    node: str
    id: str


class SwarmExec:
    """Finds a user's running session on the Swarm and starts processes in it, through the agent
    of its node."""

    def __init__(self, client, rendezvous: ExecRendezvous, node_reports, deployment_id: str, loop):
        self.client = client
        self.rendezvous = rendezvous
        self.node_reports = node_reports
        self.deployment_id = deployment_id
        #: The service's event loop, where the rendezvous lives.
        self.loop = loop

    def session_of(self, user: str, server: str) -> tuple[NodeContainer, str] | None:
        """(its container on its node, session id) of `user`'s running session for `server`."""
        api = self.client.api
        labels = [SESSION_LABEL, f"fgpu.user={user}", f"{DEPLOYMENT_LABEL}={self.deployment_id}"]
        for service in api.services(filters={"label": labels}):
            found = (service.get("Spec") or {}).get("Labels") or {}
            if found.get("fgpu.server_name", "") != server:
                continue
            task = _running_task(api.tasks(filters={"service": service["ID"]}))
            if task is not None:
                node = api.inspect_node(task["NodeID"])["Description"]["Hostname"]
                container = task["Status"]["ContainerStatus"]["ContainerID"]
                return NodeContainer(node, container), found[SESSION_LABEL]
        return None

    def start(
        self, container: NodeContainer, session_id: str, command: list[str], tty: bool, env: dict
    ) -> Exec:
        """Start `command` in the container as the session's user; SessionBusy while a commit
        holds it; ExecStartRefused (an OSError) when its node's agent is silent, refused it or
        did not connect back."""
        if self.node_reports.stale(container.node):
            raise ExecStartRefused(
                f"the agent of node {container.node}, which runs this session, has not reported "
                "lately: shells reach a node through its agent"
            )
        order = {
            "container": container.id,
            "session_id": session_id,
            "command": list(command),
            "tty": tty,
            "env": dict(env),
        }
        opening = self.rendezvous.open(container.node, order, OPEN_TIMEOUT_SECONDS)
        try:
            token, sock = asyncio.run_coroutine_threadsafe(opening, self.loop).result()
        except ExecStartRefused as e:
            if e.busy:
                raise SessionBusy(session_id) from None
            raise
        return Exec(token, sock, tty)

    def resize(self, process: Exec, width: int, height: int) -> None:
        if process.tty and width and height:
            self.loop.call_soon_threadsafe(self.rendezvous.resize, process.id, width, height)

    def exit_code(self, process: Exec) -> int:
        waiting = self.rendezvous.exit_code(process.id, EXIT_WAIT_SECONDS)
        return asyncio.run_coroutine_threadsafe(waiting, self.loop).result()


def _running_task(tasks: list[dict]) -> dict | None:
    """The task whose container runs now (a session's service has one at a time)."""
    for task in tasks:
        status = task.get("Status") or {}
        running = status.get("State") == task.get("DesiredState") == "running"
        if (
            running
            and (status.get("ContainerStatus") or {}).get("ContainerID")
            and task.get("NodeID")
        ):
            return task
    return None
