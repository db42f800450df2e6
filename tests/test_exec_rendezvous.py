"""The meeting point of a shell and its node agent's connection (engine/exec_rendezvous.py): an
order reaches the waiting poll of its node at once, a connection is admitted once, for its own
node, while its shell waits; a start the agent refuses, and an exit code, come back to the shell.
A shell on the Swarm (engine/swarm_exec.py) is refused at once on a node whose agent is silent,
and told a commit holds its session when the agent says so. The Swarm lab's hub test
(test_swarm_ssh_hub.py) runs the whole path with real agents."""

from __future__ import annotations

import asyncio
import socket

import pytest

from queue_service.core.errors import Refusal
from queue_service.engine.exec_rendezvous import ExecRendezvous, ExecStartRefused
from queue_service.engine.node_reports import NodeReports
from queue_service.engine.session_exec import SessionBusy
from queue_service.engine.swarm_exec import NodeContainer, SwarmExec

ORDER = {"container": "c1", "session_id": "s1", "command": ["sh"], "tty": False, "env": {}}


async def opened(rendezvous: ExecRendezvous, node: str = "w1", timeout: float = 30):
    """An open started for `node`, and the order its agent's poll took."""
    opening = asyncio.create_task(rendezvous.open(node, ORDER, timeout))
    (order,) = await rendezvous.take(node, 30)
    return opening, order


async def connected(rendezvous: ExecRendezvous, opening, order):
    """The agent's connection for `order`, as the shell gets it: (token, its end, the agent's)."""
    ours, theirs = socket.socketpair()
    rendezvous.claim("w1", order["token"]).set_result(ours)
    token, sock = await opening
    assert (token, sock) == (order["token"], ours)
    return token, ours, theirs


async def test_an_order_wakes_the_waiting_poll_of_its_node_only():
    rendezvous = ExecRendezvous()
    polls = {n: asyncio.create_task(rendezvous.take(n, 30)) for n in ("w1", "w2")}
    await asyncio.sleep(0)
    opening = asyncio.create_task(rendezvous.open("w1", ORDER, 30))
    (order,) = await polls["w1"]
    assert {**order, "token": "-"} == {**ORDER, "kind": "exec", "token": "-"}
    assert not polls["w2"].done()
    polls["w2"].cancel()
    opening.cancel()


async def test_a_connection_is_taken_once_for_its_own_node_while_its_shell_waits():
    rendezvous = ExecRendezvous()
    opening, order = await opened(rendezvous)
    with pytest.raises(Refusal, match="unknown, used already, or given to another node"):
        rendezvous.claim("w1", "no-such-token")
    with pytest.raises(Refusal, match="another node"):
        rendezvous.claim("w2", order["token"])
    token, ours, theirs = await connected(rendezvous, opening, order)
    with pytest.raises(Refusal, match="used already"):
        rendezvous.claim("w1", token)
    rendezvous.report("w2", [{"token": token, "exit_code": 9}])  # not its node's
    rendezvous.report("w1", [{"token": token, "exit_code": 3}])
    assert await rendezvous.exit_code(token, 30) == 3
    with pytest.raises(Refusal):  # forgotten once its code is read
        rendezvous.claim("w1", token)
    ours.close()
    theirs.close()


async def test_a_shell_that_waited_in_vain_withdraws_its_order_and_refuses_a_late_connection():
    rendezvous = ExecRendezvous()
    opening = asyncio.create_task(rendezvous.open("w1", ORDER, 0.05))
    with pytest.raises(ExecStartRefused, match="opened no connection for it within"):
        await opening
    assert await rendezvous.take("w1", 0) == []
    opening, order = await opened(rendezvous, timeout=0.05)
    with pytest.raises(ExecStartRefused):
        await opening
    with pytest.raises(Refusal):
        rendezvous.claim("w1", order["token"])


async def test_a_start_the_agent_refuses_reaches_the_shell_and_a_lost_exit_code_is_minus_one():
    rendezvous = ExecRendezvous()
    opening, order = await opened(rendezvous)
    busy = {"token": order["token"], "ok": False, "error": "being saved", "busy": True}
    rendezvous.report("w1", [busy])
    with pytest.raises(ExecStartRefused, match="being saved") as refused:
        await opening
    assert refused.value.busy
    token, ours, theirs = await connected(rendezvous, *await opened(rendezvous))
    assert await rendezvous.exit_code(token, 0.05) == -1
    ours.close()
    theirs.close()


async def test_a_resize_is_an_order_for_the_node_of_its_process():
    rendezvous = ExecRendezvous()
    opening, order = await opened(rendezvous)
    rendezvous.resize(order["token"], 120, 40)
    rendezvous.resize("no-such-token", 1, 1)
    resize = {"kind": "exec_resize", "token": order["token"], "width": 120, "height": 40}
    assert await rendezvous.take("w1", 0) == [resize]
    opening.cancel()


async def test_a_swarm_shell_is_refused_at_once_on_a_silent_node_and_busy_during_a_commit():
    reports = NodeReports()
    swarm = SwarmExec(None, reports.execs, reports, "hub", asyncio.get_running_loop())
    start = (swarm.start, NodeContainer("w1", "c1"), "s1", ["sh"], False, {})
    with pytest.raises(ExecStartRefused, match="w1, which runs this session, has not reported"):
        await asyncio.to_thread(*start)
    assert await reports.execs.take("w1", 0) == []
    reports.stale = lambda node: False  # as after a fresh report of w1
    starting = asyncio.create_task(asyncio.to_thread(*start))
    (order,) = await reports.execs.take("w1", 30)
    assert (order["container"], order["session_id"]) == ("c1", "s1")
    reports.execs.report("w1", [{"token": order["token"], "ok": False, "busy": True}])
    with pytest.raises(SessionBusy):
        await starting
