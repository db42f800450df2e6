"""`api/folders` (handlers/folders.py) on the real hub and service: an instructor's course folder
shared read-only with a group, a student who reads it and writes only their own, uploads in chunks,
downloads that are never pages, and every misuse a 4xx that changes nothing: bad names and paths,
unknown share targets, planted links, other people's folders, narrow tokens and cross-site
requests."""

from __future__ import annotations

import http.client
import os
import secrets
from pathlib import Path

import pytest
import requests

from .harness import QueueUser, containers_with
from .test_security_handlers import EVIL, Browser, narrow_admin_token, raw_post, service_address

pytestmark = [pytest.mark.docker, pytest.mark.hub]

OCTETS = {"Content-Type": "application/octet-stream"}


def made(user: QueueUser, name: str) -> dict:
    response = user.call("POST", "folders", json={"name": name})
    assert response.status_code == 201, response.text
    return response.json()


def names(user: QueueUser) -> list[str]:
    response = user.call("GET", "folders")
    assert response.status_code == 200, response.text
    return sorted(f["name"] for f in response.json()["folders"])


def raw_put(user: QueueUser, path: str, data: bytes):
    """A PUT with the path exactly as written: HTTP clients remove `..` segments themselves."""
    host, port = user.hub.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    headers = {**OCTETS, "Authorization": user.http.headers["Authorization"]}
    connection.request("PUT", f"/services/queue/api/{path}", body=data, headers=headers)
    return connection.getresponse()


def on_disk(hub, folder: dict) -> str:
    return str(hub.workdir / "fgpu-folders" / folder["id"])


@pytest.fixture
def course(hub):
    """An instructor, a course folder with a notebook, shared read-only with a course group that
    holds a student: (instructor, student, folder, group)."""
    teacher_name, student_name = f"teach-{secrets.token_hex(3)}", f"student-{secrets.token_hex(3)}"
    hub.create_user(student_name)
    group = hub.join_group(student_name, {})
    teacher, student = QueueUser(hub, teacher_name), QueueUser(hub, student_name)
    folder = made(teacher, "course material")
    url = f"folders/{folder['id']}/files/lab1.ipynb"
    first = teacher.call("PUT", url + "?offset=0", data=b'{"cells": ', headers=OCTETS)
    assert first.status_code == 201, first.text
    second = teacher.call("PUT", url + "?offset=10", data=b"[]}", headers=OCTETS)
    assert (second.status_code, second.json()["size"]) == (200, 13)
    shared = teacher.call(
        "POST", f"folders/{folder['id']}/shares", json={"group": group, "permission": "ro"}
    )
    assert shared.status_code == 201, shared.text
    return teacher, student, folder, group


def test_a_student_of_the_group_reads_the_course_folder_and_cannot_write_it(hub, course):
    teacher, student, folder, group = course
    (seen,) = student.call("GET", "folders").json()["folders"]
    assert (seen["name"], seen["owner"], seen["permission"]) == (
        "course material",
        teacher.name,
        "ro",
    )
    listing = student.call("GET", f"folders/{folder['id']}/files/").json()
    assert [(e["name"], e["size"]) for e in listing["entries"]] == [("lab1.ipynb", 13)]
    notebook = student.call("GET", f"folders/{folder['id']}/files/lab1.ipynb")
    assert notebook.content == b'{"cells": []}'
    for method, path, kwargs in [
        ("PUT", "files/mine.txt?offset=0", {"data": b"x", "headers": OCTETS}),
        ("DELETE", "files/lab1.ipynb", {}),
        ("POST", "files/new", {"json": {"type": "directory"}}),
        ("PATCH", "files/lab1.ipynb", {"json": {"to": "renamed.ipynb"}}),
    ]:
        answer = student.call(method, f"folders/{folder['id']}/{path}", **kwargs)
        assert answer.status_code == 403, (method, path, answer.text)
        assert "read-only" in answer.json()["message"]
    for method, path, body in [
        ("PATCH", "", {"name": "mine now"}),
        ("DELETE", "", None),
        ("POST", "/shares", {"group": group, "permission": "rw"}),
    ]:
        answer = student.call(method, f"folders/{folder['id']}{path}", json=body)
        assert answer.status_code == 403, (method, path, answer.text)
        assert "owner" in answer.json()["message"]
    assert sorted(os.listdir(on_disk(hub, folder))) == ["lab1.ipynb"]
    own = made(student, "my work")
    put = student.call("PUT", f"folders/{own['id']}/files/a.txt", data=b"mine", headers=OCTETS)
    assert put.status_code == 201, put.text
    assert names(student) == ["course material", "my work"]


