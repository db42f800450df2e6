"""Deep trees in storage folders, on a real hub: the files API refuses paths past its depth with
a 400 that names the limit, a tree a session made deeper than Python recurses is measured by the
round, removed through the API without a 500, and a folder the round cannot measure is named on
the admins' view while the others are measured all the same."""

from __future__ import annotations

import os
import secrets
import shutil

import pytest

from queue_service.core.folder_names import MAX_PATH_DEPTH

from .deep_trees import deep_tree, empty_out
from .harness import QueueUser, queue_option, running_hub, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.hub]

DEPTH = 2000
OCTETS = {"Content-Type": "application/octet-stream"}
# The measure round every second: a test waits for the next one, not for 15 minutes.
FAST_MEASURE = queue_option("folder_measure_interval", 1)


@pytest.fixture(scope="module")
def deep_hub(tmp_path_factory, docker_engine, test_catalog):
    env = {"FGPU_CATALOG_PATH": str(test_catalog)}
    workdir = tmp_path_factory.mktemp("deep")
    with running_hub(workdir, FAST_MEASURE, env=env) as deep_hub:
        yield deep_hub
    empty_out(workdir)


@pytest.fixture
def user(deep_hub) -> QueueUser:
    return QueueUser(deep_hub, f"deep-{secrets.token_hex(3)}")


def made(user: QueueUser, name: str) -> dict:
    response = user.call("POST", "folders", json={"name": name})
    assert response.status_code == 201, response.text
    return response.json()


def on_disk(deep_hub, folder: dict) -> str:
    return str(deep_hub.workdir / "fgpu-folders" / folder["id"])


def listed(user: QueueUser, folder: dict, everyone: bool = False) -> dict:
    response = user.call("GET", "folders?all=1" if everyone else "folders")
    assert response.status_code == 200, response.text
    return next(f for f in response.json()["folders"] if f["id"] == folder["id"])


def test_a_path_past_the_depth_limit_is_a_400_naming_it_and_makes_nothing(deep_hub, user):
    folder = made(user, "nested")
    path = "/".join(["d"] * MAX_PATH_DEPTH)
    for level in range(1, MAX_PATH_DEPTH + 1):
        made_dir = user.call(
            "POST",
            f"folders/{folder['id']}/files/{path[: 2 * level - 1]}",
            json={"type": "directory"},
        )
        assert made_dir.status_code == 201, made_dir.text
    deeper = f"folders/{folder['id']}/files/{path}/d"
    response = user.call("POST", deeper, json={"type": "directory"})
    assert response.status_code == 400
    assert f"at most {MAX_PATH_DEPTH} levels" in response.json()["message"]
    assert os.listdir(os.path.join(on_disk(deep_hub, folder), path)) == []
    for method, kwargs in [("PUT", {"data": b"x", "headers": OCTETS}), ("GET", {}), ("DELETE", {})]:
        assert user.call(method, deeper + "?offset=0", **kwargs).status_code == 400


def test_a_tree_a_session_made_deeper_than_python_recurses_is_measured_and_removed(deep_hub, user):
    deep, plain = made(user, "deep"), made(user, "plain")
    deep_tree(on_disk(deep_hub, deep), DEPTH)  # as a session writes it, straight to disk
    put = user.call(
        "PUT", f"folders/{plain['id']}/files/notes.txt?offset=0", data=b"x" * 5000, headers=OCTETS
    )
    assert put.status_code in (200, 201), put.text
    # The round measures the deep folder in full (a file and a link on each level) and the
    # other folder too.
    wait_until(
        lambda: listed(user, deep)["files"] == 2 * DEPTH,
        timeout=60,
        what="the deep folder measured",
    )
    assert listed(user, plain)["files"] == 1
    # An upload beside it and its removal through the API answer as they should, never 500.
    beside = user.call(
        "PUT", f"folders/{deep['id']}/files/more.txt?offset=0", data=b"y", headers=OCTETS
    )
    assert beside.status_code in (200, 201), beside.text
    removed = user.call("DELETE", f"folders/{deep['id']}/files/a")
    assert removed.status_code in (200, 204), removed.text
    assert sorted(os.listdir(on_disk(deep_hub, deep))) == ["f", "more.txt", "out"]
    wait_until(lambda: listed(user, deep)["files"] == 3, timeout=60, what="the removal measured")


def test_a_folder_the_round_cannot_measure_is_named_to_admins_and_the_others_are_measured(
    deep_hub, user
):
    broken, other = made(user, "broken"), made(user, "other")
    shutil.rmtree(on_disk(deep_hub, broken))  # its files gone from the host
    with open(os.path.join(on_disk(deep_hub, other), "late.bin"), "wb") as late:
        late.write(b"z" * 3000)
    admin = QueueUser(deep_hub, "admin")
    problem = wait_until(
        lambda: listed(admin, broken, everyone=True).get("problem"),
        timeout=60,
        what="the problem shown",
    )
    assert "missing" in problem
    wait_until(
        lambda: listed(user, other)["files"] == 1, timeout=60, what="the other folder measured"
    )
    assert listed(admin, other, everyone=True)["problem"] is None
    assert "problem" not in listed(user, broken)  # a user's own view: the admins' matter
