"""Presets, names and env against a real hub: `GET api/presets`, `POST
api/sessions` and the hub's own `POST /hub/api/users/{name}/servers/{server}` taking the same
options, each bad value answered with a 4xx and a message and nothing left behind."""

from __future__ import annotations

import contextlib
import secrets
import sqlite3

import pytest
import requests
from playwright.sync_api import expect

from .browser import SESSIONS_PAGE, SPAWN_TIMEOUT_MS, log_in, rows, screenshot
from .harness import QueueUser, containers_with

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

GIB = 1024**3
IMAGE = {"image": "python-3.11"}


def nothing_left(hub, user: str) -> None:
    """No queue record, no hub server (stopped ones too), no container of `user`."""
    with contextlib.closing(sqlite3.connect(hub.workdir / "fgpu_queue.sqlite")) as db:
        assert db.execute("SELECT id FROM sessions WHERE user = ?", (user,)).fetchall() == []
    response = hub.request("GET", f"users/{user}?include_stopped_servers=1")
    assert {name for name in response.json()["servers"] if name} == set()
    assert containers_with({"fgpu.user": user}) == []


def test_presets_are_listed_with_the_reason_when_one_is_unavailable(preset_hub, preset_student):
    group = preset_hub.join_group(
        preset_student.name, {"fgpu_presets": [{"name": "lab", "cpu": 1, "mem": "1G"}]}
    )
    response = preset_student.call("GET", "presets")
    assert response.status_code == 200, response.text
    rows = {row["name"]: row for row in response.json()["presets"]}
    assert list(rows) == ["CPU small", "half GPU", "all GPUs", "lab"]
    assert (rows["half GPU"]["fgpu"], rows["half GPU"]["mem"]) == (1.0, 512 * 1024**2)
    assert rows["half GPU"]["available"] and rows["half GPU"]["reason"] == ""
    assert not rows["all GPUs"]["available"]
    assert rows["all GPUs"]["reason"] == "Needs 8 fGPU; one session may have at most 4 fGPU."
    # The group's preset is its members' only.
    other = QueueUser(preset_hub, f"other-{secrets.token_hex(3)}")
    assert "lab" not in [r["name"] for r in other.call("GET", "presets").json()["presets"]]
    assert group


def test_only_the_spawner_and_admins_read_anothers_presets(preset_hub, preset_student):
    other = QueueUser(preset_hub, f"other-{secrets.token_hex(3)}")
    refused = other.call("GET", "presets", params={"user": preset_student.name})
    assert refused.status_code == 403, refused.text
    # A token that may not reach the service at all.
    narrow = preset_hub.request(
        "POST", f"users/{preset_student.name}/tokens", json={"scopes": ["read:users:name!user"]}
    )
    assert narrow.status_code == 201, narrow.text
    url = f"{preset_hub.url}/services/queue/api/presets"
    headers = {"Authorization": f"token {narrow.json()['token']}"}
    assert requests.get(url, headers=headers, timeout=60).status_code == 403
    spawner = requests.get(
        url,
        params={"user": preset_student.name},
        headers={"Authorization": f"token {preset_hub.spawner_token}"},
        timeout=60,
    )
    assert spawner.status_code == 200 and spawner.json()["presets"]


def test_a_named_launch_with_a_preset_and_env_runs_with_them(preset_hub, preset_student):
    body = {**IMAGE, "preset": "half GPU", "name": "mnist", "env": {"SEED": "42"}}
    response = preset_student.call("POST", "sessions", json=body)
    assert response.status_code == 201, response.text
    (server,) = response.json()["servers"]
    assert server["server_name"] == "mnist"
    session = server["session"]
    assert (session["cpu"], session["mem"], session["fgpu"]) == (0.5, 512 * 1024**2, 1.0)
    preset_student.wait_for(lambda s: [x["status"] for x in s] == ["RUNNING"], timeout=180)
    (container,) = containers_with({"fgpu.user": preset_student.name})
    env = dict(item.split("=", 1) for item in container.attrs["Config"]["Env"])
    assert env["SEED"] == "42" and env["FGPU_FGPU"] == "1"
    # The name is taken while that session lives.
    again = preset_student.call("POST", "sessions", json={**IMAGE, "cpu": 0.5, "mem": "256M",
                                                   "name": "mnist"})  # fmt: skip
    assert again.status_code == 409, again.text
    assert "already have a live session named 'mnist'" in again.json()["message"]


