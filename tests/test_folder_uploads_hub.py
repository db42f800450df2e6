"""Uploads written to disk as they come (handlers/base.py streams, store/chunk_writes.py writes)
and parallel, resumable uploads (`?offset=0&size=S`, then `?offset=N&upload=ID`, uploads.py), on
the real hub and service: chunks in any order and again, a file that appears under its name only
when whole, a chunk cut short that leaves nothing counted, files past 2 GiB, and every misuse of
the new parameters a 4xx that leaves nothing behind (read-only shares, other people's folders and
uploads, narrow tokens, cross-site requests, offsets and sizes that do not fit)."""

from __future__ import annotations

import os
import secrets
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from .harness import QueueUser
from .test_folders_hub import OCTETS, course, made, on_disk  # noqa: F401 (a fixture)
from .test_security_handlers import EVIL, Browser, service_address

pytestmark = [pytest.mark.docker, pytest.mark.hub]
MIB = 1024 * 1024
GIB = 1024 * MIB


def put(user, url: str, data: bytes, **query) -> requests.Response:
    query_text = "&".join(f"{k}={v}" for k, v in query.items())
    return user.call("PUT", f"{url}?{query_text}", data=data, headers=OCTETS)


def entries(user, folder: dict) -> list[str]:
    answer = user.call("GET", f"folders/{folder['id']}/files/")
    assert answer.status_code == 200, answer.text
    return sorted(e["name"] for e in answer.json()["entries"])


def test_a_parallel_upload_takes_chunks_in_any_order_and_again(hub, username):
    owner = QueueUser(hub, username)
    folder = made(owner, "data")
    url = f"folders/{folder['id']}/files/sub/data.bin"
    assert owner.call("POST", f"folders/{folder['id']}/files/sub", json={"type": "directory"}).ok
    data = secrets.token_bytes(10 * MIB + 123)
    chunks = [(o, data[o : o + 2 * MIB]) for o in range(0, len(data), 2 * MIB)]
    # A file of that name is replaced only once the upload is whole.
    assert put(owner, url, b"old", offset=0).status_code == 201
    first = put(owner, url, chunks[0][1], offset=0, size=len(data))
    assert first.status_code == 201, first.text
    started = first.json()
    assert (started["size"], started["received"], started["complete"]) == (
        len(data),
        2 * MIB,
        False,
    )
    assert started["part"].startswith("sub/.fgpu-upload-")
    assert owner.call("GET", url).content == b"old"
    # The rest at once, last first, each a chunk of this upload.
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(
            pool.map(
                lambda chunk: put(owner, url, chunk[1], offset=chunk[0], upload=started["upload"]),
                reversed(chunks[1:]),
            )
        )
    assert {a.status_code for a in answers} == {200}, [a.text for a in answers]
    assert [a.json()["complete"] for a in answers].count(True) >= 1
    assert owner.call("GET", url).content == data
    listing = owner.call("GET", f"folders/{folder['id']}/files/sub/").json()["entries"]
    assert [e["name"] for e in listing] == ["data.bin"]  # the part file is the file now
    # A chunk again (its answer was lost): taken, nothing changes.
    again = put(owner, url, chunks[2][1], offset=chunks[2][0], upload=started["upload"])
    assert (again.status_code, again.json()["complete"]) == (200, True), again.text
    assert owner.call("GET", url).content == data


def test_an_empty_file_and_a_single_chunk_file_are_complete_at_once(hub, username):
    owner = QueueUser(hub, username)
    folder = made(owner, "small")
    for name, data in (("empty.txt", b""), ("one.txt", b"hello")):
        url = f"folders/{folder['id']}/files/{name}"
        answer = put(owner, url, data, offset=0, size=len(data))
        assert answer.status_code == 201, answer.text
        assert answer.json()["complete"] is True
        assert owner.call("GET", url).content == data
    assert entries(owner, folder) == ["empty.txt", "one.txt"]


