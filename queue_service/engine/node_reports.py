"""What the node agents report: the last report of every Swarm node, and orders waiting for a node.

A node agent (`node_agent/agent.py`, a global Swarm service) POSTs a report every few seconds to
`api/nodes/{hostname}/report` (handlers/nodes.py). `parse_report` checks the body (pure; a bad one
is a ValueError whose text is the 400's message, and nothing is stored); `NodeReports` keeps the
last report per node with the time it came in, and answers:

- `usage(session_id)`: the live usage of a session on any node, in the stats sampler's shape
  (`stats.Usage`), so pages and the sampler read sessions on other nodes as they read local ones;
- `gpus(node)`: the GPUs NVML sees on that node (None: no fresh report, or no NVML there);
- `session_ids(node)`: the session containers the node says it runs (None when its report is stale
  or missing: unknown is not "none", so the reconciler never ends sessions on a silent node from
  this alone);
- `stale(node)`: no report within `stale_after` seconds;
- in `nodes()`, each node's engine settings (`daemon`: `icc`, `no_new_privileges`) and what is wrong
  with them (`isolation_problems`). A report without `daemon`, or with a setting the agent could
  not read (null), is taken as "unknown", which is flagged like a wrong value; the queue service
  places no session on a node whose value is wrong (`wrong_daemon_settings`; swarm_engine.py,
  `isolation_refused`).

A report of another `REPORT_VERSION` (an agent of another version of the hub, still running until
the queue service deploys its own at start) is refused whole: its answer's orders would not be
carried out.

Orders for a node's agent (a commit on the node that runs a session, then a push; a pull of a
catalog image ahead of its first session there, image_prepull.py) wait in
`queue_order` until the answer to the node's next report carries them (`take_orders`); their
results come back in a later report's `order_results` (`order_result`). A result counts only when
it comes from the node its order was given to, and says what its order asked (the same image; ids
that are digests): a node cannot answer another node's commits.

Shells in sessions on a node go by orders too, on the agents' shell channel, whose orders
wait in `execs` (exec_rendezvous.py).

Identity: the handler takes a report only once node_identity.py has checked that it is signed
with the key of the node the URL names, so `put(report)` trusts `report.node`. A body naming
another node is refused too (400). A drained node still runs sessions and may report; the store
keeps at most `max_nodes` nodes, so a misbehaving agent cannot grow it without bound.
"""

from __future__ import annotations

import asyncio
import math
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from node_agent.agent import REPORT_VERSION
from queue_service.core.errors import Refusal
from queue_service.engine.exec_rendezvous import ExecRendezvous
from queue_service.engine.stats import Usage

#: A Swarm hostname: a DNS name (labels of letters, digits, '-', '_'), at most 253 characters.
NODE_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,252})$")
SESSION_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
DEFAULT_MAX_NODES = 10_000
#: What a report without the `daemon` field says of the node's engine.
UNKNOWN_DAEMON = {"icc": None, "no_new_privileges": None}
#: Each daemon setting a session's isolation needs: the value it must have, and what its absence
#: lets a session do. The engine's daemon.json says `"icc": false, "no-new-privileges": true`.
REQUIRED_DAEMON = {
    "icc": (False, "sessions on the node's bridge can reach one another"),
    "no_new_privileges": (True, "a setuid program in a session can gain privileges"),
}
DAEMON_FIX = (
    'set "icc": false and "no-new-privileges": true in the node\'s /etc/docker/daemon.json, '
    "restart its engine, and run the current node agent (docs/source/howto/adding-nodes.md, 'Adding nodes')"
)
#: Results of orders kept per node until someone reads them.
MAX_RESULTS_PER_NODE = 100
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
#: Repository digests a report may list (a node holding more is far beyond any catalog).
MAX_IMAGES = 10_000


@dataclass(frozen=True)
class SessionUsage:
    container: str
    state: str
    cpu_percent: float | None
    mem_bytes: int
    mem_limit_bytes: int


@dataclass(frozen=True)
class NodeGpu:
    uuid: str
    name: str
    index: int
    memory_total: int
    memory_used: int
    util_percent: float | None


