"""JupyterLab, Notebook 7 and TensorBoard in a real session, in Debian's Chromium: what their
pages log.

A page that throws on load, or warns that settings failed to load, hides the messages a student
or an admin needs when something is really wrong. JupyterLab must log nothing; Notebook's pages
and TensorBoard only what their own front ends log on any install (listed below, with why), so
that anything new (an extension's plugin throwing, a settings schema failing, a request of
TensorBoard's that fails) fails here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
from playwright.sync_api import Page, expect

from .browser import SPAWN_TIMEOUT_MS, log_in, screenshot
from .test_storage import start_session

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

# What each page may log at warning level or above, and why; anything else fails the test.
# Headless Chromium draws xterm.js's WebGL canvas with software GL, which reports its stalls.
EVERY_PAGE = [re.compile(r"^\[\.WebGL-\w+\]GL Driver Message ")]
# Notebook 7.6.5's own front end (the JupyterLab 4.6.6 plugins it bundles) logs these on a clean
# install, with overrides.json removed and with every extension of ours disabled alike: they are
# races in upstream code, not this image's settings or extensions.
NOTEBOOK_PAGES = EVERY_PAGE + [
    # jupyter/notebook#7862: the shortcuts plugin's pluginChanged handler reads its own settings
    # (registry.plugins[shortcuts.id].schema) when docmanager-extension:plugin's settings arrive
    # first. Harmless: the shortcuts are composed again when the plugin's own settings load.
    re.compile(r"^Cannot read properties of undefined \(reading 'schema'\)$"),
    # The terminal plugin applies its settings to a terminal whose xterm.js is not created yet.
    re.compile(
        r"^TypeError: Cannot read properties of undefined \(reading 'options'\)\s+at \S+\.setOption"
    ),
    # Notebook loads the settings of plugins of its other pages for its Settings Editor; these
    # three use settings transforms, which only their own page registers ("no transformers yet").
    re.compile(
        r"^Settings failed to load for \((@jupyterlab/application-extension:context-menu"
        r"|@jupyterlab/metadataform-extension:metadataforms|@jupyterlab/logconsole-extension:plugin)\)"
    ),
    # Notebook's menus and JupyterLab's default keymap name these twice on Notebook's pages.
    re.compile(
        r"^Menu entry for command '(filemenu:close-and-cleanup|application:close)' is duplicated\.$"
    ),
    re.compile(
        r"^Skipping \{command: scratchpad-console:open, .* collides with another enabled default"
    ),
]

# TensorBoard 2.21's page names its Roboto fonts at the site's root, `url(/font-roboto/…)`, whatever
# --path_prefix says (its other files follow the prefix): under a hub those requests reach the hub
# and 404, and the page draws in the browser's sans-serif instead. Harmless; only these fail.
TENSORBOARD_FONTS = re.compile(r"^404 https?://[^/]+/(hub/)?font-roboto/[\w-]+\.woff2$")
FONT_404 = re.compile(r"^Failed to load resource: the server responded with a status of 404")
# Its bundle carries three.js twice (the projector's and the mesh plugin's copies), and three.js
# says so when the second loads; each plugin uses its own copy.
TENSORBOARD_PAGE = EVERY_PAGE + [
    re.compile(r"^WARNING: Multiple instances of Three\.js being imported\.$")
]


@dataclass
class Log:
    page_errors: list[str] = field(default_factory=list)
    messages: list[tuple[str, str]] = field(default_factory=list)

    def problems(self, allowed: list[re.Pattern]) -> list[str]:
        logged = [("uncaught", e) for e in self.page_errors] + [
            (kind, text) for kind, text in self.messages if kind in ("error", "warning")
        ]
        return [
            f"{kind}: {text}" for kind, text in logged if not any(p.search(text) for p in allowed)
        ]


def recording(page: Page) -> Log:
    log = Log()
    page.on("pageerror", lambda error: log.page_errors.append(error.message))
    page.on("console", lambda message: log.messages.append((message.type, message.text)))
    return log


def settle(page: Page) -> None:
    """The errors come from plugins racing one another while the page starts, and the settings
    of plugins not on the page are loaded after the app is restored, with a one-second transform
    timeout: wait until the network is quiet, and a little beyond."""
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(3_000)


def test_jupyterlab_logs_nothing_and_notebook_pages_only_their_known_races(hub, pages, username):
    start_session(hub, username)
    base = f"{hub.url}/user/{username}"
    found = {}

    page = pages()
    log_in(page, hub, username)

    lab = recording(page)
    page.goto(f"{base}/lab", timeout=SPAWN_TIMEOUT_MS)
    expect(page.locator(".jp-LauncherCard").first).to_be_visible(timeout=SPAWN_TIMEOUT_MS)
    settle(page)
    # A terminal in JupyterLab too: its settings reach the xterm.js it opens.
    page.locator('.jp-LauncherCard[title="Start a new terminal session"]').click()
    expect(page.locator(".jp-Terminal .xterm-screen").first).to_be_visible()
    settle(page)
    screenshot(page, "jupyterlab-console")
    # JupyterLab itself logs nothing at all: no uncaught error, no error, no warning.
    found["lab"] = lab.problems(EVERY_PAGE)

    for path, ready in [
        ("tree", ".jp-DirListing-content"),
        ("terminals/1", ".xterm-screen"),
    ]:
        other = pages()
        other.context.add_cookies(page.context.cookies())
        log = recording(other)
        other.goto(f"{base}/{path}", timeout=SPAWN_TIMEOUT_MS)
        expect(other.locator(ready).first).to_be_visible(timeout=30_000)
        settle(other)
        found[path] = log.problems(NOTEBOOK_PAGES)

    # TensorBoard through jupyter-server-proxy: nothing logged, and no request of its own fails.
    board = pages()
    board.context.add_cookies(page.context.cookies())
    log = recording(board)
    failed = []
    board.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
    board.goto(f"{base}/tensorboard/", timeout=SPAWN_TIMEOUT_MS)
    expect(board.locator("tf-tensorboard, tb-webapp").first).to_be_attached()
    settle(board)
    screenshot(board, "tensorboard-console")
    # A 404 in the console is allowed only while every failed request is one of the fonts.
    found["tensorboard"] = [f for f in failed if not TENSORBOARD_FONTS.match(f)] + log.problems(
        TENSORBOARD_PAGE + ([FONT_404] if failed else [])
    )

    assert found == {"lab": [], "tree": [], "terminals/1": [], "tensorboard": []}
