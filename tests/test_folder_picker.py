"""The folder picker at launch in a real browser (Debian's Chromium, driven by Playwright) on the
run's shared hub: the Sessions page's launch dialog and the hub's spawn form list a student's
storage folders, the ticked ones are mounted in the session's container, and a launch with none
ticked asks first. Screenshots go to test-output/browser/folder-picker-*.
"""

from __future__ import annotations

import re
import secrets

import pytest
from playwright.sync_api import Page, expect

from .browser import SESSIONS_PAGE, SPAWN_TIMEOUT_MS, launch, log_in, rows, screenshot
from .harness import QueueUser, containers_with

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

HOME = "/home/jovyan"


def made(user: QueueUser, name: str) -> dict:
    response = user.call("POST", "folders", json={"name": name})
    assert response.status_code == 201, response.text
    return response.json()


@pytest.fixture
def student(hub, username):
    """A student with a folder of their own ("data"), an automount one (".local"), a teacher's
    folder shared read-only with them, and the teacher's own automount folder (".cache") shared
    with them too: (student, teacher's name). Their sessions are stopped at
    the end."""
    hub.create_user(username)
    me, teacher = QueueUser(hub, username), QueueUser(hub, f"teach-{secrets.token_hex(3)}")
    made(me, "data")
    made(me, ".local")
    course = made(teacher, "course material")
    shared = teacher.call(
        "POST", f"folders/{course['id']}/shares", json={"user": username, "permission": "ro"}
    )
    assert shared.status_code == 201, shared.text
    cache = made(teacher, ".cache")
    shared = teacher.call(
        "POST", f"folders/{cache['id']}/shares", json={"user": username, "permission": "ro"}
    )
    assert shared.status_code == 201, shared.text
    yield me, teacher.name
    hub.stop_servers({(username, s["server_name"] or "") for s in me.sessions()} | {(username, "")})


def mounts_of(username: str) -> dict:
    (container,) = containers_with({"fgpu.user": username})
    return {m["Destination"]: m for m in container.attrs["Mounts"]}


def open_launch_dialog(page: Page, hub, name: str) -> None:
    log_in(page, hub, name)
    page.goto(f"{hub.url}{SESSIONS_PAGE}")
    expect(page.locator("#fgpu-indicator[data-ready]")).to_be_attached()
    launch(page, "python-3.11", 0.5, 0.25, 0, 1)


def expect_the_picker(picker, always, teacher: str) -> None:
    """Both pickers list the student's own folder, then the teacher's, read-only, and name the
    student's automount one instead of offering it. The teacher's automount folder is the
    teacher's: offered to the student as any shared folder, never named as always mounted."""
    expect(picker.locator("input[type=checkbox][name=folders]")).to_have_count(3)
    labels = [" ".join(t.split()) for t in picker.locator(".form-check-label").all_inner_texts()]
    assert labels == [
        "data",
        f".cache (shared by {teacher}, read-only)",
        f"course material (shared by {teacher}, read-only)",
    ]
    expect(always).to_have_text("Always mounted: .local (at ~/.local)")


def test_the_launch_dialog_lists_the_folders_and_the_ticked_one_is_mounted(hub, student, page):
    me, teacher = student
    open_launch_dialog(page, hub, me.name)
    picker = page.locator("#fgpu-launch-folders")
    expect_the_picker(picker, page.locator("#fgpu-launch-folder-always"), teacher)
    expect(page.locator("#fgpu-launch-folder-note")).to_have_text(
        "Each folder you tick appears in the session at ~/folders/<name>."
    )
    picker.locator('[data-folder="data"] input').check()
    picker.locator('[data-folder=".cache"] input').check()
    picker.scroll_into_view_if_needed()
    screenshot(page, "folder-picker-launch-dialog")

    page.click("#fgpu-launch-submit")
    expect(page.locator("#fgpu-confirm")).to_have_count(0)  # a folder is ticked: no question
    expect(page.locator("#fgpu-launch")).to_be_hidden(timeout=SPAWN_TIMEOUT_MS)
    expect(rows(page, "RUNNING")).to_have_count(1, timeout=SPAWN_TIMEOUT_MS)
    mounts = mounts_of(me.name)
    assert mounts[f"{HOME}/folders/data"]["RW"] is True
    assert f"{HOME}/.local" in mounts  # automount, always
    assert f"{HOME}/folders/course material" not in mounts
    # The teacher's .cache where the picker said, read-only; never over the student's ~/.cache.
    assert mounts[f"{HOME}/folders/.cache"]["RW"] is False
    assert f"{HOME}/.cache" not in mounts


