"""JupyterHub's own admin panel (/hub/admin), walked in Debian's Chromium as a hub admin: every
button a site's admin presses works on this hub, with the fGPU spawner behind it.

The panel starts a server with no options at all (`POST /hub/api/users/NAME/servers/`), which
takes the user's defaults (contract 3); it edits a group's properties as text, which the queue
service reads as the objects they spell (fgpu_shared/group_properties.py).
"""

from __future__ import annotations

import json
import re
import secrets

import pytest
from playwright.sync_api import Page, expect

from .browser import SPAWN_TIMEOUT_MS, log_in, screenshot
from .harness import QueueUser, containers_with, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]


def admin_panel(page: Page, hub) -> Page:
    log_in(page, hub, "admin")
    page.goto(f"{hub.url}/hub/admin")
    expect(page.get_by_test_id("user-row-admin")).to_be_visible()
    return page


def row_of(page: Page, user: str, server: str = ""):
    return page.get_by_test_id(f"user-row-{user}{'-' + server if server else ''}")


class Panel:
    """The admin panel narrowed to the users whose names hold `search`, as an admin finds them
    on a hub with many (it shows 50 a page)."""

    def __init__(self, page: Page, hub, search: str):
        self.page, self.hub, self.search = page, hub, search
        self.open_again()

    def narrow(self) -> None:
        self.page.get_by_placeholder("Search Users").fill(self.search)
        expect(row_of(self.page, "admin")).to_be_hidden()

    def open_again(self) -> None:
        """The panel, opened and narrowed, as an admin looks again. Not a reload: the panel reloaded at a search lists no stopped
        named server (JupyterHub 6.1)."""
        self.page.goto(f"{self.hub.url}/hub/admin")
        self.narrow()

    def comes_to_show(self, row, button: str) -> None:
        """Wait for `button` in `row`, opening the panel again as an admin would: it reads a
        server's state once, after the hub answers the click, and a start slower than the hub's
        slow_spawn_timeout (10 s, often so on a loaded machine) is answered 'pending' and stays
        so on the page."""
        wanted = row.get_by_role("button", name=button)

        def shown() -> bool:
            try:
                expect(wanted).to_be_visible(timeout=5_000)
                return True
            except AssertionError:
                self.open_again()
                return False

        try:
            wait_until(shown, SPAWN_TIMEOUT_MS / 1000, f"the row to show {button}")
        except AssertionError as e:
            table = self.page.locator("table").first.inner_text()
            raise AssertionError(f"{e}; the panel shows:\n{table}") from None

    def start(self, row) -> None:
        self.comes_to_show(row, "Start Server")
        row.get_by_role("button", name="Start Server").click()
        self.comes_to_show(row, "Stop Server")

    def stop(self, row) -> None:
        row.get_by_role("button", name="Stop Server").click()
        self.comes_to_show(row, "Start Server")


def test_users_are_added_started_opened_stopped_and_deleted_from_the_panel(hub, page):
    prefix = f"panel-{secrets.token_hex(2)}"
    ann, bob = f"{prefix}-ann", f"{prefix}-bob"
    admin_panel(page, hub)
    page.get_by_role("button", name="Add Users").click()
    page.locator("textarea").fill(f"{ann}\n{bob}")
    page.get_by_role("button", name="Add Users").click()
    panel = Panel(page, hub, prefix)
    expect(row_of(page, ann)).to_be_visible()
    expect(row_of(page, bob)).to_be_visible()

    # Start Server sends no options: the user's default image, no GPU.
    panel.start(row_of(page, ann))
    # The record says RUNNING a moment after the hub shows the server ready.
    (session,) = QueueUser(hub, ann).wait_for(
        lambda s: [x["status"] for x in s] == ["RUNNING"], timeout=60
    )
    assert (session["image"], session["fgpu"]) == ("python-3.11", 0)
    screenshot(page, "admin-panel-started")

    # Access Server: the admin lands in the student's JupyterLab, after JupyterHub's own consent.
    row_of(page, ann).get_by_role("button", name="Access Server").click()
    page.get_by_role("button", name="Authorize").click(timeout=SPAWN_TIMEOUT_MS)
    page.wait_for_url(re.compile(rf"/user/{ann}/(lab|tree)"), timeout=SPAWN_TIMEOUT_MS)
    panel.open_again()

    panel.stop(row_of(page, ann))
    assert containers_with({"fgpu.user": ann}) == []

    # Start All and Stop All act on the users the page shows (the search narrows it).
    page.get_by_test_id("start-all").click()
    for user in (ann, bob):
        panel.comes_to_show(row_of(page, user), "Stop Server")
    page.get_by_test_id("stop-all").click()
    for user in (ann, bob):
        panel.comes_to_show(row_of(page, user), "Start Server")
    wait_until(
        lambda: not containers_with({"fgpu.user": ann}) and not containers_with({"fgpu.user": bob}),
        150,
        "both containers gone after Stop All",
    )

    # Edit User → Delete User.
    row_of(page, bob).get_by_role("button", name="Edit User").click()
    page.get_by_role("button", name="Delete user").click()
    expect(row_of(page, bob)).to_be_hidden()
    assert hub.request("GET", f"users/{bob}").status_code == 404