@pytest.mark.parametrize(
    "body, status, fragment",
    [
        ({**IMAGE, "preset": "nope"}, 400, "Unknown preset 'nope'"),
        ({**IMAGE, "preset": "all GPUs"}, 400, "not available to you: Needs 8 fGPU"),
        ({**IMAGE, "preset": "CPU small", "cpu": 1}, 400, "leave out cpu"),
        ({**IMAGE, "cpu": 0.5, "mem": "256M", "name": "My Run"}, 400, "lowercase letters"),
        ({**IMAGE, "cpu": 0.5, "mem": "256M", "env": {"LD_PRELOAD": "x"}}, 400, "set by the hub"),
        ({**IMAGE, "cpu": 0.5, "mem": "256M", "env": {"CUDA_DEVICE_SM_LIMIT": "100"}}, 400,
         "set by the hub"),
        ({**IMAGE, "cpu": 0.5, "mem": "256M", "env": {"A": "x" * 9000}}, 400, "at most 8192"),
        ({**IMAGE, "cpu": 0.5, "mem": "256M", "env": "A=1"}, 400, "must be an object"),
    ],
)  # fmt: skip
def test_a_bad_launch_option_is_refused_and_leaves_nothing(preset_hub, preset_student, body, status,
                                                             fragment):  # fmt: skip
    response = preset_student.call("POST", "sessions", json=body)
    assert response.status_code == status, response.text
    assert fragment in response.json()["message"]
    nothing_left(preset_hub, preset_student.name)


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({**IMAGE, "preset": "all GPUs"}, "not available to you"),
        ({**IMAGE, "name": "other"}, "differs from server 'mine'"),
        ({**IMAGE, "env": {"NVIDIA_VISIBLE_DEVICES": "all"}}, "set by the hub"),
    ],
)
def test_the_hubs_own_start_refuses_the_same_and_leaves_nothing(preset_hub, preset_student, body,
                                                                 fragment):  # fmt: skip
    response = preset_hub.start_server(preset_student.name, body, server="mine")
    assert response.status_code == 400, response.text
    assert fragment in response.json()["message"]
    with contextlib.closing(sqlite3.connect(preset_hub.workdir / "fgpu_queue.sqlite")) as db:
        rows = db.execute(
            "SELECT id FROM sessions WHERE user = ?", (preset_student.name,)
        ).fetchall()
    assert rows == []
    assert containers_with({"fgpu.user": preset_student.name}) == []


def test_the_hubs_own_start_takes_a_preset_and_env(preset_hub, preset_student):
    body = {**IMAGE, "preset": "CPU small", "env": {"SEED": "7"}}
    response = preset_hub.start_server(preset_student.name, body, server="lab")
    assert response.status_code in (201, 202), response.text
    (session,) = preset_student.wait_for(
        lambda s: [x["status"] for x in s] == ["RUNNING"], timeout=180
    )
    assert (session["server_name"], session["cpu"], session["mem"]) == ("lab", 0.5, 256 * 1024**2)
    (container,) = containers_with({"fgpu.user": preset_student.name})
    assert "SEED=7" in container.attrs["Config"]["Env"]


def test_a_start_with_no_options_as_the_admin_panel_sends_gets_the_defaults(
    preset_hub, preset_student
):
    """The admin panel's Start button and `POST /hub/api/users/NAME/server` with no body: the
    user's default image (the first the catalog offers them), the smallest preset they may use
    that holds no GPU ("CPU small"), and no GPU."""
    preset_hub.create_user(preset_student.name)
    response = preset_hub.request("POST", f"users/{preset_student.name}/server")
    assert response.status_code in (201, 202), response.text
    preset_hub.wait_ready(preset_student.name, timeout=180)
    (session,) = preset_student.sessions()
    assert (session["image"], session["cpu"], session["mem"], session["fgpu"]) == (
        "python-3.11",
        0.5,
        256 * 1024**2,
        0,
    )
    assert session["grant"]["gpus"] == {}


