"""The Course page (queue_service/handlers/pages.py, static/courses.js), walked in Chromium by an
instructor who is no hub admin: the roster goes in as a CSV file, the students' sessions show up
with their PENDING reasons, one is stopped, one is opened, a message reaches a student's hub
page. Students see their courses and each course's allowance, and not the course's own page."""

from __future__ import annotations

import re
import secrets

import pytest
from playwright.sync_api import Page, expect

from .browser import SPAWN_TIMEOUT_MS, end_with_confirmation, log_in, screenshot
from .harness import QueueUser
from .test_courses_hub import SESSION, make_course, shared_with

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]


def fresh(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def course_page(page: Page, hub, course: str) -> None:
    page.goto(f"{hub.url}/services/queue/courses/{course}")
    expect(page.locator("#fgpu-roster[data-ready]")).to_be_attached()


def member_row(page: Page, name: str):
    return page.locator(f'#fgpu-roster tr[data-member="{name}"]')


def test_an_instructor_runs_a_course_from_its_page(hub, pages, tmp_path):
    """The whole course, by an instructor who is no hub admin: roster in, students' sessions
    seen (a waiting one with its reason), one opened, the allowance raised within the admin's
    bounds (the waiting one starts), one stopped, a material link made, a message posted."""
    teacher, ann, bob = fresh("tim"), fresh("ann"), fresh("bob")
    course = make_course(hub, teacher)
    admin = QueueUser(hub, "admin")
    bounds = {"bounds": {"sessions": 4}, "allowance": {"sessions": 2}}
    assert admin.call("PATCH", f"courses/{course}", json=bounds).status_code == 200
    page = pages()
    log_in(page, hub, teacher)

    # The Courses page lists the course; its page is one click away.
    page.click("#fgpu-nav-courses")
    row = page.locator(f'#fgpu-courses tr[data-course="{course}"]')
    expect(row).to_contain_text("instructor")
    expect(row).to_contain_text("2 sessions")
    row.get_by_role("link", name="Course page").click()
    expect(page.locator("#fgpu-roster[data-ready]")).to_be_attached()

    # The roster goes in as a file.
    roster = tmp_path / "roster.csv"
    roster.write_text(
        f"user,name,role\n{teacher},Tim Berners,instructor\n{ann},Ann Lee,student\n{bob},,student\n"
    )
    page.set_input_files("#fgpu-roster-file", str(roster))
    page.click("#fgpu-roster-upload")
    expect(page.locator("#fgpu-done")).to_contain_text("3 members")
    expect(member_row(page, ann)).to_contain_text("Ann Lee")

    # The students' sessions show up: ann's running, bob's second one waiting on the course's
    # allowance of two sessions, with its reason.
    for student in (ann, bob):
        started = QueueUser(hub, student).call("POST", "sessions", json={**SESSION, "count": 1})
        assert started.status_code == 201, started.text
    QueueUser(hub, ann).wait_for(lambda s: [x["status"] for x in s] == ["RUNNING"], 150)
    waiting = QueueUser(hub, bob).call("POST", "sessions", json={**SESSION, "count": 1})
    assert waiting.status_code == 201, waiting.text
    expect(member_row(page, ann)).to_contain_text("RUNNING", timeout=SPAWN_TIMEOUT_MS)
    expect(member_row(page, bob)).to_contain_text("PENDING")
    expect(member_row(page, bob).locator(".fgpu-pending-detail")).to_contain_text("2 sessions")
    screenshot(page, "course-page")
    page.set_viewport_size({"width": 800, "height": 900})
    screenshot(page, "course-page-800")
    page.set_viewport_size({"width": 1400, "height": 950})

    # Open: ann's session in a new tab, as the instructor, through the hub's share.
    with page.context.expect_page() as opened:
        member_row(page, ann).get_by_role("button", name="Open").click()
    visit = opened.value
    # The hub asks the visitor once, as for any server shared with them, naming whose it is.
    expect(visit.locator("h1")).to_have_text("Authorize access")
    expect(visit.locator("body")).to_contain_text(ann)
    screenshot(visit, "course-open-authorize")
    visit.get_by_role("button", name="Authorize").click()
    visit.wait_for_url(f"**/user/{ann}/**", timeout=SPAWN_TIMEOUT_MS)
    expect(visit.locator("#jp-main-dock-panel")).to_be_visible(timeout=SPAWN_TIMEOUT_MS)
    assert any(name.startswith(f"{ann}/") for name in shared_with(hub, teacher))
    visit.close()

    # The allowance, within the admin's bounds: beyond them refused, within them saved, and
    # bob's waiting session starts.
    sessions = page.locator("#fgpu-allowance-course-sessions")
    expect(page.locator("#fgpu-course-bounds")).to_contain_text("An admin set the bounds")
    sessions.fill("5")
    page.click("#fgpu-allowance-save")
    expect(page.locator("#fgpu-error")).to_contain_text("at most 4")
    assert admin.call("GET", f"courses/{course}").json()["allowance"] == {"sessions": 2}
    sessions.fill("3")
    page.click("#fgpu-allowance-save")
    expect(page.locator("#fgpu-done")).to_contain_text("The allowance is saved")
    expect(member_row(page, bob).locator(".fgpu-status-PENDING")).to_have_count(
        0, timeout=SPAWN_TIMEOUT_MS
    )
    screenshot(page, "course-allowance")

    # Stop one of bob's sessions, with the page's question first.
    running = member_row(page, bob).locator("li", has_text="RUNNING").first
    end_with_confirmation(page, running.get_by_role("button", name="Stop"))
    expect(member_row(page, bob).locator("li", has_text="RUNNING")).to_have_count(1)

    # Material by one link: the service's signed link for the repository and file.
    page.fill("#fgpu-link-repo", "https://git.example.edu/cs101/labs.git")
    page.fill("#fgpu-link-path", "lab1/start.ipynb")
    page.click("#fgpu-link-make")
    link = page.locator("#fgpu-link-output")
    expect(link).to_have_value(re.compile(rf"/services/queue/courses/{course}/open\?.*sig="))
    screenshot(page, "course-link")

    # A message: every member sees it on top of the hub's pages.
    page.fill("#fgpu-message-text", "Lab 3 is out: <b>read</b> the README first.")
    page.click("#fgpu-message-post")
    expect(page.locator("#fgpu-done")).to_contain_text("Posted")
    student = pages()
    log_in(student, hub, ann)
    student.goto(f"{hub.url}/hub/home")
    banner = student.locator(".announcement")
    expect(banner).to_contain_text(f"{course} · {teacher}: Lab 3 is out: <b>read</b> the README")
    screenshot(student, "course-message-banner")

    # The student's Courses page: the course and its allowance; its own page is not theirs.
    student.goto(f"{hub.url}/services/queue/courses")
    listed = student.locator(f'#fgpu-courses tr[data-course="{course}"]')
    expect(listed).to_contain_text("student")
    expect(listed).to_contain_text("3 sessions")
    screenshot(student, "courses-student")
    answer = student.goto(f"{hub.url}/services/queue/courses/{course}")
    assert answer.status == 403
    expect(student.locator("body")).to_contain_text("Only the course's instructors and admins")
    stranger = pages()
    log_in(stranger, hub, fresh("eve"))
    assert stranger.goto(f"{hub.url}/services/queue/courses/{course}").status == 404
    for name in (ann, bob):
        QueueUser(hub, name).end_all()


def test_the_course_page_of_an_empty_course_and_the_list_of_none(hub, pages):
    teacher, page = fresh("tim"), pages()
    course = make_course(hub, teacher)
    log_in(page, hub, teacher)
    course_page(page, hub, course)
    expect(member_row(page, teacher)).to_contain_text("none")
    expect(page.locator("#fgpu-course-summary")).to_contain_text("0 students")
    expect(page.locator("#fgpu-course-allowance")).to_contain_text("No course limit")
    # No file chosen: said, nothing sent.
    page.click("#fgpu-roster-upload")
    expect(page.locator("#fgpu-error")).to_contain_text("Choose a CSV file first.")
    loner = pages()
    log_in(loner, hub, fresh("lou"))
    loner.goto(f"{hub.url}/services/queue/courses")
    expect(loner.locator("#fgpu-courses-empty")).to_be_visible()
