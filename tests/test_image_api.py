"""api/images end to end: instructors curate the catalog, students start only what they may.

A real hub (the shipped config: the `instructors` group, the custom scope and its role), the real
queue service and its DB, and real image checks on the Docker engine.
"""

from __future__ import annotations

import re
import secrets

import pytest
import requests

from .harness import QueueUser, containers_with, logged_in

pytestmark = [pytest.mark.docker, pytest.mark.hub]
SKLEARN_14 = "fgpu/scikit-learn:1.4.2"
SMALL = {"cpu": 0.5, "mem": "512M"}


class Person(QueueUser):
    """A new hub user, in `groups`, calling the queue service with a token of their own."""

    def __init__(self, hub, prefix: str, groups: tuple[str, ...] = (), admin: bool = False):
        name = f"{prefix}-{secrets.token_hex(4)}"
        response = hub.request("POST", f"users/{name}", json={"admin": admin})
        assert response.status_code == 201, response.text
        for group in groups:
            add_to_group(hub, group, name)
        # The token is made after joining the groups: it carries the scopes they grant.
        super().__init__(hub, name)

    def image_names(self, query: str = "") -> list[str]:
        response = self.call("GET", f"images{query}")
        assert response.status_code == 200, response.text
        return [image["name"] for image in response.json()["images"]]

    def start(self, options: dict, server: str = "") -> requests.Response:
        return self.hub.request("POST", f"users/{self.name}/servers/{server}", json=options)


def add_to_group(hub, group: str, user: str) -> None:
    assert hub.request("POST", f"groups/{group}").status_code in (201, 409)
    response = hub.request("POST", f"groups/{group}/users", json={"users": [user]})
    assert response.status_code == 200, response.text


@pytest.fixture
def instructor(hub):
    return Person(hub, "teacher", groups=("instructors",))


@pytest.fixture
def course_a_student(hub):
    return Person(hub, "ann", groups=("course-a",))


@pytest.fixture
def course_b_student(hub):
    return Person(hub, "bob", groups=("course-b",))


@pytest.fixture
def image_name(instructor):
    """A fresh catalog name; deleted afterwards through the API, whatever the test did."""
    name = f"sk-{secrets.token_hex(3)}"
    yield name
    instructor.call("DELETE", f"images/{name}")


@pytest.fixture(scope="module")
def no_server_image(docker_engine):
    """An image whose entrypoint cannot run jupyterhub-singleuser (it exits 1 at once)."""
    tag = secrets.token_hex(4)
    container = docker_engine.containers.create("fgpu/jupyter-base:py3.11", command=["true"])
    try:
        container.commit("fgpu-test/no-server", tag, changes=['ENTRYPOINT ["/bin/false"]'])
    finally:
        container.remove()
    yield f"fgpu-test/no-server:{tag}"
    docker_engine.images.remove(f"fgpu-test/no-server:{tag}", force=True)


def assert_nothing_started(person: Person) -> None:
    assert containers_with({"fgpu.user": person.name}) == []
    sessions = person.call("GET", "sessions").json()["sessions"]
    assert sessions == []
    assert person.hub.server_model(person.name) is None


def test_an_instructor_adds_an_image_checked_on_the_engine(instructor, image_name):
    response = instructor.call(
        "POST", "images", json={"name": image_name, "image": SKLEARN_14, "description": "For lab 3"}
    )
    assert response.status_code == 201, response.text
    added = response.json()
    assert added["check"]["ok"] is True
    assert re.fullmatch(r"jupyterhub-singleuser \d+\.\d+\.\d+", added["check"]["message"])
    # Not in the request: read from the labels `python -m image_catalog build` wrote.
    assert (added["framework"], added["version"]) == ("scikit-learn", "1.4.2")
    assert added["description"] == "For lab 3" and added["source"] == "api"
    assert image_name in instructor.image_names("?all=1")
    assert containers_with({"fgpu.image-check": SKLEARN_14}) == [], "the check cleans up"


def test_restricted_then_hidden_image_is_neither_offered_nor_startable(
    hub, instructor, course_a_student, course_b_student, image_name
):
    assert instructor.call("POST", "images", json={"name": image_name, "image": SKLEARN_14}).ok
    patched = instructor.call("PATCH", f"images/{image_name}", json={"groups": ["course-a"]})
    assert patched.status_code == 200 and patched.json()["groups"] == ["course-a"]

    assert image_name in course_a_student.image_names()
    assert image_name not in course_b_student.image_names()
    spawn_page = logged_in(hub, course_b_student.name).get(f"{hub.url}/hub/spawn", timeout=60)
    assert spawn_page.status_code == 200 and "python-3.11" in spawn_page.text
    assert image_name not in spawn_page.text
    for refused in (
        course_b_student.start({"image": image_name, **SMALL}),
        course_b_student.call("POST", "sessions", json={"image": image_name, **SMALL}),
    ):
        assert refused.status_code == 403, refused.text
        assert "only for the group(s) course-a" in refused.json()["message"]
    assert course_b_student.call("GET", f"images/{image_name}").status_code == 403
    assert_nothing_started(course_b_student)

    hidden = instructor.call("PATCH", f"images/{image_name}", json={"hidden": True})
    assert hidden.status_code == 200 and hidden.json()["hidden"] is True
    assert image_name not in course_a_student.image_names()
    refused = course_a_student.start({"image": image_name, **SMALL})
    assert refused.status_code == 403 and "hidden" in refused.json()["message"]
    assert_nothing_started(course_a_student)
    assert image_name in instructor.image_names("?all=1"), "instructors still manage it"


