"""The spawn form in a real browser: Debian's Chromium, driven by Playwright, against a real hub.

What a student does: log in, pick an image and a slice on the form, and land in JupyterLab in a
container that is limited to that slice. Bad input is refused on the page and starts nothing.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, Response, expect

from image_catalog import load_catalog

from .browser import SPAWN_TIMEOUT_MS, log_in, screenshot
from .conftest import MISSING_IMAGE
from .harness import QueueUser

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

GIB = 1024**3


def log_in_to_spawn_form(page: Page, hub, username: str) -> None:
    """Log in with the demo authenticator and open the hub's spawn form (a login itself lands
    on the Sessions page: test_pages.py)."""
    log_in(page, hub, username)
    page.goto(f"{hub.url}/hub/spawn")
    expect(page.locator("form#spawn_form")).to_be_visible()
    expect(page.locator("#fgpu-image")).to_be_visible()


def capacity(hub, username: str) -> dict:
    """The cluster's capacity as the queue service tells this user (api/resources)."""
    response = QueueUser(hub, username).call("GET", "resources")
    assert response.status_code == 200, response.text
    return response.json()["capacity"]


def is_spawn_post(response: Response) -> bool:
    return response.request.method == "POST" and "/hub/spawn" in response.url


def user_containers(docker_engine, username: str) -> list:
    return docker_engine.containers.list(
        all=True, filters={"label": f"fgpu.user={username}"}, ignore_removed=True
    )


