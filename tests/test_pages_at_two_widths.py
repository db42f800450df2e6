"""Every page a class lives in, at a laptop's 800 px and at 1,280 px, as a student and as a hub
admin, in Chromium: each page draws (its own ready marker), nothing on it scrolls sideways, and
its console stays clean (no uncaught error, no error or warning logged, no request of its own
that fails). Screenshots: test-output/browser/width-<who>-<page>-<width>.png.

The student has a running session and a batch job, so that the Sessions page shows rows as
cards at 800 px, and opens the Start dialog, which must fit too. The admin adds the Cluster page
and JupyterHub's own admin panel.
"""

from __future__ import annotations

import secrets

import pytest
from playwright.sync_api import Page, expect

from .browser import SESSIONS_PAGE, log_in, screenshot
from .test_jupyter_console import EVERY_PAGE, recording
from .test_narrow_pages import sideways_overflow, with_a_session_and_a_job

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

WIDTHS = (800, 1280)
#: What a student opens, and what shows each page has drawn.
STUDENT_PAGES = {
    "sessions": (SESSIONS_PAGE + "sessions", "#fgpu-indicator[data-ready]"),
    "storage": (SESSIONS_PAGE + "storage", "h1"),
    "images": (SESSIONS_PAGE + "images", "h1"),
    "usage": (SESSIONS_PAGE + "usage", "h1"),
    "courses": (SESSIONS_PAGE + "courses", "h1"),
    "ssh-keys": (SESSIONS_PAGE + "ssh", "h1"),
    "hub-home": ("/hub/home", "#fgpu-indicator-frame"),
}
ADMIN_PAGES = {
    **STUDENT_PAGES,
    "cluster": (SESSIONS_PAGE + "cluster", "h1"),
    "hub-admin": ("/hub/admin", "#root table, [data-testid='user-row-name'], table"),
}


def failed_requests(page: Page) -> list[str]:
    failed: list[str] = []
    page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
    return failed


def walk(page: Page, hub, who: str, visits: dict[str, tuple[str, str]]) -> dict[str, list]:
    """Each page at each width: what went wrong on it (an empty list each, when all is well)."""
    found = {}
    log, failed = recording(page), failed_requests(page)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        for name, (path, ready) in visits.items():
            log.page_errors.clear(), log.messages.clear(), failed.clear()
            page.goto(f"{hub.url}{path}")
            expect(page.locator(ready).first).to_be_attached(timeout=30_000)
            # The pages poll every few seconds, so the network is never idle: one round of
            # their polls is what a page does once drawn.
            page.wait_for_timeout(700)
            found[f"{name}@{width}"] = (
                log.problems(EVERY_PAGE)
                + failed
                + [f"scrolls sideways: {box}" for box in sideways_overflow(page)]
            )
            screenshot(page, f"width-{who}-{name}-{width}")
    return found


def test_a_student_and_an_admin_meet_every_page_whole_and_quiet_at_800_and_1280_px(hub, pages):
    # Names as long as a site's may be, unbroken, in the tables every page shows.
    student = with_a_session_and_a_job(hub, "widths-a-student-with-a-long-login-name")
    group = f"a-course-group-whose-name-runs-long-without-a-break-{secrets.token_hex(2)}"
    assert hub.request("POST", f"groups/{group}").status_code == 201
    members = {"users": [student.name]}
    assert hub.request("POST", f"groups/{group}/users", json=members).status_code == 200
    try:
        page = pages()
        log_in(page, hub, student.name)
        found = walk(page, hub, "student", STUDENT_PAGES)

        # The Start dialog at 800 px: its buttons in sight, nothing sideways.
        page.set_viewport_size({"width": 800, "height": 900})
        page.goto(f"{hub.url}{SESSIONS_PAGE}sessions")
        page.click("#fgpu-start")
        expect(page.locator("#fgpu-launch-image")).to_be_enabled()
        launch_button = page.locator("#fgpu-launch-submit")
        expect(launch_button).to_be_in_viewport()
        box = launch_button.bounding_box()
        assert box["x"] + box["width"] <= 800, box
        found["start-dialog@800"] = [f"scrolls sideways: {b}" for b in sideways_overflow(page)]
        screenshot(page, "width-student-start-dialog-800")

        admin = pages()
        log_in(admin, hub, "admin")
        found |= {f"admin {k}": v for k, v in walk(admin, hub, "admin", ADMIN_PAGES).items()}
        # The Cluster page's charts, over each span: no two times on an axis read the same (a
        # young hub's half-minute ticks were printed to the minute, its samples on a week's axis
        # as two equal dates).
        admin.goto(f"{hub.url}{SESSIONS_PAGE}cluster")
        expect(admin.locator("#fgpu-util-cpu[data-ready]")).to_be_attached(timeout=30_000)
        for hours in ("1", "24", "168"):
            admin.select_option("#fgpu-util-range", hours)
            expect(admin.locator(f'#fgpu-util-cpu[data-hours="{hours}"]')).to_be_attached()
            labels = admin.evaluate(
                "Chart.getChart(document.getElementById('fgpu-util-cpu')).scales.x.ticks"
                ".map(t => t.label)"
            )
            found[f"admin cluster ticks over {hours} h"] = (
                [] if len(set(labels)) == len(labels) else [f"ticks read alike: {labels}"]
            )
        # A health warning quotes paths with no break in them (a frozen container's cgroup
        # file): at 800 px it wraps, the page keeps its width.
        admin.set_viewport_size({"width": 800, "height": 900})
        admin.evaluate(
            """() => { const health = document.getElementById('fgpu-health');
                health.textContent = 'wrote THAWED to /sys/fs/cgroup/freezer/docker/' +
                    'a5151cd44e0f27d743118bd42ff9dcb056f86d3f9c8b5fa8b1d9a112b048d2fa/freezer.state';
                health.classList.remove('d-none'); }"""
        )
        found["admin cluster health@800"] = sideways_overflow(admin)
        screenshot(admin, "width-admin-cluster-health-800")
        assert {k: v for k, v in found.items() if v} == {}
    finally:
        student.end_all()
