"""Unit tests for the pure storage builder: home volume and group data mounts."""

from __future__ import annotations

import base64
import hashlib
import io
import secrets
import zipfile
from dataclasses import replace
from datetime import UTC, datetime

import pytest
import requests

from fgpu_spawner.container_spec import ContainerContext, build_container_spec
from fgpu_spawner.grant import Grant
from fgpu_spawner.request import ResourceRequest
from fgpu_spawner.storage import (
    LABEL_ACCOUNT,
    StorageSettings,
    account_tag,
    belongs_to_account,
    data_groups,
    folder_mounts,
    home_volume_name,
    pick_home_volume,
    session_mounts,
    volume_safe,
)

from .harness import containers_with

GROUP_DATA = StorageSettings(group_data_dir="/srv/fgpu-data/")


def test_home_volume_is_named_after_the_user():
    assert home_volume_name("fgpu-home-{username}", "alice") == "fgpu-home-alice"
    assert home_volume_name("fgpu-home-{username}", "student-1.a") == "fgpu-home-student-1.a"


def test_user_names_docker_refuses_are_escaped_without_collisions():
    names = ["a@b.org", "a_40b.org", "Ünï", "a b"]
    escaped = [volume_safe(name) for name in names]
    assert escaped[0] == "a_40b.org"
    assert len(set(escaped)) == len(names)
    for name in escaped:
        assert all(ch.isascii() and (ch.isalnum() or ch in "_.-") for ch in name)


def test_home_is_a_labelled_named_volume_at_the_home_folder():
    settings = StorageSettings(labels={"site": "x"})
    (mount,) = session_mounts(settings, "alice", ["course-a"])
    assert mount["Type"] == "volume"
    assert mount["Source"] == "fgpu-home-alice"
    assert mount["Target"] == "/home/jovyan"
    assert mount["ReadOnly"] is False
    assert mount["VolumeOptions"]["Labels"] == {
        "site": "x",
        "fgpu.user": "alice",
        "fgpu.volume": "home",
    }


FIRST = datetime(2026, 1, 5, 9, 0, 0, 250000)  # naive UTC, as the hub's database has it
SECOND = datetime(2026, 3, 1, 12, 30, 0, 7)
TEMPLATE = "fgpu-home-{username}"


def volume(tag=None, created_at="2026-01-05T09:00:01Z") -> dict:
    return {"Labels": {LABEL_ACCOUNT: tag} if tag else {}, "CreatedAt": created_at}


def test_an_account_tag_is_its_creation_time_and_names_its_own_volume():
    assert account_tag(FIRST) == "20260105T090000250000Z"
    assert account_tag(FIRST.replace(tzinfo=UTC)) == account_tag(FIRST)
    assert account_tag(None) == ""
    own = home_volume_name(TEMPLATE, "alice", account_tag(SECOND))
    assert own == "fgpu-home-alice_u20260301T123000000007Z"
    # No user's plain name, escaped, gives the same volume name.
    assert volume_safe("alice_u20260301T123000000007Z") != own.removeprefix("fgpu-home-")


def test_the_first_account_keeps_the_plain_name():
    assert pick_home_volume(TEMPLATE, "alice", FIRST, {"fgpu-home-alice": None}) == (
        "fgpu-home-alice"
    )
    existing = {"fgpu-home-alice": volume(account_tag(FIRST))}
    assert pick_home_volume(TEMPLATE, "alice", FIRST, existing) == "fgpu-home-alice"


def test_a_new_account_of_the_same_name_never_gets_the_old_volume():
    for old in (volume(account_tag(FIRST)), volume(created_at="2026-01-05T09:00:01Z")):
        picked = pick_home_volume(TEMPLATE, "alice", SECOND, {"fgpu-home-alice": old})
        assert picked == "fgpu-home-alice_u20260301T123000000007Z"


def test_the_new_account_keeps_its_own_volume_even_once_the_old_one_is_removed():
    own = home_volume_name(TEMPLATE, "alice", account_tag(SECOND))
    volumes = {"fgpu-home-alice": None, own: volume(account_tag(SECOND))}
    assert pick_home_volume(TEMPLATE, "alice", SECOND, volumes) == own


