"""The node agents' shell channel (engine/exec_rendezvous.py): how a shell reaches a session on
another Swarm node, whose engine the service cannot reach.

- `POST api/nodes/{hostname}/exec-orders` with `{"results": [...]}`: the agent's long poll. The
  results (a start the agent refused, a process's exit code) are taken; the answer carries the
  shell orders waiting for that node (`{"node": ..., "orders": [...]}`), signed with the node's
  key as a report's answer is. Without results it is held open until an order comes, up to
  `POLL_HOLD_SECONDS`, so that a shell starts one round trip after it is asked for.
- `GET api/nodes/{hostname}/exec/{token}`, a WebSocket handshake: the connection the agent opens
  back for the process an order started. Answered `101 Switching Protocols`, its frames carry the
  process's bytes both ways from then on (engine/exec_websocket.py hands them to the waiting
  shell). Only for a token an order gave that node, once, while its shell waits: anything else is
  403, and nothing changes.

Both are the node agents' alone (their hub token, 403 for anyone else's) and signed with the key
of the node the URL names (node_identity.py `verify_once`: these requests overlap, so each nonce
is taken once rather than each time later than the last): another node's key, an old signature or
a replayed one gets 403.
"""

from __future__ import annotations

import json

from tornado import web

from node_agent.agent import websocket_accept
from queue_service.engine.exec_rendezvous import POLL_HOLD_SECONDS, ExecRendezvous
from queue_service.engine.exec_websocket import shell_socket

from .nodes import NodeAgentHandler

#: Results one post may carry (one per process that ended since the last).
MAX_RESULTS = 100


class ExecChannelHandler(NodeAgentHandler):
    """A request of the shell channel, whose orders and shells wait in the node reports' store."""

    @property
    def exec_rendezvous(self) -> ExecRendezvous:
        return self.node_reports.execs


class ExecOrdersHandler(ExecChannelHandler):
    """POST an agent's shell results; answered with its shell orders (a long poll)."""

    @web.authenticated
    async def post(self, node):
        request = self.request
        credential = self.node_identity.verify_once(
            node, request.method, request.path, request.headers, self.raw_body()
        )
        results = self.body().get("results", [])
        if not isinstance(results, list) or len(results) > MAX_RESULTS:
            raise web.HTTPError(400, f"results must be a list of at most {MAX_RESULTS} results.")
        if not all(isinstance(r, dict) for r in results):
            raise web.HTTPError(400, "Each result must be a JSON object.")
        execs = self.exec_rendezvous
        execs.report(node, results)
        orders = await execs.take(node, 0 if results else POLL_HOLD_SECONDS)
        self.finish_signed(credential, json.dumps({"node": node, "orders": orders}).encode())


class ExecConnectionHandler(ExecChannelHandler):
    """GET, upgraded to a WebSocket: the connection an agent opens back for a process it
    started."""

    @web.authenticated
    async def get(self, node, token):
        request = self.request
        self.node_identity.verify_once(node, "GET", request.path, request.headers, b"")
        key = request.headers.get("Sec-WebSocket-Key", "")
        if request.headers.get("Upgrade", "").lower() != "websocket" or not key:
            raise web.HTTPError(400, "Ask for the process's connection as a WebSocket.")
        connected = self.exec_rendezvous.claim(node, token)
        self.set_status(101)
        self.set_header("Connection", "Upgrade")
        self.set_header("Upgrade", "websocket")
        self.set_header("Sec-WebSocket-Accept", websocket_accept(key))
        self.finish()
        stream = request.connection.detach()
        await stream.write(b"")  # the 101 is out before the shell writes
        # A socket of the pump's own (asyncio's, not tornado's): the agent sends nothing before
        # the 101, so nothing is left in tornado's buffer.
        sock = stream.socket.dup()
        stream.close()
        shells = await shell_socket(sock)
        if connected.done():  # the shell gave up waiting meanwhile: the agent is told so
            shells.close()
        else:
            connected.set_result(shells)


def routes(prefix: str) -> list:
    return [
        (prefix + r"api/nodes/([^/]+)/exec-orders", ExecOrdersHandler),
        (prefix + r"api/nodes/([^/]+)/exec/([A-Za-z0-9_-]{1,64})", ExecConnectionHandler),
    ]
