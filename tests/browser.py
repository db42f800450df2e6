"""Debian's Chromium, driven by Playwright: the fixtures and steps every browser test shares.

The browser is /usr/bin/chromium, never one that Playwright downloads. Screenshots go to
test-output/browser/ for the notes.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from .harness import ROOT

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags, Chromium keeps calling hosts this closed network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = ROOT / "test-output" / "browser"
# A container's start and its server's first answer, on a busy 2-core machine.
SPAWN_TIMEOUT_MS = 150_000
SESSIONS_PAGE = "/services/queue/"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.is_file():
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's chromium package "
            "(never download a browser with `playwright install`)",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


@pytest.fixture
def pages(browser: Browser) -> Iterator[Callable[[], Page]]:
    """Opens browser pages, each in a context of its own (its own login); closed after the test."""
    opened: list[Page] = []

    def open_page() -> Page:
        context = browser.new_context(viewport={"width": 1400, "height": 950})
        context.set_default_timeout(60_000)
        page = context.new_page()
        page.goto = _again_after_a_network_change(page.goto)
        opened.append(page)
        return page

    yield open_page
    for page in opened:
        page.context.close()


@pytest.fixture
def page(pages) -> Page:
    """One browser page of its own for the test (`pages` opens more)."""
    return pages()


def _again_after_a_network_change(goto: Callable) -> Callable:
    """Chromium fails a navigation under way with ERR_NETWORK_CHANGED whenever an interface
    comes or goes, loopback targets included, and the engine adds one for every container it
    starts (a veth): a navigation so failed is made again, up to twice."""

    def go(url: str, **kwargs):
        for attempt in range(3):
            try:
                return goto(url, **kwargs)
            except PlaywrightError as e:
                if "ERR_NETWORK_CHANGED" not in str(e) or attempt == 2:
                    raise

    return go


def log_in(page: Page, hub, name: str) -> None:
    """The demo login, as a person types it: any name, any password."""
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", secrets.token_hex(4))
    page.click("#login_submit")
    page.wait_for_load_state()


def screenshot(page: Page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


# -- the Sessions page ----------------------------------------------------------------------


def rows(page: Page, status: str | None = None):
    selector = "#fgpu-sessions tbody tr" + (f'[data-status="{status}"]' if status else "")
    return page.locator(selector)


def launch(page: Page, image: str, cpu: float, mem_gib: float, fgpu: float, count: int) -> None:
    page.click("#fgpu-start")
    dialog = page.locator("#fgpu-launch")
    expect(dialog).to_be_visible()
    expect(page.locator(f'#fgpu-launch-image option[value="{image}"]')).to_be_attached()
    page.select_option("#fgpu-launch-image", image)
    page.fill("#fgpu-launch-cpu", str(cpu))
    page.fill("#fgpu-launch-mem", str(mem_gib))
    if fgpu:  # the slider is disabled, at 0, where the cluster has no GPU
        page.fill("#fgpu-launch-fgpu", str(fgpu))
    page.fill("#fgpu-launch-count", str(count))


def submit_launch(page: Page) -> None:
    page.click("#fgpu-launch-submit")
    expect(page.locator("#fgpu-launch")).to_be_hidden(timeout=SPAWN_TIMEOUT_MS)


def end_with_confirmation(page: Page, button, expect_text: str = "") -> None:
    """Press a Stop / Cancel button and confirm in the page's dialog (fgpu.js confirmAction):
    nothing is ended by the press alone."""
    button.click()
    dialog = page.locator("#fgpu-confirm")
    expect(dialog).to_be_visible()
    if expect_text:
        expect(dialog).to_contain_text(expect_text)
    page.click("#fgpu-confirm-go")
    expect(dialog).to_be_hidden()
