"""The Swarm's view of sessions: services that carry the spawner's session label, and their tasks.

In Swarm mode (`QueueService.engine_class = "swarm"`) every session is a service pinned to one node
(fgpu_spawner/swarm_spawner.py), with the same `fgpu.` labels a single-host container carries.
The reconciler asks the manager, never the nodes: it lists the labelled services, their tasks and
the nodes in three calls, and `live_sessions` (pure) tells which sessions still hold their slice:

- a task that is starting or running on a node that is up: alive;
- the same on a node that is down: alive for `down_grace` seconds (a node that reboots, or a
  network blip, keeps its sessions), then lost, with the node named in the reason. The manager
  marks such a task for shutdown at once (desired state "shutdown"), yet only the node can stop
  it, so the desired state of a task on a down node is not taken as its end;
- a task that failed, was rejected or shut down, or a service with no task: gone, with Swarm's
  own words as the reason. A batch job's task that ran to its end (`complete`, or `failed` with
  its exit code) is gone so too, never as a lost node: the reconciler hands it to job_ends.py,
  which ends the job `finished` or `failed` from the task (job_services.py).

`SessionService` stands in for docker-py's container in the reconciler: its labels are the
service's, and stopping it removes the service (Swarm then stops the task on its node).

A session's own overlay (the spawner's `network_per_session`) is named as its service and labelled
`fgpu.role=session`. The spawner removes it when the session stops; one whose service has been
gone for `down_grace` seconds (the spawner failed to remove it, or the hub stopped meanwhile) is
removed here, after its other members (the hub's container) have been sent away from it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import docker.errors

from queue_service.engine.session_containers import SESSION_LABEL

#: The label of a session's own overlay (fgpu_spawner.swarm_spawner, `network_per_session`).
SESSION_NETWORK_LABEL = "fgpu.role=session"
#: Task states from "new" to "running" (docker's TaskState): the task holds, or will hold, a container.
LIVE_TASK_STATES = frozenset(
    {"new", "pending", "assigned", "accepted", "preparing", "ready", "starting", "running"}
)


@dataclass
class SessionService:
    """A session's service, with what the reconciler reads of a container: id and labels."""

    id: str
    attrs: dict
    node: str = ""
    client: object = field(default=None, repr=False, compare=False)

    def stop(self, timeout: int = 5) -> None:
        """Nothing to stop apart from the service: `remove` stops its task."""

    def remove(self, force: bool = True) -> None:
        with contextlib.suppress(docker.errors.NotFound):  # gone already: what was wanted
            self.client.api.remove_service(self.id)


@dataclass(frozen=True)
class SwarmSessions:
    """What `live_sessions` found: the live sessions, and the others' services with the reason
    each is not alive."""

    alive: dict[str, SessionService]
    gone: dict[str, tuple[str, SessionService]]


def live_sessions(
    services: Iterable[Mapping],
    tasks: Iterable[Mapping],
    nodes: Iterable[Mapping],
    down_since: Mapping[str, float],
    now: float,
    down_grace: float,
) -> SwarmSessions:
    """Sort the labelled services into live sessions and gone ones (with a reason), from the
    manager's `services`, `tasks` and `nodes` answers. `down_since` holds when each node was
    first seen down (the caller keeps it across rounds)."""
    hostnames = {n["ID"]: _hostname(n) for n in nodes}
    newest: dict[str, Mapping] = {}
    for task in tasks:
        held = newest.get(task.get("ServiceID"))
        if held is None or task.get("CreatedAt", "") > held.get("CreatedAt", ""):
            newest[task.get("ServiceID")] = task
    alive, gone = {}, {}
    for service in services:
        labels = service["Spec"].get("Labels") or {}
        session_id = labels.get(SESSION_LABEL)
        if not session_id:
            continue
        task = newest.get(service["ID"])
        node = hostnames.get((task or {}).get("NodeID"), "")
        found = SessionService(service["ID"], {"Labels": dict(labels)}, node)
        reason = _why_not_alive(task, node, down_since, now, down_grace)
        if reason is None:
            alive[session_id] = found
        else:
            gone[session_id] = (reason, found)
    return SwarmSessions(alive, gone)


