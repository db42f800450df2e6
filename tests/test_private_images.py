"""Session → private image: the pure naming and config parts, then a real hub, service and dockerd."""

from __future__ import annotations

import contextlib
import io
import json
import secrets
import tarfile
import threading
import time

import docker.errors
import pytest
from playwright.sync_api import expect

from image_catalog.catalog import is_valid_reference
from queue_service.engine.container_commits import commit_config
from queue_service.private_images import (
    LABEL_OWNER,
    CommitError,
    check_tag,
    in_private_repository,
    private_entry,
    private_reference,
    user_component,
)

from .browser import (
    SESSIONS_PAGE,
    SPAWN_TIMEOUT_MS,
    launch,
    log_in,
    rows,
    screenshot,
    submit_launch,
)
from .harness import TEST_LABEL, QueueUser, containers_with, docker_client
from .test_storage import TINY_PACKAGE, run_in, start_session, tiny_wheel

SHARED_BASE = "fgpu/jupyter-base:py3.11"

# --- pure parts -------------------------------------------------------------------------------


@pytest.mark.parametrize("tag", ["v1", "2026-11-22", "with_numpy.2", "A" * 128])
def test_good_tags(tag):
    assert check_tag(tag) == tag


@pytest.mark.parametrize("tag", ["", "-x", ".x", "a:b", "a/b", "sp ace", "A" * 129, 5, None])
def test_bad_tags_are_400s(tag):
    with pytest.raises(CommitError) as refused:
        check_tag(tag)
    assert refused.value.cause == "invalid"


def test_repository_names_follow_the_user():
    assert private_reference("alice", "v1") == "fgpu-private/alice:v1"
    assert user_component("student-1a2b") == "student-1a2b"


@pytest.mark.parametrize(
    "reference",
    [
        "fgpu-private/alice:t1",
        "fgpu-private/alice",
        "docker.io/fgpu-private/alice:t1",
        "index.docker.io/fgpu-private/alice:t1",
        "fgpu-private/alice@sha256:" + "0" * 64,
    ],
)
def test_private_repository_spellings(reference):
    assert in_private_repository(reference)


@pytest.mark.parametrize(
    "reference",
    ["fgpu/jupyter-base:py3.11", "course/fgpu-private:x", "fgpu-private:t1", "sha256:" + "0" * 64],
)
def test_other_repositories(reference):
    assert not in_private_repository(reference)


ODD_NAMES = ["a@b.org", "Alice", "-x", "a--b_", "ünï", "u_x", "a..b"]


@pytest.mark.parametrize("user", ODD_NAMES)
def test_user_names_docker_refuses_become_valid_distinct_components(user):
    assert user_component(user).startswith("u_")
    assert is_valid_reference(private_reference(user, "v1"))
    assert len({user_component(name) for name in [*ODD_NAMES, "alice"]}) == len(ODD_NAMES) + 1


SOURCE = {
    "name": "scikit-learn-1.5",
    "display_name": "scikit-learn 1.5",
    "framework": "scikit-learn",
    "version": "1.5.2",
    "gpu": False,
    "resources": {"min": {"mem": "1G"}},
    "groups": ["course-a"],
    "hidden": False,
}


def test_private_entry_is_owned_and_keeps_the_source_framework():
    entry = private_entry("alice", "v1", "fgpu-private/alice:v1", SOURCE)
    assert (entry.name, entry.image, entry.owner) == ("alice-v1", "fgpu-private/alice:v1", "alice")
    assert (entry.framework, entry.version) == ("scikit-learn", "1.5.2")
    assert entry.display_name == "scikit-learn 1.5 (alice: v1)"
    assert entry.resources.min.mem == 2**30
    # Offered to its owner alone, whatever groups the source image had.
    assert entry.groups == () and not entry.hidden


def test_private_entry_without_a_known_source():
    entry = private_entry("bob", "Snap_1", "fgpu-private/bob:Snap_1", None)
    assert entry.name == "bob-snap_1" and entry.framework == ""