@dataclass(frozen=True)
class NodeReport:
    node: str
    sampled_at: str
    sessions: dict[str, SessionUsage]
    gpus: tuple[NodeGpu, ...] | None
    order_results: tuple[dict, ...]
    agent: dict
    size: int
    received: float = 0.0
    #: The node engine's settings that keep sessions apart (`icc`, `no_new_privileges`): True,
    #: False or None (unknown: the agent could not tell, or did not say).
    daemon: dict = field(default_factory=lambda: dict(UNKNOWN_DAEMON))
    #: The repository digests of the images the node's engine holds (`<repo>@sha256:...`); None
    #: from an agent that does not list them.
    images: frozenset[str] | None = None


def parse_report(node: str, data: Any, size: int = 0) -> NodeReport:
    """A node agent's report for `node` (the URL's hostname), or ValueError saying what is wrong."""
    if not NODE_NAME_RE.match(node or ""):
        raise ValueError(f"{node!r} is not a node's hostname.")
    if not isinstance(data, Mapping):
        raise ValueError("A report is a JSON object.")
    if data.get("version") != REPORT_VERSION:
        raise ValueError(
            f"Unknown report version {data.get('version')!r}; expected {REPORT_VERSION} "
            "(the node runs an agent of another version of the hub: the queue service deploys "
            "its own agent at start)."
        )
    if data.get("node") != node:
        raise ValueError(
            f"The report names node {data.get('node')!r} but was sent for {node!r}; "
            "an agent reports only for its own node."
        )
    return NodeReport(
        node=node,
        sampled_at=_text(data, "sampled_at"),
        sessions=_sessions(data.get("sessions")),
        gpus=_gpus(data.get("gpus")),
        order_results=_order_results(data.get("order_results", [])),
        agent=_agent(data.get("agent", {})),
        size=size,
        daemon=_daemon(data.get("daemon")),
        images=_images(data.get("images")),
    )


def wrong_daemon_settings(daemon: Mapping) -> list[str]:
    """The settings a node's engine reports with the wrong value (unknown ones left out): the
    queue places no session on such a node."""
    return [
        key
        for key, (needed, _risk) in REQUIRED_DAEMON.items()
        if daemon.get(key) is not None and daemon[key] != needed
    ]


def isolation_problems(daemon: Mapping) -> list[str]:
    """What is wrong with a node engine's settings for isolating sessions ([] when nothing)."""
    problems = []
    for key, (needed, risk) in REQUIRED_DAEMON.items():
        value = daemon.get(key)
        if value is None:
            problems.append(f"{key} unknown (the node's agent does not report it): {risk} if off")
        elif value != needed:
            problems.append(f"{key} is {str(value).lower()}: {risk}")
    return problems


def _text(data: Mapping, key: str, limit: int = 256) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value or len(value) > limit:
        raise ValueError(f"{key} must be a non-empty string of at most {limit} characters.")
    return value


def _count(data: Mapping, key: str, where: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: {key} must be a whole number of at least 0.")
    return value


def _percent(data: Mapping, key: str, where: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}: {key} must be a number or null.")
    if value < 0:
        raise ValueError(f"{where}: {key} must not be negative.")
    return float(value)


def _sessions(value: Any) -> dict[str, SessionUsage]:
    if not isinstance(value, Mapping):
        raise ValueError("sessions must be an object of session id → usage.")
    sessions = {}
    for session_id, usage in value.items():
        where = f"session {session_id!r}"
        if not SESSION_ID_RE.match(session_id):
            raise ValueError(f"{where}: not a session id.")
        if not isinstance(usage, Mapping):
            raise ValueError(f"{where}: its usage must be an object.")
        sessions[session_id] = SessionUsage(
            container=_text(usage, "container", 128),
            state=str(usage.get("state") or "running")[:32],
            cpu_percent=_percent(usage, "cpu_percent", where),
            mem_bytes=_count(usage, "mem_bytes", where),
            mem_limit_bytes=_count(usage, "mem_limit_bytes", where),
        )
    return sessions


def _gpus(value: Any) -> tuple[NodeGpu, ...] | None:
    if value is None:
        return None  # no NVML on the node
    if not isinstance(value, list):
        raise ValueError("gpus must be a list, or null on a node without NVML.")
    gpus = []
    for position, gpu in enumerate(value):
        where = f"GPU {position}"
        if not isinstance(gpu, Mapping):
            raise ValueError(f"{where} must be an object.")
        gpus.append(
            NodeGpu(
                uuid=_text(gpu, "uuid", 96),
                name=_text(gpu, "name", 96),
                index=_count(gpu, "index", where),
                memory_total=_count(gpu, "memory_total", where),
                memory_used=_count(gpu, "memory_used", where),
                util_percent=_percent(gpu, "util_percent", where),
            )
        )
    return tuple(gpus)


def _order_results(value: Any) -> tuple[dict, ...]:
    if not isinstance(value, list) or not all(
        isinstance(result, Mapping) and isinstance(result.get("id"), str) for result in value
    ):
        raise ValueError("order_results must be a list of results of orders, each with its id.")
    return tuple(dict(result) for result in value)


def _agent(value: Any) -> dict:
    if not isinstance(value, Mapping):
        raise ValueError("agent must be an object.")
    return {k: v for k, v in value.items() if k in ("rss_bytes", "cpu_seconds")}


def _images(value: Any) -> frozenset[str] | None:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) > MAX_IMAGES
        or not all(isinstance(v, str) and 0 < len(v) <= 512 for v in value)
    ):
        raise ValueError(
            f"images must be a list of at most {MAX_IMAGES} image references "
            "(of at most 512 characters each)."
        )
    return frozenset(value)