def test_form_spawns_jupyterlab_in_a_limited_container(
    hub, docker_engine, test_catalog, page, username
):
    log_in_to_spawn_form(page, hub, username)

    # The form offers the catalog's images that are on the engine (not the never-built one), with
    # their display names, and the sliders.
    catalog = [
        i for i in load_catalog(test_catalog).visible() if docker_engine.images.list(i.image)
    ]
    assert MISSING_IMAGE not in [i.image for i in catalog]
    options = page.locator("#fgpu-image option")
    expect(options).to_have_count(len(catalog))
    assert [o.get_attribute("value") for o in options.all()] == [i.name for i in catalog]
    assert [o.inner_text().strip() for o in options.all()] == [i.display_name for i in catalog]
    cpu = page.locator("input#fgpu-cpu[type=range][name=cpu]")
    expect(cpu).to_be_visible()
    # One session's limits (0.5 to 4 cores, up to 4 fGPU), within what this hub could ever grant.
    most = capacity(hub, username)
    assert (cpu.get_attribute("min"), cpu.get_attribute("max")) == (
        "0.5",
        str(min(4.0, most["cpu"] // 0.5 * 0.5)),
    )
    expect(page.locator("input#fgpu-mem-slider[type=range]")).to_be_attached()
    expect(page.locator("input#fgpu-mem[name=mem]")).to_have_value("2 GiB")
    # This hub has no GPU: its fGPU slider is off and says why, and sends nothing.
    assert most["fgpu"] == 0
    expect(page.locator("input#fgpu-fgpu")).to_be_disabled()
    expect(page.locator("input[name=fgpu]")).to_have_count(0)
    expect(page.locator(".fgpu-form")).to_contain_text("This hub does not offer GPUs yet.")

    page.select_option("#fgpu-image", "scikit-learn-1.4")
    expect(page.locator("#fgpu-image-desc")).to_contain_text("scikit-learn 1.4.2")
    page.fill("#fgpu-cpu", "1.5")
    expect(page.locator("#fgpu-cpu-value")).to_have_text("1.5 cores")
    page.fill("#fgpu-mem", "1G")
    screenshot(page, "spawn-form-filled")

    try:
        with page.expect_response(is_spawn_post) as posted:
            page.click("#spawn_form button[type=submit]")
        # The form POST redirects to the spawn-pending page, which follows the progress stream.
        assert posted.value.status == 302, posted.value.status
        page.wait_for_url(re.compile(rf"/user/{username}/lab"), timeout=SPAWN_TIMEOUT_MS)
        launcher = page.locator(".jp-Launcher")
        expect(launcher).to_be_visible(timeout=SPAWN_TIMEOUT_MS)
        tensorboard = launcher.locator(".jp-LauncherCard", has_text="TensorBoard")
        expect(tensorboard).to_be_visible()
        screenshot(page, "jupyterlab")

        (container,) = user_containers(docker_engine, username)
        assert container.labels["fgpu.image"] == "scikit-learn-1.4"
        assert container.image.tags == ["fgpu/scikit-learn:1.4.2"]
        host = container.attrs["HostConfig"]
        assert (host["CpuQuota"], host["CpuPeriod"]) == (150_000, 100_000)
        assert host["Memory"] == GIB
    finally:
        hub.stop_server(username)
    assert user_containers(docker_engine, username) == []


def test_bad_memory_is_refused_on_the_page_and_starts_nothing(hub, docker_engine, page, username):
    log_in_to_spawn_form(page, hub, username)
    form = page.locator("form#spawn_form")
    mem = page.locator("#fgpu-mem")
    mem.fill("lots")

    # The browser refuses it first: the field's pattern only takes sizes.
    assert mem.evaluate("e => e.validity.patternMismatch") is True
    assert form.evaluate("f => f.checkValidity()") is False

    # The server is the judge that counts: submit past the browser's check.
    form.evaluate("f => { f.noValidate = true; }")
    with page.expect_response(is_spawn_post) as posted:
        page.click("#spawn_form button[type=submit]")
    assert posted.value.status == 400, posted.value.status
    error = page.locator(".spawn-error-msg")
    expect(error).to_be_visible()
    expect(error).to_contain_text("not a size")
    expect(error).to_contain_text("lots")
    expect(error).not_to_contain_text("SpawnException")
    # The form is shown again with what the student typed, so they can correct it.
    expect(page.locator("#fgpu-image")).to_be_visible()
    expect(page.locator("#fgpu-mem")).to_have_value("lots")
    screenshot(page, "spawn-form-bad-memory")

    assert hub.server_model(username) is None
    assert user_containers(docker_engine, username) == []


def test_moving_the_sliders_updates_the_shown_values(hub, page, username):
    log_in_to_spawn_form(page, hub, username)
    cpu = page.locator("#fgpu-cpu")
    cpu_value = page.locator("#fgpu-cpu-value")
    # Figures as the Sessions page's dialog prints them: "1 core", not "1.0 cores".
    expect(cpu_value).to_have_text("1 core")

    # The keyboard moves the slider one step.
    cpu.focus()
    page.keyboard.press("ArrowRight")
    expect(cpu).to_have_value("1.5")
    expect(cpu_value).to_have_text("1.5 cores")

    # Dragging the thumb with the mouse: from 1.5 to the slider's end (the cluster's cores, at
    # most 4).
    box = cpu.bounding_box()
    assert box is not None
    most = float(cpu.get_attribute("max"))

    def x_of(value: float) -> float:
        return box["x"] + box["width"] * (value - 0.5) / (most - 0.5)

    y = box["y"] + box["height"] / 2
    page.mouse.move(x_of(1.5), y)
    page.mouse.down()
    page.mouse.move(x_of(most), y, steps=5)
    page.mouse.up()
    expect(cpu).to_have_value(f"{most:g}")
    expect(cpu_value).to_have_text(f"{most:g} cores")

    # The memory slider writes its value, in GiB, into the memory field that is submitted. Set
    # through the DOM, as a move would, so that this holds whatever the slider's layout (see below).
    mem = page.locator("#fgpu-mem")
    expect(mem).to_have_value("2 GiB")
    page.locator("#fgpu-mem-slider").evaluate(
        "s => { s.value = '1.5'; s.dispatchEvent(new Event('input', {bubbles: true})); }"
    )
    expect(mem).to_have_value("1.5 GiB")


def test_every_slider_is_wide_enough_to_drag(hub, page, username):
    log_in_to_spawn_form(page, hub, username)
    widths = {
        slider: page.locator(slider).evaluate("e => e.getBoundingClientRect().width")
        for slider in ("#fgpu-cpu", "#fgpu-mem-slider", "#fgpu-fgpu")
    }
    screenshot(page, "spawn-form-sliders")
    # A student drags these: each needs a track, not a bare thumb squeezed by its neighbour.
    assert all(width >= 200 for width in widths.values()), widths
