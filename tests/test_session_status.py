"""The session's own item in JupyterLab's status bar (recipes/jupyter-base/session-status), in a real
session in Debian's Chromium: the fGPU slice, and the time left when the hub plans an end.

Beside it, jupyter-resource-usage's items show CPU and memory against the slice (CPU_LIMIT and
MEM_LIMIT, set by the spawner); both are read here as a student sees them.
"""

from __future__ import annotations

import re
import secrets
import time

import pytest
import requests
from playwright.sync_api import expect

from queue_service.session_end_notice import KEY_HEADER

from .browser import SPAWN_TIMEOUT_MS, log_in, screenshot
from .harness import containers_with

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

# Shorter than the shared hub's idle timeout (1 h), so the lifetime is the end ahead.
LIFETIME = "30m"
METRICS = """async (url) => {
  const xsrf = document.cookie.match(/_xsrf=([^;]+)/);
  const response = await fetch(url, {headers: {"X-XSRFToken": xsrf ? xsrf[1] : ""}});
  return await response.json();
}"""


def start(hub, username: str, fgpu: float) -> None:
    options = {"image": "python-3.11", "cpu": 0.5, "mem": "512M", "fgpu": fgpu}
    response = hub.start_server(username, options)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(username)


def test_the_status_bar_shows_the_fgpu_slice_and_the_time_until_the_lifetime_ends_it(
    gpu_hub, pages, username
):
    gpu_hub.create_user(username)
    gpu_hub.join_group(username, {"max_session_lifetime": LIFETIME})
    start(gpu_hub, username, 0.5)
    page = pages()
    log_in(page, gpu_hub, username)  # lands on the Sessions page: the queue service's login too
    page.goto(f"{gpu_hub.url}/user/{username}/lab", timeout=SPAWN_TIMEOUT_MS)

    item = page.locator(".fgpu-session-status")
    # The end is read from the queue service a moment after the page opens.
    expect(item).to_have_text(re.compile(r"^0\.5 fGPU · ends in (29|30) min$"), timeout=60_000)
    title = item.get_attribute("title")
    assert "0.5 fGPU, 0.5 CPU cores and 0.5 GiB of memory" in title
    assert "Run nvidia-smi in a terminal" in title
    assert "maximum lifetime of 30 min" in title, title
    # jupyter-resource-usage's item: use against the slice, not in warning colours at low use.
    usage = page.locator(".jp-StatusBar-Widget", has_text="Mem:").first
    expect(usage).to_contain_text("/ 512.00 MB")
    metrics = page.evaluate(METRICS, f"/user/{username}/api/metrics/v1")
    assert metrics["limits"]["cpu"] == {"cpu": 50.0, "warn": False}, metrics
    assert metrics["limits"]["memory"]["warn"] is False, metrics
    screenshot(page, "jupyterlab-status-bar")

    # A click opens the student's Sessions page, where the session is listed.
    with page.context.expect_page() as opened:
        item.click()
    expect(opened.value.locator("td.fgpu-id").first).to_be_visible()


def test_a_session_without_a_gpu_says_so_and_when_the_idle_culler_would_stop_it(
    gpu_hub, pages, username
):
    start(gpu_hub, username, 0)
    page = pages()
    log_in(page, gpu_hub, username)
    page.goto(f"{gpu_hub.url}/user/{username}/lab", timeout=SPAWN_TIMEOUT_MS)
    item = page.locator(".fgpu-session-status")
    # The shared hub's idle timeout is an hour; activity (this page) postpones the end.
    expect(item).to_have_text(
        re.compile(r"^no GPU · stops if unused in (59|60) min$"), timeout=60_000
    )
    title = item.get_attribute("title")
    assert "This session holds no GPU, 0.5 CPU cores and 0.5 GiB of memory." in title
    assert "if nobody uses it until then (idle: no activity for 1 h)" in title, title
    assert "Run nvidia-smi" not in title
    cookies = page.context.cookies()  # the owner's login, as their browser holds it
    only_the_owner_and_the_queue_service_reach_the_planned_end(gpu_hub, username, cookies)


def only_the_owner_and_the_queue_service_reach_the_planned_end(gpu_hub, username, cookies):
    """The session's endpoint (fgpu_session_end.py) behind the hub's proxy: its owner reads it and
    bad bodies are refused, leaving it as it was; only the session's key writes it; another student's token, a request with no
    credentials and one with the owner's cookies but no XSRF token get nothing. (Checked on the session of the test above: one start less.)"""
    url = f"{gpu_hub.url}/user/{username}/fgpu/session-end"
    owner = {"Authorization": f"token {gpu_hub.user_token(username)}"}
    told = wait_for_end(url, owner)
    assert told["why"] == "idle" and told["text"] == "idle: no activity for 1 h", told

    # The service tells it with the session's own key, and nothing else writes it: not even
    # the owner's token (only the key, which the owner can read in the session, fools their own
    # status bar).
    (container,) = containers_with({"fgpu.user": username, "fgpu.server_name": ""})
    env = dict(line.split("=", 1) for line in container.attrs["Config"]["Env"])
    keyed = {KEY_HEADER: env["FGPU_END_NOTICE_KEY"]}
    for body in ("[1]", '{"ends": 5}', "not json", "x" * 5000):
        refused = requests.put(url, headers=keyed, data=body, timeout=10)
        assert refused.status_code in (400, 413), (body[:10], refused.status_code)
    for headers in (owner, {KEY_HEADER: "0" * 64}, {**owner, KEY_HEADER: ""}):
        refused = requests.put(url, headers=headers, data='{"ends": null}', timeout=10)
        assert refused.status_code == 403, (list(headers), refused.status_code)
    assert requests.get(url, headers=owner, timeout=10).json()["ends"] == told

    other = f"other-{secrets.token_hex(3)}"
    gpu_hub.create_user(other)
    stranger = {"Authorization": f"token {gpu_hub.user_token(other)}"}
    for method in ("GET", "PUT"):
        response = requests.request(method, url, headers=stranger, data="{}", timeout=10)
        assert response.status_code == 403, (method, response.status_code)
    # A cookie-less, token-less request from anywhere is sent to log in, never served.
    anonymous = requests.get(url, allow_redirects=False, timeout=10)
    assert anonymous.status_code in (302, 403), anonymous.status_code
    # The owner's login cookies alone, as another site's form would send them: no XSRF token, no
    # change.
    browser = requests.Session()
    for cookie in cookies:
        browser.cookies.set(cookie["name"], cookie["value"], path=cookie["path"])
    assert browser.get(url, timeout=10).json()["ends"] == told  # the cookies do log in
    forged = browser.put(url, data='{"ends": null}', timeout=10)
    assert forged.status_code == 403, forged.status_code
    assert requests.get(url, headers=owner, timeout=10).json()["ends"] == told


def wait_for_end(url: str, headers: dict, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = requests.get(url, headers=headers, timeout=10)
        if response.ok and response.json()["ends"]:
            return response.json()["ends"]
        time.sleep(1)
    raise AssertionError(f"the queue service never told {url} its planned end")