def test_acceptance_an_image_limited_to_course_a_starts_for_a_course_a_student(
    hub, instructor, course_a_student, image_name
):
    body = {
        "name": image_name,
        "image": SKLEARN_14,
        "groups": ["course-a"],
        "resources": {"min": {"cpu": 1, "mem": "1G"}},
    }
    assert instructor.call("POST", "images", json=body).status_code == 201
    too_small = course_a_student.start({"image": image_name, **SMALL})
    assert too_small.status_code == 400
    assert "needs at least 1 CPU cores" in too_small.json()["message"]
    assert_nothing_started(course_a_student)

    response = course_a_student.start({"image": image_name, "cpu": 1, "mem": "1G"})
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(course_a_student.name)
    (container,) = containers_with({"fgpu.user": course_a_student.name})
    assert container.attrs["Config"]["Image"] == SKLEARN_14
    assert container.labels["fgpu.image"] == image_name
    version = container.exec_run(["python3", "-c", "import sklearn; print(sklearn.__version__)"])
    assert version.output.decode().strip() == "1.4.2"
    hub.stop_server(course_a_student.name)


def test_students_cannot_change_the_catalog(course_a_student):
    before = course_a_student.image_names()
    attempts = [
        ("POST", "images", {"name": "mine", "image": SKLEARN_14}),
        ("PATCH", "images/python-3.11", {"hidden": True}),
        ("DELETE", "images/python-3.11", None),
        ("POST", "images/python-3.11/check", None),
        ("GET", "images?all=1", None),
        ("GET", "images?user=someone-else", None),
    ]
    for method, path, body in attempts:
        response = course_a_student.call(method, path, json=body)
        assert response.status_code == 403, (method, path, response.text)
        assert response.headers["Content-Type"].startswith("application/json")
    assert "custom:images:manage" in course_a_student.call("POST", "images", json={}).text
    assert course_a_student.image_names() == before


def test_admins_manage_images_too(hub, image_name):
    admin = Person(hub, "root", admin=True)
    response = admin.call("POST", "images", json={"name": image_name, "image": SKLEARN_14})
    assert response.status_code == 201, response.text
    assert admin.call("DELETE", f"images/{image_name}").status_code == 200
    assert image_name not in admin.image_names("?all=1")


def test_check_action_records_the_result(instructor):
    response = instructor.call("POST", "images/python-3.11/check")
    assert response.status_code == 200, response.text
    check = response.json()["check"]
    assert check["ok"] is True and check["checked_at"]
    listed = instructor.call("GET", "images?all=1").json()["images"]
    assert next(i for i in listed if i["name"] == "python-3.11")["check"] == check


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"image": "fgpu-test/never-built:1"}, 400, "is not on this host's Docker engine"),
        ({"image": "Bad//Reference"}, 400, "is not a valid image reference"),
        ({"image": "NO_SERVER"}, 400, "cannot start a single-user server"),
        (
            {"image": SKLEARN_14, "resources": {"min": {"cpu": 4}, "max": {"cpu": 2}}},
            400,
            "the min 4 CPU cores exceeds the max 2 CPU cores",
        ),
        ({"image": SKLEARN_14, "gpu": "yes"}, 400, "gpu must be true or false"),
        ({"image": SKLEARN_14, "colour": "red"}, 400, "unknown field(s) colour"),
    ],
)
def test_bad_images_get_a_clear_error_and_leave_no_row(
    instructor, image_name, no_server_image, body, status, fragment
):
    body = {"name": image_name, **body}
    if body["image"] == "NO_SERVER":
        body["image"] = no_server_image
    response = instructor.call("POST", "images", json=body)
    assert response.status_code == status, response.text
    assert fragment in response.json()["message"]
    assert image_name not in instructor.image_names("?all=1")
    assert containers_with({"fgpu.image-check": body["image"]}) == []


def test_a_duplicate_name_is_refused_and_the_original_kept(instructor):
    before = instructor.call("GET", "images?all=1").json()["images"]
    response = instructor.call("POST", "images", json={"name": "python-3.11", "image": SKLEARN_14})
    assert response.status_code == 409
    assert "already in the catalog" in response.json()["message"]
    assert instructor.call("GET", "images?all=1").json()["images"] == before


def test_an_unknown_image_is_400_for_the_spawn_api_and_the_sessions_api(course_a_student):
    for response in (
        course_a_student.start({"image": "no-such-image", **SMALL}),
        course_a_student.call("POST", "sessions", json={"image": "no-such-image", **SMALL}),
    ):
        assert response.status_code == 400, response.text
        assert "Unknown image 'no-such-image'" in response.json()["message"]
    assert_nothing_started(course_a_student)


