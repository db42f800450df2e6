"""The pages' details, checked without a hub: one way to show sizes (fgpu.js's `size` in Debian's
Chromium beside fgpu_shared.units.format_size), the demo login's note under its password field,
and where a login lands (fgpu_spawner/landing.py). The pages themselves: tests/test_pages.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from fgpu_shared.units import format_size
from fgpu_spawner.demo_login import DemoAuthenticator
from fgpu_spawner.landing import sessions_page_url
from queue_service.handlers.pages import STATIC_DIR, page_namespace, template_environment

from .browser import browser  # noqa: F401 (the module's Chromium)

GIB, MIB = 1024**3, 1024**2
SIZES = [0, 1, 512, 1024, 1536, 256 * MIB, 512 * MIB, GIB, GIB * 9 // 8, int(23.04 * GIB)]
SIZES += [int(7.84 * GIB), 40 * GIB, 3 * GIB // 2, 1024**4, 5 * 1024**4 + 1, 999 * MIB]


@pytest.mark.browser
def test_the_pages_show_every_size_as_the_python_side_does(browser):  # noqa: F811
    page = browser.new_page()
    try:
        config = json.dumps({"api": "/", "user": "x"})
        page.set_content(f'<script type="application/json" id="fgpu-page-config">{config}</script>')
        page.add_script_tag(content=(STATIC_DIR / "fgpu.js").read_text())
        shown = page.evaluate("sizes => sizes.map(fgpu.size)", SIZES)
    finally:
        page.close()
    assert shown == [format_size(n) for n in SIZES]
    assert shown[SIZES.index(int(23.04 * GIB))] == "23.04 GiB"


def render_login(authenticator) -> str:
    namespace = page_namespace(None, "/", "/services/queue/")
    template = template_environment().get_template("login.html")
    return template.render(
        **namespace, authenticator=authenticator, authenticator_login_url="/hub/login", xsrf=""
    )


def test_the_demo_login_says_its_password_is_not_checked():
    html = render_login(DemoAuthenticator())
    assert 'id="password_input"' in html  # JupyterHub's own field, kept
    assert 'id="fgpu-demo-login-note"' in html
    assert "the password is not checked" in html


def test_with_a_shared_password_the_demo_login_says_so():
    authenticator = DemoAuthenticator()
    authenticator.password = "class-2024"
    html = render_login(authenticator)
    assert "shared password" in html and "not checked" not in html
    assert "class-2024" not in html


def test_another_authenticators_login_page_is_jupyterhubs_own():
    html = render_login(SimpleNamespace(request_otp=False))
    assert 'id="password_input"' in html and "fgpu-demo-login-note" not in html


def test_a_login_lands_on_the_sessions_page_under_the_hubs_base_url():
    assert sessions_page_url(SimpleNamespace(base_url="/")) == "/services/queue/sessions"
    assert sessions_page_url(SimpleNamespace(base_url="/jh/")) == "/jh/services/queue/sessions"
