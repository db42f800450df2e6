"""Who sends a body is known before the body is read: an upload's chunk (up to 8 MiB, the files
route) from a caller the hub does not know is a 401 at once, read no further, however many come
together; a bad token's small body still gets its 401 after it is read (handlers/base.py)."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from queue_service.handlers.folders import CHUNK_BYTES

from .harness import QueueUser
from .test_folders_hub import OCTETS, made
from .test_security_handlers import service_address

pytestmark = [pytest.mark.docker, pytest.mark.hub]


def first_answer(host: str, port: int, path: str, head: str) -> bytes:
    """Send a PUT's headers announcing a whole chunk and only its first kilobyte, then wait for
    the answer: one that comes was given before the body was read (the rest is never sent)."""
    with socket.create_connection((host, port), timeout=60) as sock:
        sock.sendall(
            f"PUT {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {CHUNK_BYTES}\r\n{head}\r\n".encode()
        )
        sock.sendall(b"x" * 1024)
        return sock.recv(65536)


def test_an_anonymous_upload_is_refused_before_its_body_is_read(hub, username):
    owner = QueueUser(hub, username)
    folder = made(owner, "work")
    host, port = service_address(hub)
    path = f"/services/queue/api/folders/{folder['id']}/files/big.bin?offset=0"
    for head in ("", "Authorization: token not-a-token\r\n"):
        answer = first_answer(host, port, path, head)
        assert answer.split()[1] == b"401", answer
        assert b"Log in to the hub first." in answer
    # Many at once: each answered on its first kilobyte, none held while its body would come.
    with ThreadPoolExecutor(max_workers=40) as pool:
        answers = list(pool.map(lambda _: first_answer(host, port, path, ""), range(40)))
    assert {a.split()[1] for a in answers} == {b"401"}
    listing = owner.call("GET", f"folders/{folder['id']}/files/").json()
    assert listing["entries"] == []
    # The owner's own upload goes as before, and a small anonymous body still gets its 401.
    url = f"folders/{folder['id']}/files/big.bin?offset=0"
    assert owner.call("PUT", url, data=b"x" * 1024, headers=OCTETS).status_code == 201
    anonymous = requests.post(
        f"{hub.url}/services/queue/api/folders",
        json={"name": "x"},
        headers={"Authorization": "token not-a-token"},
        timeout=60,
    )
    assert anonymous.status_code == 401, anonymous.text
