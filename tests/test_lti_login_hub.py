"""LMS login against a real hub in Chromium: a test LMS (tests/lti_platform.py) signs LTI 1.3
launches with its own key and serves its JWKS, and sends signed LTI 1.1 launches. A launch logs
the student in and puts them in their course; an LMS instructor becomes the course's instructor
(the queue service's `GET api/courses` says so); a bad signature, an expired token, a replayed
id_token, a forged role and a group holding hub roles are each refused with a page that says
what to do, leaving no user and no group behind."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
import requests
from playwright.sync_api import Page, expect

from fgpu_spawner.lti_courses import group_name

from .browser import SESSIONS_PAGE, screenshot
from .harness import QueueUser, running_hub
from .lti_platform import (
    CLIENT_ID,
    CONSUMER_KEY,
    CONSUMER_SECRET,
    INSTITUTION_INSTRUCTOR,
    INSTRUCTOR,
    LEARNER,
    Platform,
)

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

#: A group that holds a hub role, and the LMS course an admin mapped to it by mistake.
POWER_GROUP, POWER_CONTEXT = "lti-power", "ctx-power"
#: An existing course an admin made, and the LMS course mapped to it.
MAPPED_GROUP, MAPPED_CONTEXT = "cs101-fall", "ctx-cs101"


def lti_config(platform: Platform) -> str:
    """The site's LMS login lines, as docs/source/howto/logins.md shows them."""
    return f"""
c.JupyterHub.authenticator_class = "fgpu_spawner.lti_login.LTICourseAuthenticator"
c.LTI13Authenticator.issuer = {platform.url!r}
c.LTI13Authenticator.client_id = [{CLIENT_ID!r}]
c.LTI13Authenticator.authorize_url = "{platform.url}/authorize"
c.LTI13Authenticator.jwks_endpoint = "{platform.url}/jwks"
c.LTI13Authenticator.username_key = "sub"
c.LTI11Authenticator.consumers = {{{CONSUMER_KEY!r}: {CONSUMER_SECRET!r}}}
c.LTI11Authenticator.username_key = "user_id"
c.LTICourseAuthenticator.course_groups = {{
    {POWER_CONTEXT!r}: {POWER_GROUP!r}, {MAPPED_CONTEXT!r}: {MAPPED_GROUP!r}}}
c.JupyterHub.load_groups[{POWER_GROUP!r}] = {{"users": []}}
c.JupyterHub.load_roles.append({{"name": "lti-power", "scopes": ["list:users"],
    "groups": [{POWER_GROUP!r}]}})
"""


@pytest.fixture(scope="module")
def lms(tmp_path_factory, docker_engine) -> Iterator[Platform]:
    """The test LMS and the one hub of this module, which trusts it."""
    platform = Platform(hub_url="")
    try:
        with running_hub(tmp_path_factory.mktemp("lti"), lti_config(platform)) as hub:
            platform.hub_url = hub.url
            platform.hub = hub
            yield platform
    finally:
        platform.close()


def fresh(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def launched(page: Page, url: str) -> None:
    page.goto(url)
    page.wait_for_load_state()


def exists(hub, kind: str, name: str) -> bool:
    return hub.request("GET", f"{kind}/{name}").status_code == 200


def members(hub, group: str) -> set[str]:
    response = hub.request("GET", f"groups/{group}")
    assert response.status_code == 200, response.text
    return set(response.json()["users"])


def course_roles(hub, user: str) -> dict[str, str]:
    """The courses `user` sees in the queue service's `GET api/courses`, with their role."""
    response = QueueUser(hub, user).call("GET", "courses")
    assert response.status_code == 200, response.text
    return {course["name"]: course["role"] for course in response.json()["courses"]}


def refused(page: Page, lms: Platform, user: str, context: str, words: str) -> None:
    """The page says the launch was refused, and why; nobody and no group was made."""
    expect(page.locator("h1")).to_contain_text("Launch refused")
    expect(page.locator("body")).to_contain_text(words)
    assert not exists(lms.hub, "users", user)
    assert not exists(lms.hub, "groups", group_name(f"lti-{context}"))


def test_a_student_launch_logs_in_and_joins_the_course(lms, page):
    student, context = fresh("ann"), fresh("ctx")
    # An institution-wide instructor role makes nobody this course's instructor.
    launched(page, lms.launch13_url(student, context, [LEARNER, INSTITUTION_INSTRUCTOR]))
    # Logged in, on the hub's landing page (the queue's Sessions page), under their own name.
    assert page.url.startswith(f"{lms.hub.url}{SESSIONS_PAGE}")
    expect(page.locator("nav")).to_contain_text(student)
    course = f"lti-{context}"
    assert members(lms.hub, course) == {student}
    assert course_roles(lms.hub, student) == {course: "student"}


def test_an_instructor_launch_makes_the_course_instructor(lms, pages):
    teacher, student, context = fresh("tim"), fresh("bob"), fresh("ctx")
    launched(pages(), lms.launch13_url(student, context, [LEARNER]))
    launched(pages(), lms.launch13_url(teacher, context, [INSTRUCTOR]))
    course = f"lti-{context}"
    assert members(lms.hub, course) == {student, teacher}
    assert course_roles(lms.hub, teacher) == {course: "instructor"}
    assert course_roles(lms.hub, student) == {course: "student"}


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("bad-signature", "not signed with your course platform's key"),
        ("expired", "This launch has expired"),
        ("other-client", "a course platform the hub does not know"),
    ],
)
def test_a_launch_the_hub_cannot_trust_is_refused(lms, page, mode, words):
    student, context = fresh("eve"), fresh("ctx")
    launched(page, lms.launch13_url(student, context, [INSTRUCTOR], mode=mode))
    refused(page, lms, student, context, words)
    screenshot(page, f"lti-refused-{mode}")