def test_a_launch_with_no_folder_asks_first_and_launches_without_one(hub, student, page):
    me, _ = student
    open_launch_dialog(page, hub, me.name)
    expect(page.locator("#fgpu-launch-folders input[name=folders]")).to_have_count(3)
    page.click("#fgpu-launch-submit")
    question = page.locator("#fgpu-confirm")
    expect(question).to_be_visible()
    expect(question.locator("#fgpu-confirm-title")).to_have_text("Launch without a storage folder?")
    expect(question).to_contain_text(
        "That loses nothing: your home folder (/home/jovyan) is kept between sessions"
    )
    expect(question).to_contain_text("Your folder .local is mounted as always.")
    screenshot(page, "folder-picker-warning")
    # "Choose folders" goes back to the dialog, with nothing launched.
    page.click("#fgpu-confirm-keep")
    expect(question).to_be_hidden()
    expect(page.locator("#fgpu-launch")).to_be_visible()
    expect(page.locator("#fgpu-launch-folders input[name=folders]").first).to_be_focused()
    assert me.sessions() == []

    page.click("#fgpu-launch-submit")
    expect(question).to_be_visible()
    expect(page.locator("#fgpu-confirm-go")).to_have_text("Launch without storage folder")
    page.click("#fgpu-confirm-go")
    expect(page.locator("#fgpu-launch")).to_be_hidden(timeout=SPAWN_TIMEOUT_MS)
    expect(rows(page, "RUNNING")).to_have_count(1, timeout=SPAWN_TIMEOUT_MS)
    mounts = mounts_of(me.name)
    assert not [path for path in mounts if path.startswith(f"{HOME}/folders/")]
    assert f"{HOME}/.local" in mounts


def test_a_folder_unshared_meanwhile_is_refused_in_the_dialog(hub, student, page):
    me, teacher = student
    open_launch_dialog(page, hub, me.name)
    course = page.locator('#fgpu-launch-folders [data-folder="course material"] input')
    course.check()
    listed = me.call("GET", "folders").json()["folders"]
    (folder,) = [f for f in listed if f["name"] == "course material"]
    owner = QueueUser(hub, teacher)
    (share,) = owner.call("GET", f"folders/{folder['id']}").json()["shares"]
    gone = owner.call("DELETE", f"folders/{folder['id']}/shares/{share['id']}")
    assert gone.status_code == 204, gone.text
    page.click("#fgpu-launch-submit")
    error = page.locator("#fgpu-launch-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("No folder")
    expect(page.locator("#fgpu-launch")).to_be_visible()
    assert me.sessions() == []


def test_the_spawn_form_offers_the_folders_as_boxes_and_mounts_the_ticked_one(hub, student, page):
    me, teacher = student
    log_in(page, hub, me.name)
    page.goto(f"{hub.url}/hub/spawn")
    picker = page.locator("#fgpu-folders")
    expect_the_picker(picker, page.locator("#fgpu-folders-always"), teacher)
    page.fill("#fgpu-mem", "256M")
    page.fill("#fgpu-cpu", "0.5")

    # None ticked: the form asks before it is sent.
    page.click("#spawn_form button[type=submit]")
    warning = page.locator("#fgpu-folder-warning")
    expect(warning).to_be_visible()
    expect(warning).to_contain_text("Start without a storage folder?")
    expect(warning).to_contain_text("Your folder .local is mounted as always.")
    expect(page.locator("#spawn_form button[type=submit]")).to_be_visible()
    screenshot(page, "folder-picker-spawn-form-warning")
    page.click("#fgpu-folder-choose")
    expect(warning).to_be_hidden()

    picker.locator("input[name=folders]").first.check()
    screenshot(page, "folder-picker-spawn-form")
    page.click("#spawn_form button[type=submit]")
    page.wait_for_url(re.compile(rf"/user/{me.name}/"), timeout=SPAWN_TIMEOUT_MS)
    me.wait_for(lambda s: [r for r in s if r["status"] == "RUNNING"], timeout=180)
    mounts = mounts_of(me.name)
    assert mounts[f"{HOME}/folders/data"]["RW"] is True
    assert f"{HOME}/folders/course material" not in mounts