def _why_not_alive(
    task: Mapping | None, node: str, down_since: Mapping[str, float], now: float, grace: float
) -> str | None:
    if task is None:
        return "its Swarm service has no task"
    status = task.get("Status") or {}
    state = status.get("State", "")
    since = down_since.get(node)
    # The node is checked first: the manager wants the tasks of a node that is down shut down
    # (desired state "shutdown") at once, but only the node can say whether they still run.
    if since is not None and state in LIVE_TASK_STATES:
        return (
            f"its node {node} went down (no contact for {now - since:.0f} s)"
            if (now - since >= grace)
            else None
        )
    if state not in LIVE_TASK_STATES or task.get("DesiredState") not in ("running", "ready"):
        detail = status.get("Err") or status.get("Message") or state
        return f"its Swarm task ended ({state}: {detail})"
    return None


def nodes_down(nodes: Iterable[Mapping], down_since: Mapping[str, float], now: float) -> dict:
    """`down_since` brought up to date: nodes that are down keep their first time, others leave."""
    down = {_hostname(n) for n in nodes if (n.get("Status") or {}).get("State") == "down"}
    return {name: down_since.get(name, now) for name in down}


def orphan_networks(
    networks: Iterable[Mapping],
    services: Iterable[Mapping],
    orphan_since: Mapping[str, float],
    now: float,
) -> dict[str, float]:
    """`orphan_since` brought up to date: every session overlay (by id) that no service of its
    name uses, with when it was first seen so. A service is made just after its overlay, so an
    overlay is an orphan only once it has been one for a while."""
    names = {(s.get("Spec") or {}).get("Name") for s in services}
    return {n["Id"]: orphan_since.get(n["Id"], now) for n in networks if n.get("Name") not in names}


def _hostname(node: Mapping) -> str:
    return (node.get("Description") or {}).get("Hostname") or node.get("ID", "")


class SwarmSessionLister:
    """Lists the Swarm's sessions for the reconciler, remembering since when each node is down."""

    def __init__(self, client, down_grace: float, clock):
        self.client = client
        self.down_grace = down_grace
        self.clock = clock
        self.down_since: dict[str, float] = {}
        self.gone: dict[str, tuple[str, SessionService]] = {}
        self.orphan_since: dict[str, float] = {}

    def __call__(self) -> dict[str, SessionService]:
        api = self.client.api
        services = api.services(filters={"label": SESSION_LABEL})
        # Unfiltered: a task carries its service's id, not its labels.
        tasks = api.tasks() if services else []
        nodes = api.nodes()
        now = self.clock()
        self.down_since = nodes_down(nodes, self.down_since, now)
        found = live_sessions(services, tasks, nodes, self.down_since, now, self.down_grace)
        for service in [*found.alive.values(), *(s for _, s in found.gone.values())]:
            service.client = self.client
        self.gone = found.gone
        self.remove_orphan_networks(services, now)
        return found.alive

    def remove_orphan_networks(self, services: list[Mapping], now: float) -> None:
        """Remove the session overlays whose service has been gone for `down_grace` seconds; one
        the manager refuses to remove now (a task still leaving it) is tried again next round."""
        networks = self.client.api.networks(filters={"label": SESSION_NETWORK_LABEL})
        self.orphan_since = orphan_networks(networks, services, self.orphan_since, now)
        for network_id, since in self.orphan_since.items():
            if now - since >= self.down_grace:
                with contextlib.suppress(docker.errors.APIError):
                    self._remove_network(network_id)

    def _remove_network(self, network_id: str) -> None:
        api = self.client.api
        # The members on the manager's own engine: the hub's container.
        for container_id in api.inspect_network(network_id).get("Containers") or {}:
            with contextlib.suppress(docker.errors.APIError):
                api.disconnect_container_from_network(container_id, network_id, force=True)
        api.remove_network(network_id)

    def why_gone(self, session_id: str) -> str | None:
        """Why the last round did not count a labelled session as alive (None: no service)."""
        gone = self.gone.get(session_id)
        return gone[0] if gone else None

    def remove_gone(self, session_ids: Iterable[str]) -> None:
        """Remove the services of sessions that ended as gone: a node that comes back after a
        partition then stops their tasks, instead of running them beside the slice's new owner."""
        for session_id in session_ids:
            if session_id in self.gone:
                self.gone[session_id][1].remove()
