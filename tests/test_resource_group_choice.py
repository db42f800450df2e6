"""Picking a resource group (Backend.AI's scaling group) on the spawn form, through the hub's REST
API and in the Sessions page's launch dialog: a real hub, the real service with three groups on
this host (`grouped_hub`, tests/grouped_service.py), real containers, Debian's Chromium.

The users of that hub may use `default` (the engine's node, 2 fGPU) and `gpu-a100` (4 fGPU), not
`restricted`.
"""

from __future__ import annotations

import re
import secrets

import pytest
import requests
from playwright.sync_api import Page, expect

from fgpu_spawner.resource_groups import offered_groups

from .browser import SESSIONS_PAGE, SPAWN_TIMEOUT_MS, log_in, screenshot
from .harness import QueueUser, containers_with, hub_xsrf, logged_in
from .test_queue_service import join_group_with_quota

pytestmark = [pytest.mark.docker, pytest.mark.hub]
OPTIONS = {"image": "python-3.11", "cpu": 0.5, "mem": "512M"}


@pytest.fixture
def student(grouped_hub):
    """A fresh student with a token; their servers are stopped after the test."""
    student = QueueUser(grouped_hub, f"student-{secrets.token_hex(4)}")
    yield student
    model = grouped_hub.request("GET", f"users/{student.name}").json()
    for server in model["servers"]:
        grouped_hub.stop_server(student.name, server)
    student.wait_for(lambda s: s == [], timeout=120)


def labels_for(student: QueueUser) -> list[str]:
    """The groups and free figures the form should offer, from what the service says now."""
    response = student.call("GET", "resources")
    assert response.status_code == 200, response.text
    return [offer.label for offer in offered_groups(response.json())]


def assert_nothing_left(hub, student: QueueUser) -> None:
    assert hub.server_model(student.name) is None
    assert containers_with({"fgpu.user": student.name}) == []
    assert student.sessions() == []


def as_spawner(hub) -> requests.Session:
    """The spawner's own identity (the hub service whose token it holds), as it calls the service."""
    http = requests.Session()
    http.headers["Authorization"] = f"token {hub.spawner_token}"
    return http


def test_the_service_tells_the_spawner_which_groups_a_user_may_use(grouped_hub, student):
    spawner, api = as_spawner(grouped_hub), f"{grouped_hub.url}/services/queue/api"
    response = spawner.get(f"{api}/resources?user={student.name}", timeout=60)
    assert response.status_code == 200, response.text
    groups = response.json()["resource_groups"]
    assert {name: g["allowed"] for name, g in groups.items()} == {
        "default": True,
        "gpu-a100": True,
        "restricted": False,
    }
    assert groups["gpu-a100"]["capacity"]["fgpu"] == 4
    assert "nodes" not in response.json()
    # The student's own view is the same figures.
    assert student.call("GET", "resources").json()["resource_groups"] == groups
    refused = spawner.get(f"{api}/resources", timeout=60)
    assert refused.status_code == 400, refused.text
    assert "?user=NAME" in refused.json()["message"]


def test_the_rest_api_refuses_a_group_the_user_may_not_use_and_leaves_nothing(grouped_hub, student):
    forbidden = grouped_hub.start_server(student.name, {**OPTIONS, "resource_group": "restricted"})
    assert forbidden.status_code == 403, forbidden.text
    message = forbidden.json()["message"]
    assert "You may not use resource group 'restricted'" in message
    assert "You may use: default, gpu-a100." in message
    unknown = grouped_hub.start_server(student.name, {**OPTIONS, "resource_group": "mars"})
    assert unknown.status_code == 400, unknown.text
    assert "There is no resource group 'mars'" in unknown.json()["message"]
    named = grouped_hub.start_server(
        student.name, {**OPTIONS, "resource_group": "restricted"}, server="named"
    )
    assert named.status_code == 403, named.text
    assert grouped_hub.server_model(student.name, "named") is None
    assert_nothing_left(grouped_hub, student)


def test_the_rest_api_starts_in_the_named_group_on_its_node(grouped_hub, student):
    started = grouped_hub.start_server(
        student.name, {**OPTIONS, "fgpu": 1, "resource_group": "gpu-a100"}
    )
    assert started.status_code in (201, 202), started.text
    grouped_hub.wait_ready(student.name)
    (session,) = student.sessions()
    assert session["grant"]["node"] == "a100-1"
    assert set(session["grant"]["gpus"]) <= {"GPU-sim-a100-1-0", "GPU-sim-a100-1-1"}
    (container,) = containers_with({"fgpu.user": student.name})
    assert container.labels["fgpu.session_id"] == session["id"]


def test_the_form_refuses_a_group_the_user_may_not_use(grouped_hub, student):
    browser = logged_in(grouped_hub, student.name)
    form = browser.get(f"{grouped_hub.url}/hub/spawn/{student.name}", timeout=60)
    assert form.status_code == 200, form.text
    posted = browser.post(
        f"{grouped_hub.url}/hub/spawn/{student.name}",
        data={**OPTIONS, "resource_group": "restricted", "_xsrf": hub_xsrf(browser)},
        timeout=120,
    )
    assert posted.status_code == 403, posted.text[-2000:]
    assert "You may not use resource group &#39;restricted&#39;" in posted.text
    # The form comes back, with the groups the student may use.
    assert 'name="resource_group"' in posted.text
    assert_nothing_left(grouped_hub, student)