def test_a_named_server_is_stopped_from_its_row_and_then_leaves_the_panel(hub, page):
    """A running named server has a row of its own, with Stop Server. Once stopped, the queue
    service removes the ended named server from the hub (QueueService.remove_ended_servers), so
    its row leaves the panel by itself, and no Delete Server is needed (nor left to race)."""
    user = f"panel-{secrets.token_hex(2)}"
    hub.create_user(user)
    assert hub.start_server(user, {}, server="proj").status_code in (201, 202)
    hub.wait_ready(user, "proj")
    admin_panel(page, hub)
    panel = Panel(page, hub, user)
    row = row_of(page, user, "proj")
    panel.comes_to_show(row, "Stop Server")
    (container,) = containers_with({"fgpu.user": user})
    assert container.labels["fgpu.server_name"] == "proj"
    row.get_by_role("button", name="Stop Server").click()
    wait_until(lambda: not containers_with({"fgpu.user": user}), 150, "the container gone")
    # The student's Finished tab says an admin stopped it, as for a stop from the Sessions page.
    (ended,) = QueueUser(hub, user).call("GET", "sessions?finished=1").json()["sessions"]
    assert ended["end_reason"] == "admin", ended
    wait_until(
        lambda: (
            "proj"
            not in hub.request("GET", f"users/{user}?include_stopped_servers=1").json()["servers"]
        ),
        120,
        "the ended named server removed from the hub",
    )
    panel.open_again()
    expect(row_of(page, user)).to_be_visible()
    expect(row).to_be_hidden()


def test_a_group_made_in_the_panel_with_a_quota_typed_as_text_limits_its_members(hub, page):
    group, user = f"course-{secrets.token_hex(2)}", f"panel-{secrets.token_hex(2)}"
    hub.create_user(user)
    admin_panel(page, hub)
    page.get_by_role("button", name="Manage Groups").click()
    page.get_by_role("button", name="New Group").click()
    page.get_by_test_id("group-input").fill(group)
    page.get_by_test_id("submit").click()
    page.get_by_role("link", name=group).click()
    page.get_by_test_id("username-input").fill(user)
    page.get_by_test_id("validate-user").click()
    key, value = page.locator(".properties-table input").all()[:2]
    key.fill("fgpu_quota")
    value.fill(json.dumps({"sessions": 1}))
    page.get_by_test_id("add-item").click()  # the panel keeps a row once it is added
    page.get_by_test_id("submit").click()
    wait_until(
        lambda: hub.request("GET", f"groups/{group}").json().get("properties"),
        30,
        "the group's properties saved",
    )
    screenshot(page, "admin-panel-group")

    # The quota, typed as text, holds: one session for the group's members; a second waits.
    student = QueueUser(hub, user)
    first = student.call("POST", "sessions", json={"name": "one"})
    assert first.status_code == 201, first.text
    student.wait_for(lambda s: [x["status"] for x in s] == ["RUNNING"], timeout=120)
    second = student.call("POST", "sessions", json={"name": "two"})
    assert second.status_code == 201, second.text
    (waiting,) = [s for s in student.sessions() if s["server_name"] == "two"]
    assert waiting["status"] == "PENDING", waiting
    assert f"group '{group}' has 1 of 1 sessions" in waiting["reason"], waiting["reason"]
    hub.stop_servers({(user, "one"), (user, "two")})

    # Delete Group.
    page.goto(f"{hub.url}/hub/admin#/groups")
    page.get_by_role("link", name=group).click()
    page.get_by_test_id("delete-group").click()
    wait_until(
        lambda: hub.request("GET", f"groups/{group}").status_code == 404, 30, "the group deleted"
    )
