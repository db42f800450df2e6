"""Where a shell in a session on another Swarm node meets the connection its node's agent opens.

The service cannot reach a node's engine; the node's agent (node_agent/agent.py) reaches the
service. So a process started in a session on another node (swarm_exec.py) goes:

1. an `exec` order for the agent of the session's node (container, command, terminal, variables,
   and a one-time `token`) waits here until the agent's long poll takes it (`take`, served by
   `POST api/nodes/{node}/exec-orders`, held open up to `POLL_HOLD_SECONDS` until an order comes:
   the agent has it one round trip after it is given, not at its next report);
2. the agent starts the process on its node's engine, hijacked as `docker exec -i` does, and
   opens a connection back to `GET api/nodes/{node}/exec/{token}`, a WebSocket signed with its
   node's key (exec_websocket.py). `claim` admits the token once, for the node it was given to alone, and the service
   pipes the shell through that connection as through a local exec's;
3. a terminal's new size is another order (`exec_resize`); the agent posts the process's exit
   code (`report`) before it closes its connection, so the shell's end finds it waiting.

Everything here runs on the event loop; swarm_exec.py calls in from its threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from dataclasses import dataclass, field

from queue_service.core.errors import Refusal

#: How long the orders endpoint holds an agent's poll without an order (the agent's own timeout
#: is longer, and a proxy between them must let a request last this long).
POLL_HOLD_SECONDS = 20.0
#: Orders waiting for one node's agent at most: a silent agent does not grow the service.
MAX_ORDERS_PER_NODE = 100
#: Shells on their way or running at most, all nodes together.
MAX_EXECS = 10_000


class ExecStartRefused(ConnectionError):
    """The process was not started on its node (its agent refused it, or did not answer);
    `busy`: a commit holds the container. An OSError, as a local engine's failure is."""

    def __init__(self, message: str, busy: bool = False):
        super().__init__(message)
        self.busy = busy


@dataclass
class PendingExec:
    """A process given to a node's agent: its connection and its exit code, as they come."""

    node: str
    connected: asyncio.Future = field(repr=False)
    exited: asyncio.Future = field(repr=False)
    claimed: bool = False


class ExecRendezvous:
    """Exec orders waiting for each node's agent, and the processes they started."""

    def __init__(self):
        self._orders: dict[str, list[dict]] = {}
        self._wake: dict[str, asyncio.Event] = {}
        self._execs: dict[str, PendingExec] = {}

    # -- orders -----------------------------------------------------------------------------

    def give(self, node: str, order: dict) -> None:
        waiting = self._orders.setdefault(node, [])
        if len(waiting) >= MAX_ORDERS_PER_NODE:
            raise ExecStartRefused(f"The agent of node {node} takes no orders now.")
        waiting.append(order)
        self._wake.setdefault(node, asyncio.Event()).set()

    async def take(self, node: str, hold: float) -> list[dict]:
        """The orders waiting for `node`'s agent, waiting up to `hold` seconds for one."""
        if not self._orders.get(node):
            wake = self._wake.setdefault(node, asyncio.Event())
            wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), hold)
        return self._orders.pop(node, [])

    def _withdraw(self, node: str, token: str) -> None:
        left = [o for o in self._orders.get(node, []) if o.get("token") != token]
        if left:
            self._orders[node] = left
        else:
            self._orders.pop(node, None)

    # -- one process ---------------------------------------------------------------------------

    async def open(self, node: str, order: dict, timeout: float) -> tuple[str, socket.socket]:
        """Give `order` (an exec) to `node`'s agent; its token and the agent's connection, once
        the agent has started the process. ExecStartRefused when it did not, or when no
        connection came within `timeout` (the order is withdrawn, and a late one refused)."""
        if len(self._execs) >= MAX_EXECS:
            raise ExecStartRefused("Too many shells are open on the Swarm's nodes now.")
        token = secrets.token_urlsafe(24)
        loop = asyncio.get_running_loop()
        pending = PendingExec(node, loop.create_future(), loop.create_future())
        self._execs[token] = pending
        self.give(node, {**order, "kind": "exec", "token": token})
        try:
            sock = await asyncio.wait_for(asyncio.shield(pending.connected), timeout)
        except TimeoutError:
            self._forget(token)
            raise ExecStartRefused(
                f"the agent of node {node} opened no connection for it within {timeout:g} s "
                "(is it running, and of this hub's version?)"
            ) from None
        except BaseException:
            self._forget(token)
            raise
        return token, sock

    def _forget(self, token: str) -> None:
        pending = self._execs.pop(token, None)
        if pending is None:
            return
        self._withdraw(pending.node, token)
        connected = pending.connected
        if connected.done() and not connected.cancelled() and connected.exception() is None:
            connected.result().close()  # came too late: nobody pipes it
        connected.cancel()
        pending.exited.cancel()

    def claim(self, node: str, token: str) -> asyncio.Future:
        """The future that takes the connection `node`'s agent opens for `token`: once, for the
        node the order went to, while its shell waits; else a 403 Refusal, and nothing changes."""
        pending = self._execs.get(token)
        if pending is None or pending.node != node or pending.claimed:
            raise Refusal(
                "No shell waits for this connection: its token is unknown, used already, "
                "or given to another node.",
                "forbidden",
            )
        pending.claimed = True
        return pending.connected

    def report(self, node: str, results: list[dict]) -> None:
        """Results `node`'s agent posts: a start it refused, or a process's exit code."""
        for result in results:
            pending = self._execs.get(str(result.get("token")))
            if pending is None or pending.node != node:
                continue  # not a shell of this node's: another node's, or an old one
            if result.get("ok") is False and not pending.connected.done():
                error = str(result.get("error") or "the agent did not start it")[:1000]
                refused = ExecStartRefused(error, busy=result.get("busy") is True)
                pending.connected.set_exception(refused)
            code = result.get("exit_code")
            if isinstance(code, int) and not isinstance(code, bool) and not pending.exited.done():
                pending.exited.set_result(code)

    def resize(self, token: str, width: int, height: int) -> None:
        pending = self._execs.get(token)
        if pending is not None:
            order = {"kind": "exec_resize", "token": token, "width": width, "height": height}
            with contextlib.suppress(
                ExecStartRefused
            ):  # a size lost to a silent agent is no failure
                self.give(pending.node, order)

    async def exit_code(self, token: str, timeout: float) -> int:
        """The process's exit code, once the agent posts it; -1 when it does not within
        `timeout` (its node or its container went away). The process is forgotten then."""
        pending = self._execs.get(token)
        if pending is None:
            return -1
        try:
            return await asyncio.wait_for(asyncio.shield(pending.exited), timeout)
        except TimeoutError:
            return -1
        finally:
            self._forget(token)
