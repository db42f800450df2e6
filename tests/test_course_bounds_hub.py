"""A course's bounds, allowance, presets and folder, against the real hub and service: an admin
sets the bounds, an instructor changes the allowance and presets within them (what is beyond is
refused and changes nothing, and a session request meets what was set), and the course's folder
is read-only for its students, read-write for its instructors, mounted when they choose so, and
gone for someone dropped from the roster, whose own work stays theirs. Neither a student, an
instructor of another course, a narrow token nor a cross-site request may change a course."""

from __future__ import annotations

import json

import pytest

from .harness import QueueUser, containers_with
from .job_helpers import job_ended, training_notebook
from .test_courses_hub import fresh, make_course, put_roster
from .test_security_handlers import EVIL, SESSION, Browser, narrow_admin_token

pytestmark = [pytest.mark.docker, pytest.mark.hub]

OCTETS = {"Content-Type": "application/octet-stream"}
BOUNDS = {"cpu": 4, "fgpu": 8, "mem": "8G", "sessions": 3}


def properties(hub, course: str) -> dict:
    response = hub.request("GET", f"groups/{course}")
    assert response.status_code == 200, response.text
    return response.json()["properties"]


def listed(user: QueueUser, course: str) -> dict:
    response = user.call("GET", "courses")
    assert response.status_code == 200, response.text
    return {c["name"]: c for c in response.json()["courses"]}[course]


def bounded_course(hub, teacher: str, students=()) -> str:
    course = make_course(hub, teacher, students)
    admin = QueueUser(hub, "admin")
    response = admin.call("PATCH", f"courses/{course}", json={"bounds": BOUNDS})
    assert response.status_code == 200, response.text
    return course


def patch(user: QueueUser, course: str, body: dict):
    return user.call("PATCH", f"courses/{course}", json=body)


def test_an_instructor_changes_the_allowance_within_the_bounds_and_a_session_meets_it(hub):
    teacher, ann = fresh("tim"), fresh("ann")
    course = bounded_course(hub, teacher, [ann])
    instructor, student = QueueUser(hub, teacher), QueueUser(hub, ann)
    # Setting the bounds lowered the course's (unlimited) allowance to them.
    assert listed(student, course)["bounds"] == BOUNDS
    assert listed(student, course)["allowance"] == BOUNDS

    response = patch(instructor, course, {"allowance": {"cpu": 0.25, "sessions": 2}})
    assert response.status_code == 200, response.text
    assert response.json()["allowance"] == {**BOUNDS, "cpu": 0.25, "sessions": 2}
    assert properties(hub, course)["fgpu_quota"]["cpu"] == 0.25
    # The service reads what was written: a session above the course's 0.25 cores is refused.
    refused = student.call("POST", "sessions", json={**SESSION, "count": 1})
    assert refused.status_code == 403, refused.text
    assert course in refused.json()["message"]

    presets = [{"name": "small", "cpu": 0.5, "mem": "256M", "fgpu": 0}]
    response = patch(instructor, course, {"allowance": {"cpu": 1}, "presets": presets})
    assert response.status_code == 200, response.text
    assert response.json()["presets"] == presets
    offered = {p["name"]: p for p in student.call("GET", "presets").json()["presets"]}
    assert offered["small"]["available"] is True
    started = student.call("POST", "sessions", json={"preset": "small", "count": 1})
    assert started.status_code == 201, started.text


def test_a_per_member_allowance_holds_each_student_on_their_own(hub):
    teacher, ann = fresh("tim"), fresh("ann")
    course = make_course(hub, teacher, [ann])
    admin, instructor = QueueUser(hub, "admin"), QueueUser(hub, teacher)
    bounds = {"per_member": {"cpu": 2, "sessions": 2}}
    assert admin.call("PATCH", f"courses/{course}", json={"bounds": bounds}).status_code == 200
    response = patch(instructor, course, {"allowance": {"per_member": {"cpu": 4, "sessions": 1}}})
    assert response.status_code == 400, response.text
    assert "per_member: cpu: at most 2 cores for each member" in response.json()["message"]
    change = {"allowance": {"per_member": {"cpu": 0.25, "sessions": 1}}}
    response = patch(instructor, course, change)
    assert response.status_code == 200, response.text
    # Each student's own quota now: one session of 0.25 cores, whatever the others hold.
    refused = QueueUser(hub, ann).call("POST", "sessions", json={**SESSION, "count": 1})
    assert refused.status_code == 403, refused.text
    assert "your quota" in refused.json()["message"], refused.text