def test_a_replayed_id_token_is_refused(lms, pages):
    owner, context = fresh("ann"), fresh("ctx")
    launched(pages(), lms.launch13_url(owner, context, [INSTRUCTOR]))
    # Someone holding that launch's id_token posts it again, in a launch of their own.
    thief = pages()
    eve, eve_context = fresh("eve"), fresh("ctx")
    launched(thief, lms.launch13_url(eve, eve_context, [LEARNER], mode="replay"))
    refused(thief, lms, eve, eve_context, "This launch was already used")
    screenshot(thief, "lti-refused-replay")
    # Nothing changed: the owner is still the one member, and no one else got in.
    assert members(lms.hub, f"lti-{context}") == {owner}


def test_a_launch_posted_again_with_its_cookies_is_refused(lms, page):
    """Whoever copies a finished launch whole, its form post and the browser's cookies (a
    shared computer, a proxy's log), cannot post it again: its nonce worked once."""
    callback = f"{lms.hub.url}/hub/lti13/oauth_callback"
    copied = {}

    def copy(route):
        cookies = page.context.cookies(lms.hub.url)
        copied["cookie"] = "; ".join(f"{c['name']}={c['value']}" for c in cookies)
        copied["body"] = route.request.post_data
        route.continue_()

    page.route(callback, copy)
    owner = fresh("ann")
    launched(page, lms.launch13_url(owner, fresh("ctx"), [LEARNER]))
    assert page.url.startswith(f"{lms.hub.url}{SESSIONS_PAGE}")
    again = requests.post(
        callback,
        data=copied["body"],
        headers={
            "Cookie": copied["cookie"],
            "Content-Type": "application/x-www-form-urlencoded",
        },
        allow_redirects=False,
        timeout=60,
    )
    assert again.status_code == 403, again.text
    assert "This launch was already used" in again.text
    assert "jupyterhub-hub-login" not in again.headers.get("Set-Cookie", "")


def test_a_launch_into_a_group_with_hub_roles_is_refused(lms, page):
    teacher = fresh("tim")
    launched(page, lms.launch13_url(teacher, POWER_CONTEXT, [INSTRUCTOR]))
    expect(page.locator("h1")).to_contain_text("Launch refused")
    expect(page.locator("body")).to_contain_text("it holds hub roles")
    assert not exists(lms.hub, "users", teacher)
    assert members(lms.hub, POWER_GROUP) == set()


def test_a_mapped_lms_course_joins_the_existing_course_and_keeps_its_settings(lms, pages):
    hub = lms.hub
    # An admin made the course in the admin panel, which stores what is typed there as text:
    # the launch reads it and keeps it so.
    hub.create_user("prof-kim")
    assert hub.request("POST", f"groups/{MAPPED_GROUP}").status_code == 201
    members_ = {"users": ["prof-kim"]}
    assert hub.request("POST", f"groups/{MAPPED_GROUP}/users", json=members_).ok
    text_quota = '{"fgpu": 2}'
    properties = {"fgpu_course": '{"instructors": ["prof-kim"]}', "fgpu_quota": text_quota}
    assert hub.request("PUT", f"groups/{MAPPED_GROUP}/properties", json=properties).ok
    student, assistant = fresh("ann"), fresh("tim")
    launched(pages(), lms.launch13_url(student, MAPPED_CONTEXT, [LEARNER]))
    launched(pages(), lms.launch13_url(assistant, MAPPED_CONTEXT, [INSTRUCTOR]))
    group = hub.request("GET", f"groups/{MAPPED_GROUP}").json()
    assert set(group["users"]) == {"prof-kim", student, assistant}
    assert group["properties"]["fgpu_course"] == {"instructors": ["prof-kim", assistant]}
    assert group["properties"]["fgpu_quota"] == text_quota
    assert course_roles(hub, student) == {MAPPED_GROUP: "student"}
    assert course_roles(hub, assistant) == {MAPPED_GROUP: "instructor"}
    assert not exists(hub, "groups", f"lti-{MAPPED_CONTEXT}")


def test_lti11_a_signed_launch_logs_in_and_a_forged_one_is_refused(lms, pages):
    teacher, student, context = fresh("tim"), fresh("eve"), fresh("ctx11")
    launched(pages(), lms.launch11_url(teacher, context, "Instructor"))
    course = f"lti-{context}"
    assert course_roles(lms.hub, teacher) == {course: "instructor"}
    forged = pages()
    launched(forged, lms.launch11_url(student, context, "Learner", mode="forged-role"))
    expect(forged.locator("h1")).to_contain_text("Launch refused")
    expect(forged.locator("body")).to_contain_text("not signed with your course platform's key")
    assert not exists(lms.hub, "users", student)
    assert members(lms.hub, course) == {teacher}


def test_the_login_page_sends_students_to_their_course(lms, page):
    page.goto(f"{lms.hub.url}/hub/lti13/oauth_login")
    expect(page.locator("h1")).to_contain_text("Launch refused")
    expect(page.locator("body")).to_contain_text("open the tool from your course page")
