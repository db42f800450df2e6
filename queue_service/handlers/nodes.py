"""`api/nodes`: the node agents' reports.

- `POST api/nodes/{hostname}/report`: a node agent's report (`node_reports.parse_report`); the
  answer carries the orders waiting for that node's agent (`{"node": ..., "orders": [...]}`),
  signed with the node's key: among them, pulls of the catalog's images the node lacks
  (engine/image_prepull.py), decided as the report comes in.
  Only the hub service whose token the agents hold (`agent_service`) may report: a student's
  token, an admin's, the spawner's or a cookie gets 403. The report must also be signed with the
  key of the node the URL names, now, and never before (node_identity.py): another node's key, a
  replay or a stale report gets 403. A body that is not a report gets 400 with its fault; nothing
  of a refused report is stored.
- `POST api/nodes/{hostname}/key`: admins; a new key for that node's agent (its old one is refused
  at once), and the agent's service moved to it (`fgpu-hub node-agent rotate NODE` calls it).
- `GET api/nodes`: admins; every node that reported, with its age, GPUs and sessions' usage.
- `POST api/nodes/{hostname}/commits` with `{session_id, user, tag}`: admins; the node's agent
  commits the session's container to `<registry>/fgpu-private/<user>:<tag>` and pushes it
  (engine/node_commits.py), so any node can start it. 201 with the image and its digest; 503 when the
  node's agent is silent, 502 when the commit or push failed, 409 when no registry is configured.
  This is the Swarm path of `POST sessions/{id}/image`, which is to route through it.
"""

from __future__ import annotations

import json

from tornado import web

from node_agent.agent import NONCE_HEADER, SIGNATURE_HEADER, answer_signature
from queue_service.engine.node_commits import commit_on_node
from queue_service.engine.node_reports import parse_report

from ..private_images import session_commit
from .base import BaseHandler


class NodeAgentHandler(BaseHandler):
    """A request only the node agents' hub identity may make (their key is checked after)."""

    async def admit(self) -> None:
        await super().admit()
        identity = self.identity()
        if identity.get("kind") != "service" or identity.get("name") != self.agent_service:
            raise web.HTTPError(403, "Only the hub's node agents may report a node's usage.")

    def finish_signed(self, credential, answer: bytes) -> None:
        """Answer with `answer` signed with the node's key and the request's nonce: the agent
        carries out only orders this service gave its node."""
        nonce = self.request.headers[NONCE_HEADER]
        self.set_header(SIGNATURE_HEADER, answer_signature(credential.key, nonce, answer))
        self.set_header("Content-Type", "application/json")
        self.finish(answer)


class NodeReportHandler(NodeAgentHandler):
    """POST a node's report; for the node agents' identity alone."""

    @web.authenticated
    async def post(self, node):
        store, identity = self.node_reports, self.node_identity
        request = self.request
        credential, signed_at = identity.verify(
            node, request.method, request.path, request.headers, self.raw_body()
        )
        try:
            report = parse_report(node, self.body(), size=self._received)
        except ValueError as e:
            raise web.HTTPError(400, f"Not a node report: {e}") from None
        identity.check_sampled_at(report.sampled_at, signed_at)
        store.put(report)
        self.engine_backend.note_report(node)  # pulls of the catalog's images it lacks, say
        answer = json.dumps({"node": node, "orders": store.take_orders(node)}).encode()
        self.finish_signed(credential, answer)


class NodeKeyHandler(BaseHandler):
    """POST a new key for a node's agent (admins)."""

    @web.authenticated
    async def post(self, node):
        self.require_admin("Rotating a node agent's key")
        rotated = await self.rotate_node_key(node)
        self.write_json(
            {"node": rotated.hostname, "node_id": rotated.node_id, "made": rotated.made}
        )


class NodesHandler(BaseHandler):
    """GET every node's last report (admins)."""

    @web.authenticated
    async def get(self):
        self.require_admin("Reading the nodes' reports")
        store = self.node_reports
        self.write_json({"stale_after": store.stale_after, "nodes": store.nodes()})


class NodeCommitsHandler(BaseHandler):
    """POST a commit of a session on its node (admins)."""

    @web.authenticated
    async def post(self, node):
        self.require_admin("Saving a session on its node")
        data = self.body()
        for key in ("session_id", "user", "tag"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise web.HTTPError(400, f"{key} is missing: send session_id, user and tag.")
        registry = self.node_agent_registry
        if not registry:
            raise web.HTTPError(409, "No registry is configured (SwarmEngine.node_agent_registry).")
        result = await commit_on_node(
            self.node_reports,
            node,
            data["session_id"],
            session_commit(data["session_id"], data["user"], data["tag"]),
            registry,
        )
        self.write_json(result, 201)


def routes(prefix: str) -> list:
    return [
        (prefix + r"api/nodes", NodesHandler),
        (prefix + r"api/nodes/([^/]+)/commits", NodeCommitsHandler),
        (prefix + r"api/nodes/([^/]+)/report", NodeReportHandler),
        (prefix + r"api/nodes/([^/]+)/key", NodeKeyHandler),
    ]