@pytest.mark.parametrize(
    "body, words",
    [
        ({"allowance": {"fgpu": 9}}, "at most 8 fGPU for the course"),
        ({"allowance": {"mem": None}}, "at most 8 GiB"),
        ({"allowance": {"sessions": 1, "cpu": 5}}, "at most 4 cores"),
        ({"presets": [{"name": "big", "cpu": 1, "mem": "16G"}]}, "Preset big: mem: at most 8"),
        ({"allowance": {"cpu": "lots"}}, "'lots' is not an amount"),
    ],
)
def test_beyond_the_bounds_is_a_400_naming_the_bound_and_changes_nothing(hub, body, words):
    teacher = fresh("tim")
    course = bounded_course(hub, teacher)
    before = properties(hub, course)
    response = patch(QueueUser(hub, teacher), course, body)
    assert response.status_code == 400, response.text
    assert words in response.json()["message"]
    assert properties(hub, course) == before


def test_instructors_change_nothing_without_bounds_and_never_the_bounds(hub):
    teacher = fresh("tim")
    course = make_course(hub, teacher)
    instructor = QueueUser(hub, teacher)
    before = properties(hub, course)
    response = patch(instructor, course, {"allowance": {"fgpu": 1}})
    assert response.status_code == 403, response.text
    assert "An admin must set this course's bounds" in response.json()["message"]
    response = patch(instructor, course, {"bounds": {"fgpu": 100}})
    assert response.status_code == 403, response.text
    assert "Only an admin sets a course's bounds" in response.json()["message"]
    response = patch(instructor, course, {"instructors": [teacher, fresh("eve")]})
    assert response.status_code == 400, response.text
    assert "roster" in response.json()["message"]
    assert properties(hub, course) == before
    # With bounds, a key they do not name stays the admin's.
    QueueUser(hub, "admin").call("PATCH", f"courses/{course}", json={"bounds": {"fgpu": 2}})
    response = patch(instructor, course, {"allowance": {"cpu": 1}})
    assert response.status_code == 403, response.text
    assert "only an admin may change it" in response.json()["message"]


def test_nobody_outside_a_courses_instructors_changes_it(hub):
    ta, sa, tb, sb = fresh("ta"), fresh("sa"), fresh("tb"), fresh("sb")
    course = bounded_course(hub, ta, [sa])
    make_course(hub, tb, [sb])
    before = properties(hub, course)
    change = {"allowance": {"fgpu": 1}}
    # Its student: 403; an instructor or a student of another course: 404, as for no course.
    assert patch(QueueUser(hub, sa), course, change).status_code == 403
    assert patch(QueueUser(hub, sa), course, {"automount": True}).status_code == 403
    for stranger in (tb, sb):
        assert patch(QueueUser(hub, stranger), course, change).status_code == 404
    # An admin's narrow token: no admin powers, and no course of its own.
    narrow = narrow_admin_token(hub, ["access:services!service=queue"])
    api = f"{hub.url}/services/queue/api"
    bounds = {"bounds": {"fgpu": 100}}
    assert narrow.patch(f"{api}/courses/{course}", json=bounds, timeout=60).status_code == 404
    response = narrow.post(
        f"{api}/courses", json={"name": fresh("c"), "instructors": [sa], **bounds}, timeout=60
    )
    assert response.status_code == 403
    # A cross-site request with the instructor's (or an admin's) cookie.
    for name in (ta, "admin"):
        response = Browser(hub, name).call(
            "PATCH", f"courses/{course}", headers=EVIL, json={**change, **bounds}
        )
        assert response.status_code == 403, response.text
    assert properties(hub, course) == before


def test_an_admin_makes_a_course_with_its_bounds_and_a_bad_one_makes_nothing(hub):
    teacher, admin = fresh("tim"), QueueUser(hub, "admin")
    name = fresh("course")
    bad = {"name": name, "instructors": [teacher], "bounds": {"gpus": 8}}
    response = admin.call("POST", "courses", json=bad)
    assert response.status_code == 400, response.text
    assert "gpus" in response.json()["message"]
    assert hub.request("GET", f"groups/{name}").status_code == 404
    good = {**bad, "bounds": {"fgpu": 8, "sessions": 3}}
    response = admin.call("POST", "courses", json=good)
    assert response.status_code == 201, response.text
    assert response.json()["bounds"] == {"fgpu": 8, "sessions": 3}
    assert response.json()["allowance"] == {"fgpu": 8, "sessions": 3}


def folder_of(user: QueueUser, course: str) -> dict:
    folder_id = listed(user, course)["folder"]["id"]
    response = user.call("GET", f"folders/{folder_id}")
    assert response.status_code == 200, response.text
    return response.json()


def put_file(user: QueueUser, folder_id: str, path: str, data: bytes):
    return user.call("PUT", f"folders/{folder_id}/files/{path}", data=data, headers=OCTETS)