def test_unlabelled_volumes_belong_to_the_account_they_were_made_after():
    # Made in the account's first second: the engine's whole seconds must not hide it.
    assert belongs_to_account(volume(created_at="2026-01-05T09:00:00Z"), FIRST)
    assert not belongs_to_account(volume(created_at="2026-01-05T09:00:01Z"), SECOND)
    assert not belongs_to_account({"Labels": None}, SECOND), "unknown age: not handed over"
    assert belongs_to_account(volume(created_at="2026-01-05T09:00:01Z"), None)


def test_a_new_volume_is_labelled_with_its_account():
    tag = account_tag(SECOND)
    own = home_volume_name(TEMPLATE, "alice", tag)
    (mount,) = session_mounts(StorageSettings(), "alice", [], home_volume=own, account=tag)
    assert mount["Source"] == own
    assert mount["VolumeOptions"]["Labels"][LABEL_ACCOUNT] == tag


def test_an_empty_home_volume_setting_turns_persistence_off():
    assert session_mounts(StorageSettings(home_volume=""), "alice", ["course-a"]) == []


def test_students_read_their_groups_data_folders():
    mounts = session_mounts(GROUP_DATA, "bob", ["course-b", "course-a"])
    data = [(m["Source"], m["Target"], m["ReadOnly"], m["Type"]) for m in mounts[1:]]
    assert data == [
        ("/srv/fgpu-data/course-a", "/home/jovyan/data/course-a", True, "bind"),
        ("/srv/fgpu-data/course-b", "/home/jovyan/data/course-b", True, "bind"),
    ]


def test_instructors_write_to_their_groups_data_folders():
    mounts = session_mounts(GROUP_DATA, "carol", ["course-a", "instructors"])
    assert {m["Target"]: m["ReadOnly"] for m in mounts[1:]} == {
        "/home/jovyan/data/course-a": False,
        "/home/jovyan/data/instructors": False,
    }


def test_writer_groups_are_configurable():
    settings = StorageSettings(group_data_dir="/d", group_data_writers=("tas",))
    assert [m["ReadOnly"] for m in session_mounts(settings, "t", ["course-a", "tas"])[1:]] == [
        False,
        False,
    ]
    assert [
        m["ReadOnly"] for m in session_mounts(settings, "i", ["course-a", "instructors"])[1:]
    ] == [
        True,
        True,
    ]


def test_no_group_data_without_a_folder_setting():
    assert len(session_mounts(StorageSettings(), "bob", ["course-a"])) == 1


@pytest.mark.parametrize("group", ["..", ".", "a/b", "-x", "", "a b", "x" * 129])
def test_group_names_that_are_not_one_safe_path_part_get_no_folder(group):
    assert data_groups([group, "ok"]) == ["ok"]


def test_storage_mounts_reach_the_container_spec_and_socket_stays_refused():
    request = ResourceRequest(image="fgpu/x:1", image_name="x", cpu=1.0, mem=2**30)
    mounts = session_mounts(GROUP_DATA, "bob", ["course-a"])
    ctx = ContainerContext(
        name="c", user="bob", server_name="", command=[], env={}, port=8888, network="bridge"
    )
    spec = build_container_spec(request, Grant("s1", "local"), replace(ctx, mounts=mounts))
    assert spec.host_config["mounts"] == mounts
    bad = [*mounts, {"Type": "bind", "Source": "/var/run/docker.sock", "Target": "/s"}]
    with pytest.raises(ValueError, match="Docker socket"):
        build_container_spec(request, Grant("s1", "local"), replace(ctx, mounts=bad))


# --- a real hub: the home folder outlives the session -----------------------------------------

TINY_PACKAGE = "fgpu_tinypkg"


def tiny_wheel(package: str = TINY_PACKAGE) -> tuple[str, bytes]:
    """A one-module wheel built here, so that `pip install` needs no network. Its module is
    `package`, whose VALUE is "tiny-ok"."""
    distribution = package.replace("_", "-")
    files = {
        f"{package}/__init__.py": b'VALUE = "tiny-ok"\n',
        f"{package}-0.1.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n".encode()
        ),
        f"{package}-0.1.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: fgpu-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [f"{path},sha256={_record_hash(data)},{len(data)}" for path, data in files.items()]
    record_path = f"{package}-0.1.dist-info/RECORD"
    files[record_path] = ("\n".join([*record, f"{record_path},,"]) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)
    return f"{package}-0.1-py3-none-any.whl", buffer.getvalue()


def _record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