def test_a_tag_that_already_names_the_owner_is_not_prefixed_twice():
    # An admin tagging stud1's session "stud1-pkgs" gets "stud1-pkgs", not "stud1-stud1-pkgs".
    entry = private_entry("stud1", "Stud1-pkgs", "fgpu-private/stud1:Stud1-pkgs", SOURCE)
    assert entry.name == "stud1-pkgs"
    assert entry.display_name == "scikit-learn 1.5 (Stud1-pkgs)"
    # A tag that only starts like the name ("stud12") still gets the owner's prefix.
    assert private_entry("stud1", "stud12", "r", SOURCE).name == "stud1-stud12"


def test_a_name_the_catalog_refuses_is_a_400():
    with pytest.raises(CommitError) as refused:
        private_entry("alice", "x" * 100, "fgpu-private/alice:x", None)
    assert refused.value.cause == "invalid" and "cannot be registered" in refused.value.message


IMAGE_CONFIG = {
    "Env": ["PATH=/opt/venv/bin:/usr/bin", "HOME=/home/jovyan"],
    "Cmd": ["jupyterhub-singleuser"],
    "Entrypoint": ["tini", "-g", "--"],
    "User": "1000",
    "WorkingDir": "/home/jovyan",
    "Labels": {"fgpu.catalog-name": "python-3.11"},
}
CONTAINER_CONFIG = {
    "Env": [
        "PATH=/opt/venv/bin:/usr/bin",
        "JUPYTERHUB_API_TOKEN=secret-token",
        "FGPU_SESSION_ID=abc",
    ],
    "Cmd": ["jupyterhub-singleuser", "--port=8888"],
    "User": "1000:100",
    "Labels": {"fgpu.catalog-name": "python-3.11", "fgpu.grant": "{}", "fgpu.user": "bob"},
}


def test_commit_config_blanks_the_sessions_variables_and_labels():
    conf = commit_config(IMAGE_CONFIG, CONTAINER_CONFIG, {LABEL_OWNER: "bob"})
    assert conf["Env"] == [*IMAGE_CONFIG["Env"], "JUPYTERHUB_API_TOKEN=", "FGPU_SESSION_ID="]
    assert "secret-token" not in json.dumps(conf)
    assert conf["Labels"] == {
        "fgpu.catalog-name": "python-3.11",
        "fgpu.grant": "",
        "fgpu.user": "",
        LABEL_OWNER: "bob",
    }


def test_commit_config_keeps_the_images_command_and_user():
    conf = commit_config(IMAGE_CONFIG, CONTAINER_CONFIG, {})
    assert (conf["Cmd"], conf["Entrypoint"], conf["User"], conf["WorkingDir"]) == (
        ["jupyterhub-singleuser"],
        ["tini", "-g", "--"],
        "1000",
        "/home/jovyan",
    )


# --- a real hub -------------------------------------------------------------------------------


def put_file(container, folder: str, name: str, data: bytes) -> None:
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    assert container.put_archive(folder, archive.getvalue())


#: Installed with `pip install --user`: it goes to the home volume, which a commit leaves out.
USER_PACKAGE = "fgpu_userpkg"


def pip_install_as_the_student(container, package: str, *options: str) -> str:
    """`pip install [options] <wheel>` as the session's own user (no root: there is no sudo),
    from a wheel copied in (a session here cannot reach an index); where pip put the package."""
    wheel_name, wheel = tiny_wheel(package)
    put_file(container, "/tmp", wheel_name, wheel)
    run_in(container, f"pip install --no-index {' '.join(options)} /tmp/{wheel_name}")
    where = f"python -c 'import {package}, os; print(os.path.dirname({package}.__file__))'"
    return run_in(container, where)


