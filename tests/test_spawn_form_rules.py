"""The hub's own spawn form follows the launch dialog's rules, in Debian's
Chromium against a real hub of one simulated GPU holding 2 fGPU: its fGPU slider stops at what
the cluster can ever grant (not the site's 4 per session), its presets launch sessions of the
preset's slots, and asking more than is free now says that the session will wait, and for what."""

from __future__ import annotations

import os
import re
import signal

import pytest
from playwright.sync_api import Page, expect

from .browser import SPAWN_TIMEOUT_MS, log_in, screenshot
from .harness import containers_with
from .test_queue_service import queue_service_pid

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

MIB = 1024**2


def open_form(page: Page, hub, user: str, server: str = "") -> None:
    page.goto(f"{hub.url}/hub/spawn/{user}/{server}" if server else f"{hub.url}/hub/spawn")
    expect(page.locator("form#spawn_form #fgpu-image")).to_be_visible()


def test_the_fgpu_slider_stops_at_the_clusters_two_fgpu(preset_hub, preset_student, page):
    log_in(page, preset_hub, preset_student.name)
    open_form(page, preset_hub, preset_student.name)
    fgpu = page.locator("input#fgpu-fgpu[name=fgpu]")
    assert fgpu.get_attribute("max") == "2.0"
    # As a student pushes it all the way: it stops at 2, the whole GPU.
    fgpu.focus()
    page.keyboard.press("End")
    expect(fgpu).to_have_value("2")
    expect(page.locator("#fgpu-fgpu-value")).to_have_text("2 fGPU")
    # Nothing is held, so 2 fGPU is free: no warning.
    expect(page.locator("#fgpu-form-warning")).to_be_hidden()
    # The presets, the one above one session's limits disabled with the service's reason.
    half = page.locator("#fgpu-presets [data-preset='half GPU']")
    expect(half).to_contain_text("half GPU — 0.5 cores, 512 MiB, 1 fGPU")
    expect(half.locator("input")).to_be_enabled()
    too_big = page.locator("#fgpu-presets [data-preset='all GPUs']")
    expect(too_big.locator("input")).to_be_disabled()
    expect(too_big).to_contain_text(
        "Not available: Needs 8 fGPU; one session may have at most 4 fGPU."
    )
    screenshot(page, "spawn-form-rules-capacity")


def test_a_preset_launches_its_slots_and_more_than_is_free_warns(preset_hub, preset_student, page):
    log_in(page, preset_hub, preset_student.name)
    open_form(page, preset_hub, preset_student.name, "first")
    page.check("#fgpu-presets [data-preset='half GPU'] input")
    # The sliders show the preset, and are not sent with it.
    expect(page.locator("#fgpu-fgpu")).to_be_disabled()
    expect(page.locator("#fgpu-fgpu-value")).to_have_text("1 fGPU")
    expect(page.locator("#fgpu-mem")).to_have_value("0.5 GiB")
    page.fill("#fgpu-env", "SEED=42")
    screenshot(page, "spawn-form-rules-preset")
    page.click("#spawn_form button[type=submit]")
    page.wait_for_url(re.compile(rf"/user/{preset_student.name}/first/"), timeout=SPAWN_TIMEOUT_MS)
    (session,) = preset_student.wait_for(lambda s: [r for r in s if r["status"] == "RUNNING"])
    assert (session["cpu"], session["mem"], session["fgpu"]) == (0.5, 512 * MIB, 1.0)
    (container,) = containers_with({"fgpu.user": preset_student.name})
    assert "SEED=42" in container.attrs["Config"]["Env"]

    # With 1 of the 2 fGPU held, a second server asking 2 fGPU would wait: the form says so.
    open_form(page, preset_hub, preset_student.name, "second")
    warning = page.locator("#fgpu-form-warning")
    expect(warning).to_be_hidden()
    page.locator("#fgpu-fgpu").focus()
    page.keyboard.press("End")
    expect(warning).to_be_visible()
    expect(warning).to_have_text(
        "This session will wait in the queue (PENDING): it asks 2 fGPU, and 1 fGPU is free for "
        "you now. It starts by itself when others end."
    )
    screenshot(page, "spawn-form-rules-will-wait")
    page.keyboard.press("Home")
    expect(warning).to_be_hidden()


def test_the_form_still_renders_with_a_plain_note_when_the_service_does_not_answer(
    preset_hub, preset_student, page
):
    log_in(page, preset_hub, preset_student.name)
    service = queue_service_pid(preset_hub)
    os.kill(service, signal.SIGSTOP)
    try:
        # Not waiting for "load": the indicator above the form is the service's own page.
        page.goto(f"{preset_hub.url}/hub/spawn", wait_until="domcontentloaded")
        expect(page.locator("form#spawn_form")).to_be_visible()
        note = page.locator("#fgpu-form-note")
        expect(note).to_have_text(
            "The queue service did not answer, so the images, what is free for you, the "
            "presets and your storage folders could not be shown here; starting a server may "
            "fail until it is back. Reload this page to try again."
        )
        # The site's own limits stand in for the cluster's: 4 fGPU for one session.
        assert page.locator("#fgpu-fgpu").get_attribute("max") == "4.0"
        screenshot(page, "spawn-form-rules-no-service")
    finally:
        os.kill(service, signal.SIGCONT)