class Contents:
    """The session's Jupyter contents API, through the hub's proxy, as the user's browser uses it."""

    def __init__(self, hub, username):
        self.base = f"{hub.url}/user/{username}/api/contents"
        self.headers = {"Authorization": f"token {hub.user_token(username)}"}

    def put(self, path: str, content: str, fmt: str = "text") -> None:
        body = {"type": "file", "format": fmt, "content": content}
        response = requests.put(f"{self.base}/{path}", json=body, headers=self.headers, timeout=60)
        assert response.status_code in (200, 201), response.text

    def get(self, path: str) -> requests.Response:
        return requests.get(f"{self.base}/{path}", headers=self.headers, timeout=60)


def start_session(hub, username, image="python-3.11", server=""):
    response = hub.start_server(username, {"image": image, "cpu": 0.5, "mem": "512M"}, server)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(username, server)
    (container,) = containers_with({"fgpu.user": username, "fgpu.server_name": server})
    return container


def run_in(container, command: str) -> str:
    result = container.exec_run(["sh", "-c", command])
    assert result.exit_code == 0, result.output.decode(errors="replace")
    return result.output.decode().strip()


@pytest.mark.docker
@pytest.mark.hub
def test_notebooks_and_user_packages_survive_the_next_session(hub, username, docker_engine):
    first = start_session(hub, username)
    contents = Contents(hub, username)
    contents.put("notes.txt", "kept between sessions")
    wheel_name, wheel = tiny_wheel()
    contents.put(wheel_name, base64.b64encode(wheel).decode(), fmt="base64")
    run_in(first, f"pip install --user --no-index ~/{wheel_name}")
    hub.stop_server(username)
    assert containers_with({"fgpu.user": username}) == []

    second = start_session(hub, username)
    assert second.id != first.id
    notes = Contents(hub, username).get("notes.txt")
    assert notes.status_code == 200 and notes.json()["content"] == "kept between sessions"
    assert run_in(second, f"python -c 'import {TINY_PACKAGE}; print({TINY_PACKAGE}.VALUE)'") == (
        "tiny-ok"
    )
    assert run_in(second, "stat -c %u:%g ~ ~/.local ~/notes.txt").split() == ["1000:100"] * 3
    volume = docker_engine.volumes.get(f"fgpu-home-{username}")
    assert volume.attrs["Labels"]["fgpu.user"] == username
    hub.stop_server(username)


def add_to_group(hub, group: str, users: list[str]) -> None:
    response = hub.request("POST", f"groups/{group}")
    assert response.status_code in (201, 409), response.text
    response = hub.request("POST", f"groups/{group}/users", json={"users": users})
    assert response.status_code == 200, response.text


@pytest.mark.docker
@pytest.mark.hub
def test_group_data_is_read_only_for_students_and_writable_for_instructors(hub):
    suffix = secrets.token_hex(3)
    course, student, instructor = f"course-{suffix}", f"student-{suffix}", f"teacher-{suffix}"
    for user in (student, instructor):
        hub.create_user(user)
    add_to_group(hub, course, [student, instructor])
    add_to_group(hub, "instructors", [instructor])
    folder = f"~/data/{course}"

    teacher_session = start_session(hub, instructor)
    run_in(teacher_session, f"echo week-1 > {folder}/handout.txt")
    student_session = start_session(hub, student)
    assert run_in(student_session, f"cat {folder}/handout.txt") == "week-1"
    refused = student_session.exec_run(["sh", "-c", f"touch {folder}/mine.txt"])
    assert refused.exit_code != 0 and b"Read-only file system" in refused.output
    hub.stop_server(student)
    hub.stop_server(instructor)


def test_folders_are_bound_under_the_home_folder_read_only_as_the_share_says():
    folders = [
        {"source": "/srv/folders/" + "a" * 32, "path": "folders/course", "read_only": True},
        {"source": "/srv/folders/" + "b" * 32, "path": ".cache", "read_only": False},
    ]
    course, cache = folder_mounts("/home/jovyan/", folders)
    assert (course["Target"], course["Source"], course["Type"], course["ReadOnly"]) == (
        "/home/jovyan/folders/course",
        "/srv/folders/" + "a" * 32,
        "bind",
        True,
    )
    assert (cache["Target"], cache["ReadOnly"]) == ("/home/jovyan/.cache", False)
