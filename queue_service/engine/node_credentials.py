"""Each Swarm node's own key: the credential its node agent signs reports with.

One key per Swarm node id, made when the agent is deployed on that node
(`node_agent_deploy.deploy_node_agents`) and handed to that node's agent alone, as a Swarm secret
its service (pinned to the node id) mounts. The queue service checks every report against the
key of the node id it names, and that the node id is the one whose hostname the report's URL
names (node_identity.py). Rotating a node's key (`fgpu-hub node-agent rotate NODE`, or
`POST api/nodes/{hostname}/key` for admins) makes a new one; the old one stops working at once.

The keys live in one JSON file of the hub's state directory (mode 0600, written whole and renamed
into place), read again whenever it changed, so that a rotation made by another process (the
command, while the service runs) counts at once:

    {"nodes": {"<swarm node id>": {"hostname": "...", "key": "<64 hex>", "made": "<UTC iso>"}}}
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from queue_service.core.errors import Refusal

CREDENTIALS_FILE = "fgpu_node_credentials.json"
#: A Swarm node id: 25 lowercase letters and digits (checked loosely: any engine's ids).
NODE_ID_RE = re.compile(r"^[a-z0-9]{10,64}$")


@dataclass(frozen=True)
class NodeCredential:
    node_id: str
    hostname: str
    key: str
    made: str


class NodeCredentials:
    """The per-node keys, kept in `path` (relative: in the state directory)."""

    def __init__(self, path: str | os.PathLike = CREDENTIALS_FILE):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._seen: tuple[int, int] | None = None
        self._nodes: dict[str, NodeCredential] = {}

    # -- reading ------------------------------------------------------------------------------

    def get(self, node_id: str) -> NodeCredential | None:
        with self._lock:
            return self._load().get(node_id)

    def all(self) -> list[NodeCredential]:
        with self._lock:
            return sorted(self._load().values(), key=lambda c: c.hostname)

    def by_hostname(self, hostname: str) -> NodeCredential | None:
        found = [c for c in self.all() if hostname in (c.hostname, c.node_id)]
        return found[0] if len(found) == 1 else None

    # -- changing -----------------------------------------------------------------------------

    def ensure(self, node_id: str, hostname: str) -> NodeCredential:
        """The node's key, made when it has none; a node whose hostname changed keeps its key."""
        _check_node_id(node_id)
        with self._lock:
            nodes = self._load()
            holder = next((c for c in nodes.values() if c.hostname == hostname), None)
            if holder is not None and holder.node_id != node_id:
                # Reports, orders and results go by hostname: a second node of the same name (a
                # clone, or a node renamed to pass for another) must not sign as the first.
                raise Refusal(
                    f"Node {node_id} has the hostname {hostname!r} of node {holder.node_id}, "
                    "whose agent holds a key for it: give every node its own hostname.",
                    "conflict",
                )
            current = nodes.get(node_id)
            if current is not None and current.hostname == hostname:
                return current
            made = _new(node_id, hostname) if current is None else None
            nodes[node_id] = made or NodeCredential(node_id, hostname, current.key, current.made)
            self._save(nodes)
            return nodes[node_id]

    def rotate(self, node: str) -> NodeCredential:
        """A new key for the node (its id or hostname): the old one is refused from now on."""
        current = self.by_hostname(node)
        if current is None:
            raise Refusal(f"No node agent key is kept for node {node!r}.", "not_found")
        with self._lock:
            nodes = self._load()
            nodes[current.node_id] = _new(current.node_id, current.hostname)
            self._save(nodes)
            return nodes[current.node_id]

    def keep_only(self, node_ids: Iterable[str]) -> list[str]:
        """Forget the keys of nodes that left the Swarm; the hostnames forgotten."""
        keep = set(node_ids)
        with self._lock:
            nodes = self._load()
            gone = [c.hostname for node_id, c in nodes.items() if node_id not in keep]
            if gone:
                self._save({k: c for k, c in nodes.items() if k in keep})
            return gone

    # -- the file -----------------------------------------------------------------------------

    def _load(self) -> dict[str, NodeCredential]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._seen, self._nodes = None, {}
            return self._nodes
        if stat.st_mode & 0o077:
            raise Refusal(f"{self.path} is readable by others: chmod 600 {self.path}", "conflict")
        if self._seen != (stat.st_mtime_ns, stat.st_size):
            self._nodes = _parse(self.path.read_text())
            self._seen = (stat.st_mtime_ns, stat.st_size)
        return self._nodes

    def _save(self, nodes: dict[str, NodeCredential]) -> None:
        data = {
            "nodes": {
                k: {f: v for f, v in asdict(c).items() if f != "node_id"}
                for k, c in sorted(nodes.items())
            }
        }
        folder = self.path.parent if str(self.path.parent) else Path(".")
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=".node-credentials-")
        try:
            with os.fdopen(fd, "w") as file:  # mkstemp makes it 0600
                json.dump(data, file, indent=1)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        self._nodes, self._seen = dict(nodes), None


def _new(node_id: str, hostname: str) -> NodeCredential:
    made = datetime.now(UTC).isoformat(timespec="seconds")
    return NodeCredential(node_id, hostname, secrets.token_hex(32), made)


def _check_node_id(node_id: str) -> None:
    if not NODE_ID_RE.match(node_id or ""):
        raise Refusal(f"{node_id!r} is not a Swarm node id.", "invalid")


def _parse(text: str) -> dict[str, NodeCredential]:
    try:
        nodes = json.loads(text)["nodes"]
        return {
            node_id: NodeCredential(node_id, str(c["hostname"]), str(c["key"]), str(c["made"]))
            for node_id, c in nodes.items()
        }
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise Refusal(
            f"The node keys file is damaged ({e}); remove it to make new keys.", "conflict"
        ) from None