def test_a_student_limited_to_one_group_sees_it_named_not_offered(grouped_hub, student):
    join_group_with_quota(grouped_hub, student.name, {"resource_groups": ["default"]})
    browser = logged_in(grouped_hub, student.name)
    form = browser.get(f"{grouped_hub.url}/hub/spawn/{student.name}", timeout=60)
    assert form.status_code == 200, form.text
    page = form.content.decode()
    assert 'name="resource_group"' not in page
    line = re.search(r'id="fgpu-group-line">([^<]*)<', page).group(1)
    assert line.startswith("default — ") and line.endswith(" GiB free")
    refused = grouped_hub.start_server(student.name, {**OPTIONS, "resource_group": "gpu-a100"})
    assert refused.status_code == 403, refused.text
    assert "You may use: default." in refused.json()["message"]
    assert_nothing_left(grouped_hub, student)


# -- in Chromium -----------------------------------------------------------------------------


@pytest.mark.browser
def test_browser_the_spawn_form_offers_the_groups_with_what_is_free_and_starts_in_the_pick(
    grouped_hub, student, pages
):
    page: Page = pages()
    log_in(page, grouped_hub, student.name)
    page.goto(f"{grouped_hub.url}/hub/spawn/{student.name}")
    select = page.locator("select#fgpu-group[name=resource_group]")
    expect(select).to_be_visible()
    options = select.locator("option")
    expect(options).to_have_count(2)
    assert [o.inner_text().strip() for o in options.all()] == labels_for(student)
    assert [o.get_attribute("value") for o in options.all()] == ["default", "gpu-a100"]
    expect(select).to_have_value("default")
    assert re.fullmatch(
        r"gpu-a100 — 4 fGPU, [\d.]+ CPU, [\d.]+ (B|KiB|MiB|GiB|TiB) free", labels_for(student)[1]
    )

    # The indicator above the form shows the picked group in its upper bars.
    caption = page.frame_locator("#fgpu-indicator-frame").locator(".fgpu-indicator-caption")
    expect(caption).to_contain_text("Upper: in resource group default.")
    page.select_option("#fgpu-group", "gpu-a100")
    expect(caption).to_contain_text("Upper: in resource group gpu-a100.")
    fgpu_bar = page.frame_locator("#fgpu-indicator-frame").locator(
        '.fgpu-indicator-slot[data-slot="fgpu"] .fgpu-bar-upper'
    )
    expect(fgpu_bar).to_have_attribute("data-total", "4")
    page.select_option("#fgpu-image", "python-3.11")
    page.fill("#fgpu-cpu", "0.5")
    page.fill("#fgpu-mem", "512M")
    page.fill("#fgpu-fgpu", "1.5")
    screenshot(page, "spawn-form-resource-groups")
    page.click("#spawn_form button[type=submit]")
    page.wait_for_url(re.compile(rf"/user/{student.name}/"), timeout=SPAWN_TIMEOUT_MS)
    grouped_hub.wait_ready(student.name)
    (session,) = student.sessions()
    assert (session["grant"]["node"], session["fgpu"]) == ("a100-1", 1.5)

    # The form remembers the pick, and what is free there now counts the new session.
    grouped_hub.stop_server(student.name)
    page.goto(f"{grouped_hub.url}/hub/spawn/{student.name}")
    expect(page.locator("select#fgpu-group")).to_have_value("gpu-a100")


@pytest.mark.browser
def test_browser_the_launch_dialog_offers_the_groups_and_launches_in_the_pick(
    grouped_hub, student, pages
):
    page: Page = pages()
    log_in(page, grouped_hub, student.name)
    page.goto(f"{grouped_hub.url}{SESSIONS_PAGE}")
    expect(page.locator("#fgpu-indicator[data-ready]")).to_be_attached()
    page.click("#fgpu-start")
    expect(page.locator("#fgpu-launch")).to_be_visible()
    select = page.locator("#fgpu-launch-group")
    expect(select).to_be_visible()
    expect(select.locator("option")).to_have_count(2)
    expected = labels_for(student)
    assert [o.inner_text().strip() for o in select.locator("option").all()] == expected
    free = page.locator("#fgpu-launch-free")
    expect(free).to_contain_text("Free on the cluster in default:")
    expect(free).to_contain_text("2 fGPU")

    # The free figures follow the group picked.
    page.select_option("#fgpu-launch-group", "gpu-a100")
    expect(free).to_contain_text("Free on the cluster in gpu-a100:")
    expect(free).to_contain_text("4 fGPU")
    # 3 fGPU fits no node of default (one GPU: 2 fGPU) but fits gpu-a100's.
    page.select_option("#fgpu-launch-image", "python-3.11")
    page.fill("#fgpu-launch-cpu", "0.5")
    page.fill("#fgpu-launch-mem", "0.5")
    page.fill("#fgpu-launch-fgpu", "3")
    expect(page.locator("#fgpu-launch-warning")).to_be_hidden()
    screenshot(page, "launch-dialog-resource-groups")
    with page.expect_response(
        lambda r: r.request.method == "POST" and r.url.endswith("/api/sessions")
    ) as posted:
        page.click("#fgpu-launch-submit")
    assert posted.value.request.post_data_json["resource_group"] == "gpu-a100"
    assert posted.value.status == 201, posted.value.text()
    expect(page.locator("#fgpu-launch")).to_be_hidden(timeout=SPAWN_TIMEOUT_MS)
    (session,) = student.wait_for(lambda s: len(s) == 1 and s[0]["status"] == "RUNNING")
    assert (session["grant"]["node"], session["fgpu"]) == ("a100-1", 3)
    screenshot(page, "launch-dialog-resource-groups-running")