def test_a_user_outside_the_share_finds_no_such_folder(hub, course, username):
    _, _, folder, _ = course
    stranger = QueueUser(hub, username)
    assert names(stranger) == []
    for method, path in [
        ("GET", ""),
        ("GET", "/files/"),
        ("GET", "/files/lab1.ipynb"),
        ("DELETE", ""),
        ("PATCH", ""),
    ]:
        answer = stranger.call(method, f"folders/{folder['id']}{path}", json={"name": "x"})
        assert answer.status_code == 404, (method, path, answer.text)


def test_a_download_is_always_an_attachment_never_a_page(hub, username):
    owner = QueueUser(hub, username)
    folder = made(owner, "web")
    page = b"<script>alert(document.cookie)</script>"
    url = f"folders/{folder['id']}/files/evil.html"
    assert owner.call("PUT", url, data=page, headers=OCTETS).status_code == 201
    answer = owner.call("GET", url)
    assert answer.content == page
    assert answer.headers["Content-Type"] == "application/octet-stream"
    assert answer.headers["Content-Disposition"].startswith("attachment;")
    assert answer.headers["X-Content-Type-Options"] == "nosniff"
    assert "sandbox" in answer.headers["Content-Security-Policy"]


BAD_NAMES = [
    ("a/b", 400, "no '/'"),
    ("..", 400, "cannot name"),
    ("nul\0name", 400, "cannot name"),
    ("x" * 65, 400, "at most 64"),
    ("", 400, "needs a name"),
    (["list"], 400, "needs a name"),
    ("taken", 409, "already"),
]
BAD_SHARES = [  # a missing user or group: test_security_folder_holes.py
    ({"group": "x", "user": "y", "permission": "ro"}, "one"),
    ({"permission": "ro"}, "one"),
    ({"user": "admin", "permission": "write"}, "read-only"),
]
PATHS_OUT = [
    "%2E%2E/escape.txt",
    "a/%2E%2E/%2E%2E/escape.txt",
    "%2Fetc%2Fpasswd",
    "nul%00name",
    "a//b",
]


def test_bad_names_shares_and_paths_are_refused_and_change_nothing(hub, username):
    """One user tries each (the cases share a hub account: each costs a login otherwise)."""
    owner = QueueUser(hub, username)
    folder = made(owner, "taken")
    before = sorted(os.listdir(hub.workdir / "fgpu-folders"))
    for name, status, says in BAD_NAMES:
        answer = owner.call("POST", "folders", json={"name": name})
        assert answer.status_code == status, (name, answer.text)
        assert says in answer.json()["message"], name
    assert names(owner) == ["taken"]
    assert sorted(os.listdir(hub.workdir / "fgpu-folders")) == before
    for body, says in BAD_SHARES:
        answer = owner.call("POST", f"folders/{folder['id']}/shares", json=body)
        assert answer.status_code == 400, (body, answer.text)
        assert says in answer.json()["message"], body
    assert owner.call("GET", f"folders/{folder['id']}").json()["shares"] == []
    for path in PATHS_OUT:
        answer = raw_put(owner, f"folders/{folder['id']}/files/{path}", b"x")
        # The hub's proxy resolves an encoded `..` itself, so such a request reaches no folder
        # (404); whatever reaches the service with one is refused there (400).
        assert answer.status in (400, 404), (path, answer.read())
    assert os.listdir(on_disk(hub, folder)) == []
    assert not (hub.workdir / "fgpu-folders" / "escape.txt").exists()