def _daemon(value: Any) -> dict:
    if value is None:
        return dict(UNKNOWN_DAEMON)  # not said: unknown, and flagged
    if not isinstance(value, Mapping):
        raise ValueError("daemon must be an object of the engine's settings.")
    daemon = {}
    for key in REQUIRED_DAEMON:
        setting = value.get(key)
        if setting is not None and not isinstance(setting, bool):
            raise ValueError(f"daemon: {key} must be true, false or null.")
        daemon[key] = setting
    return daemon


def checked_result(order: Mapping, result: Mapping, node: str) -> dict:
    """An agent's result as it may be believed: a successful commit or pull must name the
    order's own image, and a commit give digests for its ids, or it counts as a failure saying
    so."""
    result = {**result, "node": node, "kind": order.get("kind")}
    if not result.get("ok"):
        return {**result, "ok": False, "error": str(result.get("error") or "failed")[:1000]}
    faults = []
    if result.get("image") != order.get("image"):
        faults.append(f"image {str(result.get('image'))[:200]!r} is not the order's")
    if order.get("kind") == "pull":
        return _judged(result, faults)
    if not DIGEST_RE.match(str(result.get("image_id"))):
        faults.append("image_id is not a sha256 digest")
    digest = result.get("digest")
    if order.get("push", True) and not DIGEST_RE.match(str(digest)):
        faults.append("digest is not a sha256 digest")
    return _judged(result, faults)


def _judged(result: dict, faults: list[str]) -> dict:
    if faults:
        return {**result, "ok": False, "error": "the agent's result is wrong: " + "; ".join(faults)}
    return dict(result)