@pytest.fixture(scope="module")
def committed(hub, docker_engine):
    """A student's running session with a package installed both ways and a home file, committed
    by the admin."""
    owner = f"student-{secrets.token_hex(4)}"
    container = start_session(hub, owner)
    site = "lib/python3.11/site-packages"
    # A plain `pip install` lands in the image's environment, which the student owns...
    assert pip_install_as_the_student(container, TINY_PACKAGE) == f"/opt/venv/{site}/{TINY_PACKAGE}"
    # ...and `--user` in the home folder.
    user_site = f"/home/jovyan/.local/{site}/{USER_PACKAGE}"
    assert pip_install_as_the_student(container, USER_PACKAGE, "--user") == user_site
    run_in(container, "echo personal > ~/in-home.txt")
    admin = QueueUser(hub, "admin")
    tag = f"t{secrets.token_hex(3)}"
    session_id = container.labels["fgpu.session_id"]
    response = admin.call("POST", f"sessions/{session_id}/image", json={"tag": tag})
    assert response.status_code == 201, response.text
    result = response.json()
    yield {"owner": owner, "container": container, "admin": admin, "tag": tag, **result}
    hub.stop_server(owner)
    docker_engine.images.remove(result["image"], force=True)


@pytest.mark.docker
@pytest.mark.hub
def test_commit_names_the_image_under_the_owner_and_keeps_the_session(hub, committed):
    assert committed["image"] == f"fgpu-private/{committed['owner']}:{committed['tag']}"
    assert committed["source_image"] == "fgpu/jupyter-base:py3.11"
    container = committed["container"]
    container.reload()
    assert container.status == "running"
    assert hub.server_model(committed["owner"])["ready"]


@pytest.mark.docker
@pytest.mark.hub
def test_private_image_keeps_system_packages_but_no_home_and_no_session_secrets(
    committed, docker_engine
):
    image = docker_engine.images.get(committed["image"])
    config = image.attrs["Config"]
    assert config["Labels"][LABEL_OWNER] == committed["owner"]
    assert config["Cmd"] == ["jupyterhub-singleuser"]
    session_env = dict(e.split("=", 1) for e in committed["container"].attrs["Config"]["Env"])
    assert session_env["JUPYTERHUB_API_TOKEN"]
    assert session_env["JUPYTERHUB_API_TOKEN"] not in json.dumps(config)
    script = (
        f"python -c 'import {TINY_PACKAGE}; print({TINY_PACKAGE}.VALUE)'; "
        f"python -c 'import {USER_PACKAGE}' 2>&1 | tail -1; ls -A ~"
    )
    output = docker_engine.containers.run(
        committed["image"],
        ["sh", "-c", script],
        remove=True,
        labels={TEST_LABEL: "private-image-check"},
    ).decode()
    # What the student installed into the system is in the image; the --user one stayed home.
    assert output.splitlines()[:2] == [
        "tiny-ok",
        f"ModuleNotFoundError: No module named '{USER_PACKAGE}'",
    ]
    assert "in-home.txt" not in output


@pytest.mark.docker
@pytest.mark.hub
def test_the_owner_alone_sees_and_starts_the_private_image(hub, committed):
    entry = committed["catalog"]
    assert (entry["owner"], entry["image"]) == (committed["owner"], committed["image"])
    owner = QueueUser(hub, committed["owner"])
    other = QueueUser(hub, f"student-{secrets.token_hex(4)}")
    images = owner.call("GET", "images")
    assert images.status_code == 200, images.text
    assert entry["name"] in {image["name"] for image in images.json()["images"]}
    assert entry["name"] not in {
        image["name"] for image in other.call("GET", "images").json()["images"]
    }

    refused = hub.start_server(other.name, {"image": entry["name"], "cpu": 0.5, "mem": "512M"})
    assert refused.status_code == 403, refused.text
    assert containers_with({"fgpu.user": other.name}) == []

    server = "from-private"
    container = start_session(hub, owner.name, image=entry["name"], server=server)
    assert container.attrs["Config"]["Image"] == committed["image"]
    printed = run_in(container, f"python -c 'import {TINY_PACKAGE}; print({TINY_PACKAGE}.VALUE)'")
    assert printed == "tiny-ok"
    hub.stop_server(owner.name, server)