def test_a_link_a_session_planted_is_never_followed(hub, course, tmp_path):
    teacher, student, folder, _ = course
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("not yours")
    # What a session with the folder mounted read-write could leave behind.
    os.symlink(str(outside), os.path.join(on_disk(hub, folder), "planted"))
    os.symlink(str(outside / "secret"), os.path.join(on_disk(hub, folder), "secret"))
    for method, path, kwargs in [
        ("GET", "files/planted/", {}),
        ("GET", "files/planted/secret", {}),
        ("GET", "files/secret", {}),
        ("PUT", "files/secret", {"data": b"overwritten", "headers": OCTETS}),
        ("PUT", "files/planted/new", {"data": b"x", "headers": OCTETS}),
        ("DELETE", "files/planted/secret", {}),
    ]:
        answer = teacher.call(method, f"folders/{folder['id']}/{path}", **kwargs)
        assert answer.status_code == 403, (method, path, answer.text)
        assert "link" in answer.json()["message"]
    assert (outside / "secret").read_text() == "not yours"
    assert sorted(os.listdir(outside)) == ["secret"]
    listing = teacher.call("GET", f"folders/{folder['id']}/files/").json()["entries"]
    assert {e["name"]: e["type"] for e in listing}["planted"] == "link"


def test_narrow_tokens_and_cross_site_requests_cannot_use_folders(hub, username):
    owner = Browser(hub, username)
    created = owner.own_page_call("POST", "folders", json={"name": "mine"})
    assert created.status_code == 201, created.text
    folder = created.json()
    for headers in (EVIL, {**EVIL, "Content-Type": "text/plain"}):
        answer = owner.call("POST", "folders", headers=headers, json={"name": "evil"})
        assert answer.status_code == 403, answer.text
        put = owner.call(
            "PUT", f"folders/{folder['id']}/files/x", headers={**headers, **OCTETS}, data=b"x"
        )
        assert put.status_code == 403, put.text
    # A form can send text/plain or multipart, never the upload's own type.
    own_page = {"X-XSRFToken": owner.xsrf, "Sec-Fetch-Site": "same-origin"}
    form = owner.call(
        "PUT",
        f"folders/{folder['id']}/files/x",
        data=b"x",
        headers={**own_page, "Content-Type": "text/plain"},
    )
    assert form.status_code in (403, 415), form.text
    assert owner.call("GET", f"folders/{folder['id']}/files/").json()["entries"] == []
    # A cross-site script reads neither the folders nor how full the quotas are.
    stolen = owner.call("GET", "folders", headers={**EVIL, "Sec-Fetch-Mode": "cors"})
    assert stolen.status_code == 403, stolen.text
    assert "storage_quotas" not in stolen.text and "mine" not in stolen.text
    assert "storage_quotas" in owner.own_page_call("GET", "folders").json()
    narrow = narrow_admin_token(hub, ["access:services!service=queue"])
    everyone = narrow.get(f"{hub.url}/services/queue/api/folders?all=1", timeout=60)
    assert everyone.status_code == 403, everyone.text
    admin = QueueUser(hub, "admin")
    listed = admin.call("GET", "folders?all=1").json()["folders"]
    assert {(f["owner"], f["name"]) for f in listed} >= {(username, "mine")}
    assert names(QueueUser(hub, f"student-{secrets.token_hex(3)}")) == []


def test_an_upload_chunk_over_the_cap_is_a_413_and_a_gap_a_409(hub, username):
    owner = QueueUser(hub, username)
    folder = made(owner, "big")
    url = f"folders/{folder['id']}/files/big.bin"
    # Straight to the service, as the cap answers before the body is read (the hub's proxy
    # would turn the hung-up connection into its own error page).
    host, port = service_address(hub)
    length = 8 * 1024 * 1024 + 1
    status, answer = raw_post(
        host,
        port,
        f"/services/queue/api/{url}",
        f"Content-Length: {length}\r\nContent-Type: application/octet-stream\r\n",
        [b"x" * length],
        method="PUT",
    )
    assert status == 413 and b"larger than 8388608 bytes" in answer, answer
    assert os.listdir(on_disk(hub, folder)) == []
    assert owner.call("PUT", url, data=b"abc", headers=OCTETS).status_code == 201
    gap = owner.call("PUT", url + "?offset=10", data=b"def", headers=OCTETS)
    assert gap.status_code == 409 and "starts there" in gap.json()["message"]
    assert owner.call("GET", url).content == b"abc"


