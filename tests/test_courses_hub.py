"""Courses on hub groups (contract 8), against the real hub and service: an admin makes a course,
its roster sets its members (a bad one changes nothing), its instructors see and stop their
students' sessions and nothing outside it, and neither a student, a narrow token nor a
cross-site request can use the new endpoints."""

from __future__ import annotations

import json
import secrets

import pytest
import requests

from .harness import QueueUser, wait_until
from .test_security_handlers import (
    EVIL,
    SESSION,
    Browser,
    narrow_admin_token,
    raw_post,
    service_address,
)

pytestmark = [pytest.mark.docker, pytest.mark.hub]


def fresh(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def members(hub, course: str) -> set[str]:
    response = hub.request("GET", f"groups/{course}")
    assert response.status_code == 200, response.text
    return set(response.json()["users"])


def user_exists(hub, name: str) -> bool:
    return hub.request("GET", f"users/{name}").status_code == 200


def make_course(hub, teacher: str, students=()) -> str:
    """A new course taught by `teacher` with `students`, made by the admin; its name."""
    course = fresh("course")
    admin = QueueUser(hub, "admin")
    response = admin.call("POST", "courses", json={"name": course, "instructors": [teacher]})
    assert response.status_code == 201, response.text
    if students:
        lines = [f"{teacher},instructor", *(f"{s},student" for s in students)]
        assert put_roster(admin, course, "\n".join(lines)).status_code == 200
    return course


def put_roster(user: QueueUser, course: str, text: str, **headers) -> requests.Response:
    headers = {"Content-Type": "text/csv", **headers}
    return user.call("PUT", f"courses/{course}/roster", data=text.encode(), headers=headers)


def start(user: QueueUser) -> str:
    response = user.call("POST", "sessions", json={**SESSION, "count": 1})
    assert response.status_code == 201, response.text
    return response.json()["servers"][0]["session"]["id"]


def end_reason(user: QueueUser, session_id: str) -> str | None:
    response = user.call("GET", "sessions?finished=1")
    assert response.status_code == 200, response.text
    ended = {s["id"]: s["end_reason"] for s in response.json()["sessions"]}
    return ended.get(session_id)


def test_an_admin_makes_a_course_and_its_roster_sets_its_members(hub):
    teacher, ann, bob, new = fresh("tim"), fresh("ann"), fresh("bob"), fresh("new")
    for name in (ann, bob):
        hub.create_user(name)
    course = make_course(hub, teacher)
    assert members(hub, course) == {teacher}  # the instructor was made, and is a member
    admin = QueueUser(hub, "admin")
    roster = f"user,role\n{teacher},instructor\n{ann},student\n{bob},student\n"
    response = put_roster(admin, course, roster)
    assert response.status_code == 200, response.text
    assert response.json()["members"] == 3
    assert members(hub, course) == {teacher, ann, bob}

    # A bad line anywhere: 400 naming it, and nothing changed, no user made.
    bad = f"{teacher},instructor\n{new},student\n{ann},teacher\n"
    response = put_roster(admin, course, bad)
    assert response.status_code == 400, response.text
    assert "line 3" in response.json()["message"]
    assert members(hub, course) == {teacher, ann, bob}
    assert not user_exists(hub, new)
    # So does a roster past the body's cap (the service's one door answers 413).
    # (asked of the service itself: the proxy turns an answer before the whole body into 503).
    huge = f"{teacher},instructor\n{new},student\n".encode() + b"#" * 300_000
    token = admin.http.headers["Authorization"]
    head = f"Authorization: {token}\r\nContent-Length: {len(huge)}\r\nContent-Type: text/csv\r\n"
    path = f"/services/queue/api/courses/{course}/roster"
    status, answer = raw_post(*service_address(hub), path, head, [huge], method="PUT")
    assert status == 413, answer
    assert members(hub, course) == {teacher, ann, bob}
    assert not user_exists(hub, new)

    # An admin gives the group a quota in the panel (as text); a roster keeps it.
    allowance = {"fgpu": 2, "sessions": 4}
    quota = {"fgpu_quota": json.dumps(allowance), "fgpu_course": {"instructors": [teacher]}}
    assert hub.request("PUT", f"groups/{course}/properties", json=quota).status_code == 200

    # The next roster drops bob (his account stays) and makes a new user.
    response = put_roster(QueueUser(hub, teacher), course, f"{teacher},instructor\n{new},student")
    assert response.status_code == 200, response.text
    assert members(hub, course) == {teacher, new}
    assert user_exists(hub, bob) and user_exists(hub, new)

    # Each sees the course with their role; the group's quota is its allowance.
    for name, role in ((teacher, "instructor"), (new, "student")):
        listed = {
            c["name"]: c for c in QueueUser(hub, name).call("GET", "courses").json()["courses"]
        }
        assert listed[course]["role"] == role
        assert listed[course]["allowance"] == allowance
    assert course not in {
        c["name"] for c in QueueUser(hub, bob).call("GET", "courses").json()["courses"]
    }
    assert course in {c["name"] for c in admin.call("GET", "courses").json()["courses"]}


def test_adopting_a_group_keeps_its_properties_and_refuses_a_group_with_roles(hub):
    teacher, group = fresh("tim"), hub.join_group("admin", {"fgpu_quota": '{"fgpu": 3}'})
    admin = QueueUser(hub, "admin")
    response = admin.call("POST", "courses", json={"name": group, "instructors": [teacher]})
    assert response.status_code == 200, response.text  # adopted, not created
    assert response.json()["allowance"] == {"fgpu": 3}
    properties = hub.request("GET", f"groups/{group}").json()["properties"]
    assert properties["fgpu_quota"] == '{"fgpu": 3}'  # the admin panel's text stays text
    assert properties["fgpu_course"] == {"instructors": [teacher]}
    # The instructors group holds the catalog role: a roster would hand it out.
    before = members(hub, "instructors")
    response = admin.call("POST", "courses", json={"name": "instructors", "instructors": [teacher]})
    assert response.status_code == 409, response.text
    assert "roles" in response.json()["message"]
    assert members(hub, "instructors") == before


def test_an_instructor_sees_and_stops_only_their_own_courses_sessions(hub):
    ta, sa, tb, sb = fresh("ta"), fresh("sa"), fresh("tb"), fresh("sb")
    course_a = make_course(hub, ta, [sa])
    course_b = make_course(hub, tb, [sb])
    student_a, student_b, teacher_a = QueueUser(hub, sa), QueueUser(hub, sb), QueueUser(hub, ta)
    session_a, session_b = start(student_a), start(student_b)

    response = teacher_a.call("GET", f"courses/{course_a}/sessions")
    assert response.status_code == 200, response.text
    assert {s["id"] for s in response.json()["sessions"]} == {session_a}
    assert teacher_a.call("GET", f"courses/{course_b}/sessions").status_code == 404
    response = QueueUser(hub, "admin").call("GET", f"courses/{course_b}/sessions")
    assert {s["id"] for s in response.json()["sessions"]} == {session_b}
    # Another course's student: as if there were no such session.
    assert teacher_a.call("DELETE", f"sessions/{session_b}").status_code == 404
    assert session_b in {s["id"] for s in student_b.sessions()}
    response = teacher_a.call("DELETE", f"sessions/{session_a}")
    assert response.status_code == 200, response.text
    student_a.wait_for(lambda sessions: session_a not in {s["id"] for s in sessions})
    ended = wait_until(lambda: end_reason(student_a, session_a), 60, "the stop's end reason")
    assert ended == "instructor"

    # A student of the course may not look at it or change it.
    response = student_a.call("GET", f"courses/{course_a}/sessions")
    assert response.status_code == 403, response.text
    response = put_roster(student_a, course_a, f"{sa},instructor\n")
    assert response.status_code == 403, response.text
    assert members(hub, course_a) == {ta, sa}
    assert student_b.call("GET", f"courses/{course_a}/sessions").status_code == 404
    # A hub admin on the roster stays out of the instructor's reach.
    roster = f"{ta},instructor\n{sa},student\nadmin,student\n"
    assert put_roster(teacher_a, course_a, roster).status_code == 200
    admins_session = start(QueueUser(hub, "admin"))
    assert teacher_a.call("DELETE", f"sessions/{admins_session}").status_code == 404
    # A student who leaves the roster is out of the instructor's reach.
    assert put_roster(QueueUser(hub, tb), course_b, f"{tb},instructor\n").status_code == 200
    assert QueueUser(hub, tb).call("DELETE", f"sessions/{session_b}").status_code == 404
    student_b.end_all()
    assert QueueUser(hub, "admin").call("DELETE", f"sessions/{admins_session}").status_code == 200


def test_only_admins_make_courses(hub):
    teacher = fresh("tim")
    course = make_course(hub, teacher)
    for caller in (QueueUser(hub, teacher), QueueUser(hub, fresh("eve"))):
        response = caller.call(
            "POST", "courses", json={"name": fresh("c"), "instructors": [caller.name]}
        )
        assert response.status_code == 403, response.text
        response = caller.call(
            "POST", "courses", json={"name": course, "instructors": [caller.name]}
        )
        assert response.status_code == 403, response.text
    assert members(hub, course) == {teacher}


def test_a_narrow_token_cannot_use_the_course_endpoints(hub):
    teacher, eve = fresh("tim"), fresh("eve")
    course = make_course(hub, teacher)
    api = f"{hub.url}/services/queue/api"
    narrow = narrow_admin_token(hub, ["access:services!service=queue"])
    response = narrow.post(
        f"{api}/courses", json={"name": fresh("c"), "instructors": [eve]}, timeout=60
    )
    assert response.status_code == 403, response.text
    assert course not in {
        c["name"] for c in narrow.get(f"{api}/courses", timeout=60).json()["courses"]
    }
    csv = {"Content-Type": "text/csv"}
    roster = f"{eve},instructor\n".encode()
    response = narrow.put(f"{api}/courses/{course}/roster", data=roster, headers=csv, timeout=60)
    assert response.status_code == 404, response.text
    assert narrow.get(f"{api}/courses/{course}/sessions", timeout=60).status_code == 404
    # A token the service may not be used with at all.
    token = hub.request(
        "POST", f"users/{teacher}/tokens", json={"scopes": ["read:users:name!user"]}
    )
    assert token.status_code == 201, token.text
    other = requests.Session()
    other.headers["Authorization"] = f"token {token.json()['token']}"
    assert (
        other.put(
            f"{api}/courses/{course}/roster", data=roster, headers=csv, timeout=60
        ).status_code
        == 403
    )
    assert other.get(f"{api}/courses/{course}/sessions", timeout=60).status_code == 403
    assert members(hub, course) == {teacher}
    assert not user_exists(hub, eve)


def test_a_cross_site_request_cannot_change_a_roster_or_make_a_course(hub):
    teacher, eve = fresh("tim"), fresh("eve")
    course = make_course(hub, teacher)
    browser = Browser(hub, teacher)
    roster = f"{teacher},instructor\n{eve},student\n"
    for kind in ("text/csv", "text/plain"):
        headers = {**EVIL, "Content-Type": kind}
        response = browser.call("PUT", f"courses/{course}/roster", headers=headers, data=roster)
        assert response.status_code == 403, response.text
    admin = Browser(hub, "admin")
    body = {"name": fresh("c"), "instructors": [eve]}
    assert admin.call("POST", "courses", headers=EVIL, json=body).status_code == 403
    assert members(hub, course) == {teacher}
    assert not user_exists(hub, eve)
    # The service's own pages may (same origin, with the XSRF token); a form's type may not.
    own_page = {
        "X-XSRFToken": browser.xsrf,
        "Sec-Fetch-Site": "same-origin",
        "Sec-Fetch-Mode": "cors",
        "Content-Type": "text/csv",
    }
    response = browser.call("PUT", f"courses/{course}/roster", headers=own_page, data=roster)
    assert response.status_code == 200, response.text
    assert members(hub, course) == {teacher, eve}
    response = put_roster(QueueUser(hub, teacher), course, roster, **{"Content-Type": "text/plain"})
    assert response.status_code == 415, response.text


def test_a_new_account_under_a_deleted_instructors_name_does_not_run_the_course(hub):
    teacher, ann = fresh("tim"), fresh("ann")
    course = make_course(hub, teacher, [ann])
    assert QueueUser(hub, teacher).call("GET", f"courses/{course}/sessions").status_code == 200
    assert hub.request("DELETE", f"users/{teacher}").status_code == 204
    newcomer = QueueUser(hub, teacher)  # the same name, another account
    assert newcomer.call("GET", f"courses/{course}/sessions").status_code == 404
    assert put_roster(newcomer, course, f"{teacher},instructor\n").status_code == 404
    assert members(hub, course) == {ann}


def shared_with(hub, user: str) -> set[str]:
    response = hub.request("GET", f"users/{user}/shared")
    assert response.status_code == 200, response.text
    servers = (share["server"] for share in response.json()["items"])
    return {f"{server['user']['name']}/{server['name']}" for server in servers}


def test_a_course_reads_back_with_its_roster_and_budgets_for_its_instructors_only(hub):
    teacher, ann, eve = fresh("tim"), fresh("ann"), fresh("eve")
    course = make_course(hub, teacher, [ann])
    properties = {
        "fgpu_quota": {"fgpu": 4, "fgpu_hours_per_week": 20},
        "fgpu_course": {"instructors": [teacher]},
    }
    assert hub.request("PUT", f"groups/{course}/properties", json=properties).status_code == 200
    response = QueueUser(hub, teacher).call("GET", f"courses/{course}")
    assert response.status_code == 200, response.text
    detail = response.json()
    assert detail["roster"] == [
        {"name": teacher, "role": "instructor", "display_name": None},
        {"name": ann, "role": "student", "display_name": None},
    ]
    # A roster with display names: the page shows them; the next roster's replace them.
    roster = f"user,name,role\n{teacher},Tim Berners,instructor\n{ann},,student\n"
    assert put_roster(QueueUser(hub, teacher), course, roster).status_code == 200
    listed = QueueUser(hub, teacher).call("GET", f"courses/{course}").json()["roster"]
    assert [m["display_name"] for m in listed] == ["Tim Berners", None]
    assert [(b["figure"], b["period"], b["limit"]) for b in detail["budgets"]] == [
        ("fgpu_hours", "week", 20)
    ]
    assert QueueUser(hub, ann).call("GET", f"courses/{course}").status_code == 403
    assert QueueUser(hub, eve).call("GET", f"courses/{course}").status_code == 404
    assert QueueUser(hub, "admin").call("GET", f"courses/{course}").status_code == 200
    # Its instructors read its members' usage, nobody else's; a student only their own.
    response = QueueUser(hub, teacher).call("GET", f"usage?group={course}")
    assert response.status_code == 200, response.text
    assert {row["user"] for row in response.json()["usage"]} <= {teacher, ann}
    response = QueueUser(hub, teacher).call("GET", f"usage?group={course}&user={eve}")
    assert response.json()["usage"] == []
    assert (
        QueueUser(hub, ann).call("GET", f"usage?group={course}&user={teacher}").status_code == 403
    )


def test_a_message_reaches_the_members_banner_escaped_and_only_instructors_post_it(hub):
    teacher, ann, eve = fresh("tim"), fresh("ann"), fresh("eve")
    course = make_course(hub, teacher, [ann])
    hub.create_user(eve)
    text = "Lab 3 is out <script>alert(1)</script>"
    response = QueueUser(hub, teacher).call(
        "POST", f"courses/{course}/message", json={"text": text}
    )
    assert response.status_code == 200, response.text
    assert response.json()["message"]["by"] == teacher
    # The hub's own page and the service's show it to members, as text, never as markup.
    student = Browser(hub, ann)
    for path in ("/hub/home", "/services/queue/usage"):
        page = student.http.get(hub.url + path, timeout=60).text
        assert "Lab 3 is out &lt;script&gt;alert(1)&lt;/script&gt;" in page, path
        assert "<script>alert(1)" not in page
    assert "Lab 3 is out" not in Browser(hub, eve).http.get(hub.url + "/hub/home", timeout=60).text
    # A student, a stranger, a narrow token and a cross-site request may not post.
    body = {"text": "no class today"}
    assert (
        QueueUser(hub, ann).call("POST", f"courses/{course}/message", json=body).status_code == 403
    )
    assert (
        QueueUser(hub, eve).call("POST", f"courses/{course}/message", json=body).status_code == 404
    )
    narrow = narrow_admin_token(hub, ["access:services!service=queue"])
    api = f"{hub.url}/services/queue/api"
    assert narrow.post(f"{api}/courses/{course}/message", json=body, timeout=60).status_code == 404
    response = Browser(hub, teacher).call(
        "POST", f"courses/{course}/message", headers=EVIL, json=body
    )
    assert response.status_code == 403, response.text
    # Too long, or not text: 400, the message unchanged.
    for bad in ({"text": "x" * 501}, {"text": 5}):
        response = QueueUser(hub, teacher).call("POST", f"courses/{course}/message", json=bad)
        assert response.status_code == 400, response.text
    listed = QueueUser(hub, ann).call("GET", "courses").json()["courses"]
    assert [c["message"]["text"] for c in listed if c["name"] == course] == [text]
    # An empty text takes it down.
    response = QueueUser(hub, teacher).call("POST", f"courses/{course}/message", json={"text": ""})
    assert response.status_code == 200 and response.json()["message"] is None
    assert "Lab 3 is out" not in student.http.get(hub.url + "/hub/home", timeout=60).text


def test_an_instructor_opens_a_students_session_until_it_ends_and_no_one_else_can(hub):
    teacher, ann, tb, sb = fresh("tim"), fresh("ann"), fresh("tb"), fresh("sb")
    course = make_course(hub, teacher, [ann])
    other = make_course(hub, tb, [sb])
    student = QueueUser(hub, ann)
    session = start(student)
    student.wait_for(lambda s: [x["status"] for x in s] == ["RUNNING"], timeout=120)
    (record,) = student.sessions()
    path = f"courses/{course}/sessions/{session}/open"
    # Not its student, not another course's instructor, not through another course.
    assert student.call("POST", path).status_code == 403
    assert QueueUser(hub, tb).call("POST", path).status_code == 404
    assert (
        QueueUser(hub, tb).call("POST", f"courses/{other}/sessions/{session}/open").status_code
        == 404
    )
    response = Browser(hub, teacher).call("POST", path, headers=EVIL)
    assert response.status_code == 403, response.text
    assert shared_with(hub, teacher) == set()

    response = QueueUser(hub, teacher).call("POST", path)
    assert response.status_code == 200, response.text
    server = f"{ann}/{record['server_name']}"
    assert response.json()["url"] == f"/user/{server}/"
    assert shared_with(hub, teacher) == {server}
    # The share is the hub's: the instructor's own token now opens that server, and no other.
    visitor = QueueUser(hub, teacher).http
    assert visitor.get(f"{hub.url}/user/{server}/api/status", timeout=60).status_code == 200
    # The session ends: the visit ends with it.
    assert QueueUser(hub, teacher).call("DELETE", f"sessions/{session}").status_code == 200
    wait_until(lambda: shared_with(hub, teacher) == set(), 90, "the visit's share revoked")


def test_a_visit_of_a_default_server_ends_when_the_student_leaves_the_course(hub):
    teacher, ann = fresh("tim"), fresh("ann")
    course = make_course(hub, teacher, [ann])
    assert hub.start_server(ann, {}).status_code in (201, 202)
    hub.wait_ready(ann, "")
    student = QueueUser(hub, ann)
    (record,) = student.wait_for(lambda s: [x["status"] for x in s] == ["RUNNING"], timeout=120)
    path = f"courses/{course}/sessions/{record['id']}/open"
    response = QueueUser(hub, teacher).call("POST", path)
    assert response.status_code == 200, response.text
    assert response.json()["url"] == f"/user/{ann}/"
    assert shared_with(hub, teacher) == {f"{ann}/"}
    assert put_roster(QueueUser(hub, teacher), course, f"{teacher},instructor\n").status_code == 200
    wait_until(lambda: shared_with(hub, teacher) == set(), 90, "the visit's share revoked")
    assert record["id"] in {s["id"] for s in student.sessions()}  # their session goes on
    student.end_all()