def test_a_file_past_two_gib_takes_a_chunk_at_its_far_end(hub, username):
    owner = QueueUser(hub, username)
    folder = made(owner, "huge")
    url = f"folders/{folder['id']}/files/huge.bin"
    size = 3 * GIB  # sparse on disk until its chunks come
    started = put(owner, url, b"a" * 10, offset=0, size=size)
    assert started.status_code == 201, started.text
    upload = started.json()["upload"]
    far = put(owner, url, b"z" * 10, offset=size - 10, upload=upload)
    assert far.status_code == 200, far.text
    assert (far.json()["received"], far.json()["complete"]) == (20, False)
    sequential = put(owner, f"folders/{folder['id']}/files/seq.bin", b"x", offset=2 * GIB + 1)
    assert sequential.status_code == 404, sequential.text  # no such file: not a bad offset
    removed = owner.call("DELETE", f"folders/{folder['id']}/files/{started.json()['part']}")
    assert removed.status_code == 204, removed.text
    assert os.listdir(on_disk(hub, folder)) == []


def test_offsets_and_sizes_that_do_not_fit_are_refused_and_leave_nothing(hub, username):
    owner = QueueUser(hub, username)
    folder = made(owner, "bad")
    url = f"folders/{folder['id']}/files/f.bin"
    for query, data, status, says in [
        ({"offset": 0, "size": 3}, b"four", 400, "past the end of the file"),
        ({"offset": 5, "size": 10}, b"x", 400, "starts at offset 0"),
        ({"offset": 0, "size": -1}, b"x", 400, "`size` must be a whole number"),
        ({"offset": 0, "size": 2**51}, b"x", 400, "`size` must be a whole number"),
        ({"offset": 0, "size": 2**49}, b"x", 507, "The disk has room for"),
        ({"offset": 0, "upload": "0" * 24}, b"x", 409, "No such upload"),
        ({"offset": 0, "size": 1, "upload": "0" * 24}, b"x", 400, "not both"),
    ]:
        answer = put(owner, url, data, **query)
        assert answer.status_code == status, (query, answer.text)
        assert says in answer.json()["message"], (query, answer.text)
    assert os.listdir(on_disk(hub, folder)) == []
    started = put(owner, url, b"ab", offset=0, size=4).json()
    past = put(owner, url, b"cde", offset=2, upload=started["upload"])
    assert past.status_code == 400 and "past the end" in past.json()["message"], past.text
    assert entries(owner, folder) == [started["part"]]  # only the upload's own part file


def test_a_read_only_share_another_folder_and_another_users_upload_are_closed(hub, course):  # noqa: F811
    teacher, student, folder, _ = course
    url = f"folders/{folder['id']}/files/lab1.ipynb"
    refused = put(student, url, b"x", offset=0, size=1)
    assert refused.status_code == 403 and "read-only" in refused.json()["message"], refused.text
    started = put(teacher, url, b"{", offset=0, size=2).json()
    # The teacher's upload id, in a student's hands: the same read-only refusal.
    stolen = put(student, url, b"}", offset=1, upload=started["upload"])
    assert stolen.status_code == 403, stolen.text
    own = made(student, "mine")
    elsewhere = put(
        student, f"folders/{own['id']}/files/lab1.ipynb", b"}", offset=1, upload=started["upload"]
    )
    assert elsewhere.status_code == 409, elsewhere.text  # another file's upload: unknown here
    stranger = QueueUser(hub, f"stranger-{secrets.token_hex(3)}")
    hidden = put(stranger, url, b"x", offset=0, size=1)
    assert hidden.status_code == 404, hidden.text
    assert sorted(os.listdir(on_disk(hub, folder))) == sorted(["lab1.ipynb", started["part"]])
    assert os.listdir(on_disk(hub, own)) == []
    assert student.call("GET", url).content == b'{"cells": []}'