def test_an_owner_renames_removes_and_takes_back_a_share(hub, course):
    teacher, student, folder, _ = course
    share_id = teacher.call("GET", f"folders/{folder['id']}").json()["shares"][0]["id"]
    renamed = teacher.call("PATCH", f"folders/{folder['id']}", json={"name": "ML 101"})
    assert renamed.json()["name"] == "ML 101"
    assert names(student) == ["ML 101"]
    ended = teacher.call("DELETE", f"folders/{folder['id']}/shares/{share_id}")
    assert ended.status_code == 204, ended.text
    assert names(student) == []
    assert teacher.call("DELETE", f"folders/{folder['id']}").status_code == 204
    assert names(teacher) == []
    assert not os.path.exists(on_disk(hub, folder))
    trash = os.listdir(hub.workdir / "fgpu-folders" / ".trash")
    assert any(name.startswith(folder["id"]) for name in trash)


def run_in(container, command: str):
    return container.exec_run(["sh", "-c", command])


def test_a_session_mounts_its_folders_with_each_ones_access(hub, course):
    teacher, student, folder, _ = course
    work, cache = made(student, "work"), made(student, ".cache")
    options = {"image": "python-3.11", "cpu": 0.5, "mem": "512M"}
    started = hub.start_server(student.name, {**options, "folders": ["course material", "work"]})
    assert started.status_code in (201, 202), started.text
    try:
        hub.wait_ready(student.name)
        (container,) = containers_with({"fgpu.user": student.name})
        mounts = {m["Destination"]: m for m in container.attrs["Mounts"]}
        home = "/home/jovyan"
        course_mount = mounts[f"{home}/folders/course material"]
        assert course_mount["Source"] == on_disk(hub, folder)  # the source names the folder's id
        assert course_mount["RW"] is False
        assert mounts[f"{home}/folders/work"]["RW"] is True
        assert mounts[f"{home}/.cache"]["Source"] == on_disk(hub, cache)  # automount
        read = run_in(container, "cat ~/folders/'course material'/lab1.ipynb")
        assert read.output == b'{"cells": []}'
        # Read-only by the bind itself: no permission the session user could change.
        for attempt in (
            "touch ~/folders/'course material'/new",
            "chmod u+w ~/folders/'course material'/lab1.ipynb",
            "rm ~/folders/'course material'/lab1.ipynb",
        ):
            result = run_in(container, attempt)
            assert result.exit_code != 0 and b"Read-only file system" in result.output, attempt
        assert run_in(container, "echo result > ~/folders/work/out.txt").exit_code == 0
        assert run_in(container, "echo kept > ~/.cache/c").exit_code == 0
        out = Path(on_disk(hub, work), "out.txt")
        assert out.read_text() == "result\n" and out.stat().st_uid == 1000
        assert sorted(os.listdir(on_disk(hub, folder))) == ["lab1.ipynb"]
        listing = student.call("GET", f"folders/{work['id']}/files/").json()["entries"]
        assert [e["name"] for e in listing] == ["out.txt"]
        (record,) = student.sessions()
        assert [(m["path"], m["read_only"], m["owner"]) for m in record["mounts"]] == [
            (".cache", False, student.name),
            ("folders/course material", True, teacher.name),
            ("folders/work", False, student.name),
        ]
        assert "source" not in record["mounts"][0]  # where the files are is the host's business
    finally:
        hub.stop_server(student.name)


def test_a_launch_with_a_folder_that_is_not_yours_starts_nothing(hub, course, username):
    teacher, _, folder, _ = course
    stranger = QueueUser(hub, username)
    session = {"image": "python-3.11", "cpu": 0.5, "mem": "256M"}
    for folders, status, says in [
        (["course material"], 404, "No folder 'course material'"),
        ([folder["id"]], 404, "No folder"),
        ("a/b", 400, "no '/'"),
        ([1], 400, "list of folder names"),
    ]:
        answer = stranger.call("POST", "sessions", json={**session, "folders": folders})
        assert answer.status_code == status, answer.text
        assert says in answer.json()["message"]
    # Through the hub's own API (the spawn form's way): the spawner is refused the same way.
    refused = hub.start_server(username, {**session, "folders": ["course material"]})
    assert refused.status_code == 404, refused.text
    assert stranger.sessions() == []
    assert containers_with({"fgpu.user": username}) == []