def test_the_course_folder_follows_the_roster(hub):
    ta, tb, ann = fresh("ta"), fresh("tb"), fresh("ann")
    course = make_course(hub, ta, [ann])
    first, second, student = QueueUser(hub, ta), QueueUser(hub, tb), QueueUser(hub, ann)
    folder = folder_of(student, course)
    assert (folder["name"], folder["owner"], folder["permission"]) == (
        course,
        f"course:{course}",
        "ro",
    )
    assert folder_of(first, course)["permission"] == "rw"
    assert put_file(first, folder["id"], "lab1.ipynb", b"{}").status_code == 201
    assert student.call("GET", f"folders/{folder['id']}/files/lab1.ipynb").content == b"{}"
    refused = put_file(student, folder["id"], "mine.txt", b"x")
    assert refused.status_code == 403 and "read-only" in refused.json()["message"]
    own = student.call("POST", "folders", json={"name": "my work"}).json()
    assert put_file(student, own["id"], "a.txt", b"mine").status_code == 201

    # A new instructor gains the folder read-write; the first, dropped, loses it; so does ann.
    roster = f"{tb},instructor\n"
    assert put_roster(second, course, roster).status_code == 404  # not theirs yet
    assert put_roster(first, course, f"{ta},instructor\n{tb},instructor\n").status_code == 200
    assert put_file(second, folder["id"], "lab2.ipynb", b"{}").status_code == 201
    assert put_roster(second, course, roster).status_code == 200
    for gone in (first, student):
        assert gone.call("GET", f"folders/{folder['id']}").status_code == 404
        assert gone.call("GET", f"folders/{folder['id']}/files/").status_code == 404
        assert put_file(gone, folder["id"], "x", b"x").status_code == 404
    # The folder outlived its first instructor, and ann's own work stays hers.
    entries = second.call("GET", f"folders/{folder['id']}/files/").json()["entries"]
    assert sorted(e["name"] for e in entries) == ["lab1.ipynb", "lab2.ipynb"]
    assert student.call("GET", f"folders/{own['id']}/files/a.txt").content == b"mine"
    assert put_file(student, own["id"], "b.txt", b"more").status_code == 201


def test_an_automounted_course_folder_is_in_every_students_session_read_only(hub):
    teacher, ann = fresh("tim"), fresh("ann")
    course = make_course(hub, teacher, [ann])
    instructor = QueueUser(hub, teacher)
    folder = folder_of(instructor, course)
    assert put_file(instructor, folder["id"], "lab1.ipynb", b'{"cells": []}').status_code == 201
    student = QueueUser(hub, ann)
    assert patch(student, course, {"automount": True}).status_code == 403
    response = patch(instructor, course, {"automount": True})
    assert response.status_code == 200, response.text
    assert response.json()["folder"] == {"id": folder["id"], "automount": True}
    started = hub.start_server(ann, {"image": "python-3.11", "cpu": 0.5, "mem": "512M"})
    assert started.status_code in (201, 202), started.text
    try:
        hub.wait_ready(ann)
        (container,) = containers_with({"fgpu.user": ann})
        mounts = {m["Destination"]: m for m in container.attrs["Mounts"]}
        mount = mounts[f"/home/jovyan/folders/{course}"]
        assert folder["id"] in mount["Source"] and mount["RW"] is False
        read = container.exec_run(["cat", f"/home/jovyan/folders/{course}/lab1.ipynb"])
        assert read.output == b'{"cells": []}'
        (record,) = student.sessions()
        assert [(m["path"], m["read_only"]) for m in record["mounts"]] == [
            (f"folders/{course}", True)
        ]
    finally:
        hub.stop_server(ann)


def test_a_students_job_runs_a_notebook_from_the_automounted_course_folder(hub):
    teacher, ann = fresh("tim"), fresh("ann")
    course = make_course(hub, teacher, [ann])
    instructor, student = QueueUser(hub, teacher), QueueUser(hub, ann)
    folder = folder_of(instructor, course)
    notebook = json.dumps(training_notebook()).encode()
    assert put_file(instructor, folder["id"], "train.ipynb", notebook).status_code == 201
    assert patch(instructor, course, {"automount": True}).status_code == 200
    # Not chosen at launch: the launch's notebook check sees the folder the job will mount.
    job = {
        **SESSION,
        "count": 1,
        "type": "batch",
        "notebook": f"folders/{course}/train.ipynb",
        "output": "runs",  # the course folder is read-only for its students
    }
    response = student.call("POST", "sessions", json=job)
    assert response.status_code == 201, response.text
    (server,) = response.json()["servers"]
    done = job_ended(student, server["session"]["id"], timeout=180)
    assert done["end_reason"] == "finished", done["reason"]