@pytest.fixture
def removable_tag(docker_engine):
    """A tag of the Jupyter base that a test may remove from the engine, as an admin might."""
    reference = f"fgpu-test/removed:{secrets.token_hex(4)}"
    repository, tag = reference.split(":")
    docker_engine.images.get("fgpu/jupyter-base:py3.11").tag(repository, tag)
    yield reference
    if docker_engine.images.list(name=reference):
        docker_engine.images.remove(reference)


def test_an_image_gone_from_the_engine_is_not_offered_and_cannot_be_shown(
    docker_engine, instructor, course_a_student, image_name, removable_tag
):
    """ "Check" reports the image missing; the launcher stops offering it, a launch is a 409,
    and "Show" after "Hide" is refused with the reason instead of offering what cannot start."""
    added = instructor.call("POST", "images", json={"name": image_name, "image": removable_tag})
    assert added.status_code == 201, added.text
    assert image_name in course_a_student.image_names()
    assert instructor.call("PATCH", f"images/{image_name}", json={"hidden": True}).ok

    docker_engine.images.remove(removable_tag)
    checked = instructor.call("POST", f"images/{image_name}/check").json()
    assert checked["check"]["ok"] is False and checked["on_engine"] is False

    shown = instructor.call("PATCH", f"images/{image_name}", json={"hidden": False})
    assert shown.status_code == 409, shown.text
    assert (
        f"{image_name} cannot be offered: {removable_tag} is not on this host's Docker engine"
        in (shown.json()["message"])
    )
    listed = {i["name"]: i for i in instructor.call("GET", "images?all=1").json()["images"]}
    assert listed[image_name]["hidden"] is True and listed[image_name]["on_engine"] is False


def test_a_catalog_image_not_built_is_not_offered_and_a_launch_is_409(hub, course_a_student):
    """The shared hub's catalog names `never-built`, which no engine holds."""
    assert "never-built" not in course_a_student.image_names()
    spawn_page = logged_in(hub, course_a_student.name).get(f"{hub.url}/hub/spawn", timeout=60)
    assert spawn_page.status_code == 200 and "never-built" not in spawn_page.text
    response = course_a_student.call("POST", "sessions", json={"image": "never-built", **SMALL})
    assert response.status_code == 409, response.text
    assert "is not on this host's Docker engine yet" in response.json()["message"]
    assert_nothing_started(course_a_student)


def test_students_see_no_build_states(instructor, course_a_student):
    assert all(
        "build" in image for image in instructor.call("GET", "images?all=1").json()["images"]
    )
    assert course_a_student.call("GET", "images?all=1").status_code == 403
    assert not any("build" in i for i in course_a_student.call("GET", "images").json()["images"])


def test_a_course_instructor_manages_their_courses_images_and_nothing_else(hub, image_name):
    teacher = Person(hub, "tim")
    course, other = make_course(hub, teacher.name), make_course(hub, Person(hub, "tb").name)
    student = Person(hub, "ann", groups=(course,))
    outsider = Person(hub, "eve")
    mine = {"name": image_name, "image": SKLEARN_14, "groups": [course]}
    # Not for everyone, not for another class too: 403 naming the courses, nothing added.
    for groups in ([], [course, other]):
        response = teacher.call("POST", "images", json={**mine, "groups": groups})
        assert response.status_code == 403, response.text
        assert course in response.json()["message"]
        assert image_name not in teacher.image_names("?all=1")
    response = teacher.call("POST", "images", json=mine)
    assert response.status_code == 201, response.text
    assert image_name in student.image_names()
    assert image_name not in outsider.image_names()
    # They list and change their own; widening it to everyone is refused, unchanged.
    assert teacher.image_names("?all=1") == [image_name]
    assert teacher.call("PATCH", f"images/{image_name}", json={"description": "Lab 3"}).ok
    response = teacher.call("PATCH", f"images/{image_name}", json={"groups": []})
    assert response.status_code == 403, response.text
    assert image_name not in outsider.image_names()
    # The shared catalog is not theirs; a student and a stranger change nothing.
    assert teacher.call("PATCH", "images/python-3.11", json={"hidden": True}).status_code == 403
    assert teacher.call("DELETE", "images/python-3.11").status_code == 403
    for caller in (student, outsider):
        response = caller.call("PATCH", f"images/{image_name}", json={"hidden": True})
        assert response.status_code == 403, response.text
    assert teacher.call("DELETE", f"images/{image_name}").status_code == 200


def make_course(hub, teacher: str) -> str:
    """A new course taught by `teacher`, made by the admin (api/courses); its name."""
    name = f"course-{secrets.token_hex(3)}"
    body = {"name": name, "instructors": [teacher]}
    response = QueueUser(hub, "admin").call("POST", "courses", json=body)
    assert response.status_code == 201, response.text
    return name
