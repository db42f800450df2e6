"""A Unix-socket forwarder to the real Docker engine that a test can take down and bring back.

The machine's dockerd is shared with other developers and cannot be stopped; pointing a hub (or
only its spawner) at this socket lets a test see what happens when the engine goes away and comes
back, with every request still served by the real engine while the forwarder is up. It can also
refuse chosen calls (say `docker stop`) with the engine's own kind of error answer, as an engine
does when it cannot stop a container, while it serves every other call.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
from pathlib import Path

ENGINE_SOCKET = "/var/run/docker.sock"


class EngineProxy:
    def __init__(self, path: Path, engine: str = ENGINE_SOCKET):
        self.path, self.engine = Path(path), engine
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._refused: list[tuple[str, re.Pattern]] = []

    def refuse(self, method: str, path_pattern: str) -> None:
        """Answer calls of `method` whose path matches `path_pattern` with a 500, from now on."""
        self._refused.append((method, re.compile(path_pattern)))

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def up(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """Stop answering: new connections are refused and open ones dropped."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # taken down
            engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            engine.connect(self.engine)
            with self._lock:
                self._open |= {client, engine}
            threading.Thread(target=self._requests, args=(client, engine), daemon=True).start()
            threading.Thread(target=_pump, args=(engine, client), daemon=True).start()

    def _requests(self, client: socket.socket, engine: socket.socket) -> None:
        """Pass the client's requests on one by one (docker-py waits for each answer before it
        sends the next), answering refused ones itself; raw once a body is chunked."""
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = client.recv(65536)
                    if not data:
                        engine.shutdown(socket.SHUT_WR)
                        return
                    buffer += data
                head, _, rest = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (x.partition(":") for x in lines[1:])
                }
                if "chunked" in headers.get("transfer-encoding", ""):
                    engine.sendall(buffer)
                    _pump(client, engine)
                    return
                length = int(headers.get("content-length", "0"))
                while len(rest) < length:
                    data = client.recv(65536)
                    if not data:
                        return
                    rest += data
                request, buffer = head + b"\r\n\r\n" + rest[:length], rest[length:]
                if any(m == method and p.search(path) for m, p in self._refused):
                    client.sendall(_error_answer(f"refused by the test: {method} {path}"))
                else:
                    engine.sendall(request)
        except OSError:
            pass


def _error_answer(message: str) -> bytes:
    body = json.dumps({"message": message}).encode()
    head = (
        "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
        target.shutdown(socket.SHUT_WR)
    except OSError:
        pass