@pytest.mark.docker
@pytest.mark.hub
def test_commit_refusals(hub, committed):
    session_id = committed["container"].labels["fgpu.session_id"]
    admin, path = committed["admin"], f"sessions/{session_id}/image"
    owner = QueueUser(hub, committed["owner"])
    cases = [
        (owner, path, {"tag": "mine"}, 403, "hub admins"),
        (admin, "sessions/0123456789abcdef/image", {"tag": "x"}, 404, "No such session"),
        (admin, path, {"tag": "-bad"}, 400, "tag must be"),
        (admin, path, {}, 400, "tag must be"),
        (admin, path, {"tag": committed["tag"]}, 409, "already has an image"),
        (admin, path, {"tag": "x" * 100}, 400, "cannot be registered"),
    ]
    for caller, url, body, status, message in cases:
        response = caller.call("POST", url, json=body)
        assert response.status_code == status, (body, response.text)
        assert message in response.json()["message"]


@pytest.mark.docker
@pytest.mark.hub
def test_instructors_cannot_change_take_or_relist_a_students_private_image(hub, committed):
    name = f"teacher-{secrets.token_hex(4)}"
    hub.create_user(name)
    response = hub.request("POST", "groups/instructors/users", json={"users": [name]})
    assert response.status_code == 200, response.text
    teacher = QueueUser(hub, name)  # its token carries the instructors' manage scope
    private = committed["catalog"]["name"]
    before = committed["admin"].call("GET", f"images/{private}?user={committed['owner']}").json()
    attempts = [
        ("PATCH", f"images/{private}", {"hidden": True}, "private image"),
        ("PATCH", f"images/{private}", {"owner": name}, "private image"),
        ("DELETE", f"images/{private}", None, "private image"),
        (
            "POST",
            "images",
            {"name": f"copy-{committed['tag']}", "image": committed["image"]},
            "admins",
        ),
        ("POST", "images", {"name": "gift", "image": SHARED_BASE, "owner": name}, "admins"),
    ]
    for method, path, body, message in attempts:
        answer = teacher.call(method, path, json=body)
        assert answer.status_code == 403, (method, path, answer.text)
        assert message in answer.json()["message"], answer.text
    after = committed["admin"].call("GET", f"images/{private}?user={committed['owner']}").json()
    assert after == before
    assert not {f"copy-{committed['tag']}", "gift"} & {
        image["name"] for image in teacher.call("GET", "images?all=1").json()["images"]
    }
    # The shared catalog stays theirs to curate.
    assert teacher.call("GET", "images?all=1").status_code == 200


@pytest.mark.docker
@pytest.mark.hub
def test_a_session_that_no_longer_runs_is_a_409(hub, username, docker_engine):
    container = start_session(hub, username)
    session_id = container.labels["fgpu.session_id"]
    hub.stop_server(username)
    admin = QueueUser(hub, "admin")
    # The record ends a moment after the hub reports the server gone; wait for TERMINATED.
    admin.wait_for(lambda sessions: session_id not in {s["id"] for s in sessions})
    response = admin.call("POST", f"sessions/{session_id}/image", json={"tag": "late"})
    assert response.status_code == 409, response.text
    assert "only a running one" in response.json()["message"]
    assert docker_engine.images.list(name=f"fgpu-private/{username}") == []


