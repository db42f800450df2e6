"""A node agent's connection back for a shell (exec_rendezvous.py), handed to the shell as a
plain socket, as a local exec's connection is.

The connection is a WebSocket: proxies pass it (configurable-http-proxy, the hub's, passes no
other upgrade), so the agents reach the service through the hub's public address as their
reports do. Its binary frames carry the process's bytes (node_agent/agent.py frames them); a
close frame ends one way, as a half-close does: the shell's end of input goes to the agent so,
and the agent's close frame, or its connection's end, is the end of the process's output.

`shell_socket` pumps between the connection and one end of a socket pair, in a task of the event
loop, and gives the shell the other end.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from node_agent.agent import BINARY, CLOSE, CONTINUATION, WebSocketFrames, websocket_frame

READ_BYTES = 65536
#: The pumps running (the loop keeps only weak references to tasks).
_pumps: set[asyncio.Task] = set()


async def shell_socket(connection: socket.socket) -> socket.socket:
    """The shell's end of a socket pair whose other end is pumped to and from `connection`."""
    ours, shells = socket.socketpair()
    agent = await asyncio.open_connection(sock=connection)
    shell = await asyncio.open_connection(sock=ours)
    pump = asyncio.create_task(_pump(agent, shell))
    _pumps.add(pump)
    pump.add_done_callback(_pumps.discard)
    return shells


async def _pump(agent, shell) -> None:
    (agent_reader, agent_writer), (shell_reader, shell_writer) = agent, shell
    output = asyncio.create_task(_output(agent_reader, shell_writer))
    try:
        with contextlib.suppress(OSError):
            await _input(shell_reader, agent_writer)
        await output
    finally:
        output.cancel()
        for writer in (agent_writer, shell_writer):
            writer.close()


async def _input(shell_reader, agent_writer) -> None:
    """The shell's bytes to the agent; its end, a close frame."""
    while data := await shell_reader.read(READ_BYTES):
        agent_writer.write(websocket_frame(data))
        await agent_writer.drain()
    agent_writer.write(websocket_frame(b"", CLOSE))
    await agent_writer.drain()


async def _output(agent_reader, shell_writer) -> None:
    """The process's bytes to the shell, until the agent's close frame or its connection's end."""
    frames = WebSocketFrames()
    with contextlib.suppress(OSError, ValueError):
        while data := await agent_reader.read(READ_BYTES):
            for opcode, payload in frames.feed(data):
                if opcode == CLOSE:
                    return shell_writer.write_eof()
                if opcode in (CONTINUATION, BINARY):
                    shell_writer.write(payload)
            await shell_writer.drain()
    with contextlib.suppress(OSError):
        shell_writer.write_eof()