def test_a_launch_from_the_sessions_api_that_names_nothing_gets_the_same_defaults(
    preset_hub, preset_student
):
    """The same rule on the service's `POST api/sessions` (one rule: launch_options.with_defaults)."""
    response = preset_student.call("POST", "sessions", json={"name": "quick"})
    assert response.status_code == 201, response.text
    (session,) = preset_student.wait_for(
        lambda s: [x["status"] for x in s] == ["RUNNING"], timeout=180
    )
    assert (session["server_name"], session["image"], session["cpu"], session["mem"]) == (
        "quick",
        "python-3.11",
        0.5,
        256 * 1024**2,
    )
    assert session["fgpu"] == 0


# -- the Sessions page's dialog, in Chromium --------------------------------------------------


def test_the_dialog_offers_presets_a_name_env_and_the_recent_launches(preset_hub, pages):
    page = pages()
    name = f"web-{secrets.token_hex(3)}"
    log_in(page, preset_hub, name)
    page.goto(preset_hub.url + SESSIONS_PAGE)
    page.click("#fgpu-start")
    expect(page.locator('#fgpu-launch-preset-list [data-preset="half GPU"]')).to_be_visible()
    # The dialog is taller than the window: its foot, Launch included, stays in sight.
    viewport = page.viewport_size["height"]
    assert page.evaluate("document.getElementById('fgpu-launch').scrollHeight") > viewport
    launch_button = page.locator("#fgpu-launch-submit").bounding_box()
    assert launch_button["y"] + launch_button["height"] <= viewport, launch_button
    # The sliders start at the spawner's defaults (one session's limits from one place).
    assert page.input_value("#fgpu-launch-mem") == "2"
    assert page.get_attribute("#fgpu-launch-fgpu", "max") == "2"  # 1 GPU × 2 units, not 4
    unavailable = page.locator('[data-preset="all GPUs"]')
    assert unavailable.locator("input").is_disabled()
    expect(unavailable).to_contain_text("Not available: Needs 8 fGPU")
    page.check('input[name=preset][value="half GPU"]')
    assert page.locator("#fgpu-launch-cpu").is_disabled()
    page.fill("#fgpu-launch-name", "mnist")
    page.fill("#fgpu-launch-env", "SEED=42\nEPOCHS=3")
    screenshot(page, "launcher-dialog-presets-name-env")
    page.click("#fgpu-launch-submit")
    expect(page.locator("#fgpu-launch")).to_be_hidden(timeout=SPAWN_TIMEOUT_MS)
    expect(rows(page, "RUNNING")).to_have_count(1, timeout=SPAWN_TIMEOUT_MS)
    expect(rows(page).first).to_contain_text("mnist")
    page.click("#fgpu-start")
    recent = page.locator("#fgpu-launch-recent .fgpu-relaunch")
    expect(recent).to_have_count(1)
    expect(recent.first).to_contain_text("python-3.11 · preset half GPU · named mnist · 2 env")
    screenshot(page, "launcher-dialog-recent")
    # A bad value answers in the dialog with the service's message.
    page.check("#fgpu-launch-preset-custom")
    page.fill("#fgpu-launch-env", "LD_PRELOAD=/x.so")
    page.fill("#fgpu-launch-name", "")
    page.click("#fgpu-launch-submit")
    expect(page.locator("#fgpu-launch-error")).to_contain_text("LD_PRELOAD is set by the hub")
    screenshot(page, "launcher-dialog-refused-env")
    page.click("#fgpu-launch-cancel")
    preset_hub.stop_servers({(name, "mnist")}, timeout=120)