@pytest.mark.docker
@pytest.mark.hub
def test_commits_while_execs_enter_the_session_under_load_never_freeze_it(
    hub, username, docker_engine
):
    """What once froze a session for good: "Save image" while `docker exec`s enter the container.
    Three commits in a row, with three threads entering the container all along and the session
    busy on a core: each commit makes its image, the session stays RUNNING and unpaused, and the
    engine answers an inspect of the container within seconds throughout."""
    container = start_session(hub, username)
    session_id = container.labels["fgpu.session_id"]
    container.exec_run(["sh", "-c", "while :; do :; done"], detach=True)  # the load
    admin, stop, inspects = QueueUser(hub, "admin"), threading.Event(), []

    def execs():
        while not stop.is_set():
            container.exec_run(["sh", "-c", "date > /tmp/now; ls /opt/venv > /dev/null"])

    def inspect():
        client = docker_client()
        # At least three inspects even when the commits are done sooner (a quiet engine commits
        # a session this small in a tenth of a second).
        while not stop.is_set() or len(inspects) < 3:
            started = time.monotonic()
            state = client.api.inspect_container(container.id)["State"]
            inspects.append((time.monotonic() - started, state["Status"]))
            time.sleep(0.2)

    threads = [threading.Thread(target=execs) for _ in range(3)] + [
        threading.Thread(target=inspect)
    ]
    tags = [f"busy{secrets.token_hex(3)}-{i}" for i in range(3)]
    try:
        for thread in threads:
            thread.start()
        for tag in tags:
            response = admin.call("POST", f"sessions/{session_id}/image", json={"tag": tag})
            assert response.status_code == 201, response.text
            assert docker_engine.images.get(response.json()["image"])
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        for tag in tags:
            with contextlib.suppress(docker.errors.ImageNotFound):
                docker_engine.images.remove(private_reference(username, tag), force=True)
    assert not any(thread.is_alive() for thread in threads), "an engine call never came back"
    assert len(inspects) >= 3
    assert max(seconds for seconds, _ in inspects) < 5, inspects
    assert {status for _, status in inspects} == {"running"}  # never paused
    (record,) = [s for s in admin.sessions() if s["id"] == session_id]
    assert record["status"] == "RUNNING"


@pytest.mark.docker
@pytest.mark.hub
@pytest.mark.browser
def test_acceptance_admin_saves_a_session_on_the_sessions_page_and_its_owner_starts_it(
    hub, pages, docker_engine
):
    """The issue's walk-through on pages alone: the admin's "Save image" on a student's running
    session, then the student's launch dialog offers the image and starts a session from it."""
    owner = f"student-{secrets.token_hex(4)}"
    pip_install_as_the_student(start_session(hub, owner), TINY_PACKAGE)
    tag = f"page-{secrets.token_hex(3)}"
    reference, name = f"fgpu-private/{owner}:{tag}", f"{owner}-{tag}"
    try:
        admin = pages()
        log_in(admin, hub, "admin")
        admin.goto(hub.url + SESSIONS_PAGE)
        rows(admin, "RUNNING").filter(has_text=owner).locator(".fgpu-save-image").click()
        expect(admin.locator("#fgpu-save-about")).to_contain_text(owner)
        admin.fill("#fgpu-save-tag", tag)
        admin.click("#fgpu-save-submit")
        expect(admin.locator("#fgpu-notice")).to_contain_text(reference, timeout=SPAWN_TIMEOUT_MS)
        expect(admin.locator("#fgpu-notice")).to_contain_text(name)
        screenshot(admin, "private-image-saved")

        student = pages()
        log_in(student, hub, owner)
        student.goto(hub.url + SESSIONS_PAGE)
        launch(student, name, cpu=0.5, mem_gib=0.5, fgpu=0, count=1)
        submit_launch(student)
        expect(rows(student, "RUNNING").filter(has_text=name)).to_have_count(
            1, timeout=SPAWN_TIMEOUT_MS
        )
        screenshot(student, "private-image-session")
        (container,) = containers_with({"fgpu.user": owner, "fgpu.image": name})
        assert container.attrs["Config"]["Image"] == reference
        printed = run_in(
            container, f"python -c 'import {TINY_PACKAGE}; print({TINY_PACKAGE}.VALUE)'"
        )
        assert printed == "tiny-ok"
    finally:
        # An image cannot be removed while a container of it runs.
        hub.stop_servers({(user, server) for user, server in hub.active_servers() if user == owner})
        for image in docker_engine.images.list(name=f"fgpu-private/{owner}"):
            docker_engine.images.remove(image.id, force=True)