class NodeReports:
    """The last report of every node, and the orders and their results on their way."""

    def __init__(
        self,
        stale_after: float = 20.0,
        clock: Callable[[], float] = time.monotonic,
        max_nodes: int = DEFAULT_MAX_NODES,
    ):
        self.stale_after, self.clock, self.max_nodes = stale_after, clock, max_nodes
        self._nodes: dict[str, NodeReport] = {}
        self._where: dict[str, str] = {}  # session id → node whose last report has it
        self._orders: dict[str, list[dict]] = {}
        self._results: dict[str, dict] = {}
        self._waiting: dict[str, asyncio.Future] = {}
        self._given: dict[str, tuple[str, dict]] = {}  # order id → (node, order) its agent took
        #: The shells' orders, which the agents take on a channel of their own.
        self.execs = ExecRendezvous()

    def put(self, report: NodeReport) -> None:
        if report.node not in self._nodes and len(self._nodes) >= self.max_nodes:
            raise Refusal(f"Reports of {self.max_nodes} nodes are kept already.", "unavailable")
        previous = self._nodes.get(report.node)
        if previous is not None:
            for session_id in previous.sessions:
                if self._where.get(session_id) == report.node:
                    del self._where[session_id]
        self._nodes[report.node] = replace(report, received=self.clock())
        for session_id in report.sessions:
            self._where[session_id] = report.node
        for result in report.order_results:
            given = self._given.get(result["id"])
            if given is None or given[0] != report.node:
                continue  # not an order of this node: another node's, or none at all
            del self._given[result["id"]]
            result = checked_result(given[1], result, report.node)
            self._results[result["id"]] = result
            waiter = self._waiting.get(result["id"])
            if waiter is not None and not waiter.done():
                waiter.set_result(result)
        self._trim(self._results)
        self._trim(self._given)

    def _trim(self, kept: dict) -> None:
        excess = len(kept) - MAX_RESULTS_PER_NODE * max(1, len(self._nodes))
        for order_id in list(kept)[: max(0, excess)]:
            del kept[order_id]

    # -- reading ------------------------------------------------------------------------------

    def report(self, node: str) -> NodeReport | None:
        return self._nodes.get(node)

    def age(self, node: str) -> float | None:
        report = self._nodes.get(node)
        return None if report is None else self.clock() - report.received

    def stale(self, node: str) -> bool:
        age = self.age(node)
        return age is None or age > self.stale_after

    def fresh(self, node: str) -> NodeReport | None:
        return None if self.stale(node) else self._nodes[node]

    def usage(self, session_id: str) -> dict | None:
        """The session's usage in the stats sampler's shape, from its node's fresh report."""
        node = self._where.get(session_id)
        report = self.fresh(node) if node else None
        if report is None:
            return None
        used = report.sessions[session_id]
        return asdict(
            Usage(
                cpu_percent=used.cpu_percent,
                mem_bytes=used.mem_bytes,
                mem_limit_bytes=used.mem_limit_bytes,
                gpu_mem_bytes=None,
                gpu_util_percent=None,
                sampled_at=report.sampled_at,
            )
        )

    def gpus(self, node: str) -> tuple[NodeGpu, ...] | None:
        report = self.fresh(node)
        return None if report is None else report.gpus

    def session_ids(self, node: str) -> set[str] | None:
        report = self.fresh(node)
        return None if report is None else set(report.sessions)

    def nodes(self) -> list[dict]:
        """Every node that ever reported, for admins: age, staleness, GPUs and sessions."""
        return [
            {
                "node": name,
                "age_seconds": round(self.age(name), 3),
                "stale": self.stale(name),
                "sampled_at": report.sampled_at,
                "report_bytes": report.size,
                "agent": report.agent,
                "daemon": report.daemon,
                "isolation_problems": isolation_problems(report.daemon),
                "gpus": None if report.gpus is None else [asdict(g) for g in report.gpus],
                "sessions": {sid: asdict(u) for sid, u in report.sessions.items()},
                "orders_waiting": len(self._orders.get(name, [])),
            }
            for name, report in sorted(self._nodes.items())
        ]

    # -- orders -------------------------------------------------------------------------------

    def queue_order(self, node: str, order: dict) -> None:
        """An order for the agent of `node`, given in the answer to its next report."""
        self._orders.setdefault(node, []).append(dict(order))

    def take_orders(self, node: str) -> list[dict]:
        """The orders waiting for `node`, given to its agent (whose identity the caller checked)."""
        orders = self._orders.pop(node, [])
        for order in orders:
            self._given[order["id"]] = (node, order)
        return orders

    def order_result(self, order_id: str) -> dict | None:
        return self._results.get(order_id)

    async def run_order(self, node: str, order: dict, timeout: float) -> dict:
        """Give `order` to the agent of `node` and wait for its result (a Refusal when the node is
        silent, or when no result comes within `timeout`: then the order is withdrawn if still
        untaken; one already taken may still finish, and its result is kept in `order_result`)."""
        if self.stale(node):
            raise Refusal(
                f"Node {node} has no fresh report from its agent; nothing can be done there now.",
                "unavailable",
            )
        order = {**order, "id": order.get("id") or secrets.token_hex(8)}
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[order["id"]] = waiter
        self.queue_order(node, order)
        try:
            return await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            raise Refusal(
                f"The agent of node {node} gave no result within {timeout:g} s.", "unavailable"
            ) from None
        finally:
            self._waiting.pop(order["id"], None)
            left = [o for o in self._orders.get(node, []) if o["id"] != order["id"]]
            if left:
                self._orders[node] = left
            else:
                self._orders.pop(node, None)