def test_the_spawner_reads_one_users_folders_and_no_other_service_does(hub, course):
    teacher, student, folder, _ = course
    spawner = requests.Session()
    spawner.headers["Authorization"] = f"token {hub.spawner_token}"
    url = f"{hub.url}/services/queue/api/folders"
    answer = spawner.get(url, params={"user": student.name}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert [(f["name"], f["permission"]) for f in answer.json()["folders"]] == [
        ("course material", "ro")
    ]
    assert "storage_quotas" not in answer.json()  # a student's quota is theirs to read
    assert spawner.get(url, timeout=60).status_code == 400
    assert spawner.post(url, json={"name": "x"}, timeout=60).status_code == 403
    other = requests.Session()  # the tests' own admin service
    other.headers["Authorization"] = hub.api.headers["Authorization"]
    assert other.get(url, params={"user": student.name}, timeout=60).status_code == 403


def test_an_upload_past_a_groups_storage_quota_is_a_507_that_writes_nothing(hub, username):
    hub.create_user(username)
    group = hub.join_group(username, {"fgpu_quota": {"storage": "16K"}})
    owner = QueueUser(hub, username)
    folder = made(owner, "data")
    url = f"folders/{folder['id']}/files/big.bin"
    answer = owner.call("PUT", url, data=b"x" * 20_000, headers=OCTETS)
    assert answer.status_code == 507, answer.text  # Insufficient Storage
    assert f"group {group} hold 0 B of its storage quota of 16 KiB" in answer.json()["message"]
    assert os.listdir(on_disk(hub, folder)) == []
    small = owner.call("PUT", url, data=b"x" * 1000, headers=OCTETS)
    assert small.status_code == 201, small.text


def quotas(user: QueueUser) -> list[dict]:
    response = user.call("GET", "folders")
    assert response.status_code == 200, response.text
    return response.json()["storage_quotas"]


def test_the_listing_says_how_full_each_storage_quota_is(hub, username):
    free = QueueUser(hub, f"free-{secrets.token_hex(3)}")
    assert quotas(free) == []  # no storage quota: nothing to fill
    # These machines' kernels have no quota support: the service measures, and says why.
    assert "Storage quotas are measured every" in hub.log_text()
    assert "cannot hold them as project quotas" in hub.log_text()
    hub.create_user(username)
    group = hub.join_group(username, {"fgpu_quota": {"storage": "64K"}})
    owner = QueueUser(hub, username)
    folder = made(owner, "data")
    url = f"folders/{folder['id']}/files/"
    put = owner.call("PUT", url + "a.bin?offset=0", data=b"x" * 5000, headers=OCTETS)
    assert put.status_code == 201, put.text
    listed = owner.call("GET", "folders").json()
    used = sum(f["size_bytes"] for f in listed["folders"] if f["own"])
    assert used >= 5000  # as measured on the disk: whole blocks
    assert listed["storage_quotas"] == [
        {
            "group": group,
            "used_bytes": used,
            "limit_bytes": 65536,
            "full": False,
            "held_by": "measure",
        }
    ]
    # Filled to the byte: full, so a new folder is refused with the same figures.
    rest = 65536 - used
    put = owner.call("PUT", url + "b.bin?offset=0", data=b"y" * rest, headers=OCTETS)
    assert put.status_code == 201, put.text
    (quota,) = quotas(owner)
    assert quota["full"] and quota["used_bytes"] >= 65536
    refused = owner.call("POST", "folders", json={"name": "more"})
    assert refused.status_code == 403, refused.text
    says = refused.json()["message"]
    assert says.startswith(f"The folders of group {group} hold ")
    assert says.endswith(" of its storage quota of 64 KiB; remove files to make room.")
    assert names(owner) == ["data"]
    # Another member sees the group's figure: it counts every member's folders.
    other = f"member-{secrets.token_hex(3)}"
    hub.create_user(other)
    joined = hub.request("POST", f"groups/{group}/users", json={"users": [other]})
    assert joined.status_code == 200, joined.text
    assert quotas(QueueUser(hub, other)) == [quota]