def test_narrow_tokens_and_cross_site_requests_cannot_start_or_feed_an_upload(hub, username):
    owner = Browser(hub, username)
    folder = owner.own_page_call("POST", "folders", json={"name": "mine"}).json()
    url = f"folders/{folder['id']}/files/x.bin"
    own_page = {"X-XSRFToken": owner.xsrf, "Sec-Fetch-Site": "same-origin", **OCTETS}
    started = owner.call("PUT", url + "?offset=0&size=2", data=b"a", headers=own_page)
    assert started.status_code == 201, started.text
    upload = started.json()["upload"]
    for query in ("offset=0&size=1", f"offset=1&upload={upload}"):
        evil = owner.call("PUT", f"{url}?{query}", headers={**EVIL, **OCTETS}, data=b"x")
        assert evil.status_code == 403, evil.text
    hub.create_user(username)
    made_token = hub.request(
        "POST", f"users/{username}/tokens", json={"scopes": ["read:users:name!user"]}
    )
    assert made_token.status_code == 201, made_token.text
    narrow = requests.put(
        f"{hub.url}/services/queue/api/{url}?offset=1&upload={upload}",
        data=b"b",
        headers={**OCTETS, "Authorization": f"token {made_token.json()['token']}"},
        timeout=60,
    )
    assert narrow.status_code == 403, narrow.text
    part = started.json()["part"]
    assert os.listdir(on_disk(hub, folder)) == [part]
    with open(os.path.join(on_disk(hub, folder), part), "rb") as f:
        assert f.read() == b"a\0"  # only the owner's own chunk came in


def send_part(hub, user: QueueUser, path: str, length: int, sent: bytes) -> socket.socket:
    """A PUT straight to the service announcing `length` bytes and sending only `sent`."""
    host, port = service_address(hub)
    sock = socket.create_connection((host, port), timeout=60)
    sock.sendall(
        f"PUT /services/queue/api/{path} HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {length}\r\n"
        f"Authorization: {user.http.headers['Authorization']}\r\n\r\n".encode()
    )
    sock.sendall(sent)
    return sock


def wait_for(predicate, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not reached"
        time.sleep(0.1)


def test_a_chunk_goes_to_disk_as_it_comes_and_one_cut_short_counts_for_nothing(hub, username):
    owner = QueueUser(hub, username)
    folder = made(owner, "cut")
    url = f"folders/{folder['id']}/files/f.bin"
    directory = on_disk(hub, folder)
    data = secrets.token_bytes(6 * MIB)
    started = put(owner, url, data[: 2 * MIB], offset=0, size=len(data)).json()
    part = os.path.join(directory, started["part"])
    # Half of the next chunk, and the connection cut: on disk as it came, yet not counted.
    sock = send_part(
        hub,
        owner,
        f"{url}?offset={2 * MIB}&upload={started['upload']}",
        2 * MIB,
        data[2 * MIB : 3 * MIB],
    )
    wait_for(lambda: os.stat(part).st_blocks * 512 >= 3 * MIB)
    sock.close()
    last = put(owner, url, data[4 * MIB :], offset=4 * MIB, upload=started["upload"])
    assert (last.json()["received"], last.json()["complete"]) == (4 * MIB, False), last.text
    again = put(owner, url, data[2 * MIB : 4 * MIB], offset=2 * MIB, upload=started["upload"])
    assert again.json()["complete"] is True, again.text
    assert owner.call("GET", url).content == data
    # A sequential upload's first chunk cut short: neither the file nor a part file stays.
    sock = send_part(
        hub, owner, f"folders/{folder['id']}/files/g.bin?offset=0", 2 * MIB, b"x" * MIB
    )
    wait_for(lambda: len(os.listdir(directory)) == 2)
    sock.close()
    wait_for(lambda: os.listdir(directory) == ["f.bin"])
    # A later chunk cut short: the file is cut back to where it was.
    assert put(owner, url, b"tail", offset=len(data)).status_code == 200
    sock = send_part(hub, owner, f"{url}?offset={len(data) + 4}", 2 * MIB, b"y" * MIB)
    wait_for(lambda: os.path.getsize(os.path.join(directory, "f.bin")) > len(data) + 4)
    sock.close()
    wait_for(lambda: os.path.getsize(os.path.join(directory, "f.bin")) == len(data) + 4)


def test_a_chunked_body_past_the_quotas_room_stops_and_leaves_nothing(hub, username):
    hub.create_user(username)
    hub.join_group(username, {"fgpu_quota": {"storage": "1M"}})
    owner = QueueUser(hub, username)
    folder = made(owner, "data")
    url = f"{hub.url}/services/queue/api/folders/{folder['id']}/files/big.bin?offset=0"
    pieces = (b"x" * (256 * 1024) for _ in range(8))  # 2 MiB, without a length
    answer = owner.http.put(url, data=pieces, headers=OCTETS, timeout=60)
    assert answer.status_code == 507, answer.text
    wait_for(lambda: os.listdir(on_disk(hub, folder)) == [])
