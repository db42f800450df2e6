"""The pages at a laptop's 800 px and at 1,280 px, in Chromium (pages.css, fgpu-stack tables):
at 800 px a session's row is a card whose Stop and app buttons are in sight, with no sideways
scroll in the page or the table; at 1,280 px the table keeps its columns."""

from __future__ import annotations

import secrets

import pytest
from playwright.sync_api import Page, expect

from .browser import log_in, screenshot
from .harness import QueueUser
from .test_security_handlers import SESSION

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]


def sideways_overflow(page: Page) -> list[str]:
    """The page, and every table's scrolling box, that is wider than the window shows."""
    return page.evaluate(
        """() => [document.scrollingElement, ...document.querySelectorAll('.fgpu-table-wrap')]
            .filter(box => box.scrollWidth > box.clientWidth + 1)
            .map(box => box.id || box.className || box.tagName)"""
    )


def with_a_session_and_a_job(hub, prefix: str) -> QueueUser:
    """A new student with a running session and a running batch job (`sleep 300`)."""
    student = QueueUser(hub, f"{prefix}-{secrets.token_hex(2)}")
    assert student.call("POST", "sessions", json={**SESSION, "count": 1}).status_code == 201
    job = {**SESSION, "type": "batch", "command": "sleep 300"}
    assert student.call("POST", "sessions", json=job).status_code == 201
    student.wait_for(lambda s: [x["status"] for x in s] == ["RUNNING", "RUNNING"], 150)
    return student


def test_a_session_row_reflows_at_800_px_with_its_buttons_in_sight(hub, page):
    student = with_a_session_and_a_job(hub, "narrow")
    name = student.name
    log_in(page, hub, name)
    page.set_viewport_size({"width": 800, "height": 900})
    page.goto(f"{hub.url}/services/queue/")
    session = page.locator("#fgpu-sessions tbody tr", has_text="JupyterLab")
    stop = session.get_by_role("button", name="Stop")
    expect(stop).to_be_visible()
    expect(page.locator("#fgpu-sessions thead")).to_be_hidden()
    # Each value says what it is: the column's heading is the card's label.
    expect(session.locator('td[data-label="Memory"]')).to_have_text("256 MiB")
    for button in (stop, session.get_by_role("link", name="JupyterLab")):
        box = button.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 800, box
    assert sideways_overflow(page) == []
    screenshot(page, "sessions-800")

    page.set_viewport_size({"width": 1280, "height": 900})
    expect(page.locator("#fgpu-sessions thead")).to_be_visible()
    assert sideways_overflow(page) == []
    screenshot(page, "sessions-1280")
    student.end_all()
