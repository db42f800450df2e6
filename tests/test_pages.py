"""The queue service's pages in a real browser: Debian's Chromium, driven by Playwright, against a
real hub, the real service and real containers, with one simulated GPU holding 2 fGPU (the seed's).

The run's shared GPU hub (`gpu_hub`, tests/conftest.py) serves the module, empty when it starts.
The tests follow the seed's walk-throughs as a student would, on the pages alone: the Sessions
page, its launch dialog and resource indicator, the app launcher, the spawn-pending page, and the
admin's cluster view. Screenshots go to test-output/browser/pages-*.
"""

from __future__ import annotations

import re
import secrets
import time

import pytest
import requests
from playwright.sync_api import Page, expect

from queue_service.handlers.pages import JUPYTERHUB_TEMPLATES, page_namespace, template_environment

from .browser import (
    SESSIONS_PAGE,
    SPAWN_TIMEOUT_MS,
    end_with_confirmation,
    launch,
    log_in,
    rows,
    screenshot,
    submit_launch,
)
from .harness import QueueUser

pytestmark = [pytest.mark.docker, pytest.mark.hub, pytest.mark.browser]

GIB = 1024**3
SLOTS = ("cpu", "mem", "fgpu")
SMALL = {"image": "python-3.11", "cpu": 0.5, "mem": "256M"}


def open_sessions(page: Page, hub) -> None:
    """Through the hub's navigation bar, as a student finds it."""
    page.goto(f"{hub.url}/hub/home")
    page.click("#fgpu-nav-sessions")
    expect(page.locator("h1", has_text="Sessions")).to_be_visible()
    expect(page.locator("#fgpu-indicator[data-ready]")).to_be_attached()


def indicator(scope) -> dict:
    """Each slot's two bars as numbers: {slot: {"upper": (used, total), "lower": (used, total)}}."""
    figures = {}
    for slot in SLOTS:
        bars = scope.locator(f'.fgpu-indicator-slot[data-slot="{slot}"]')
        figures[slot] = {
            kind: tuple(
                float(bars.locator(f".fgpu-bar-{kind}").get_attribute(attr))
                for attr in ("data-used", "data-total")
            )
            for kind in ("upper", "lower")
        }
    return figures


def wait_for_indicator(scope, expected_used: dict, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        figures = indicator(scope)
        used = {slot: figures[slot]["upper"][0] for slot in SLOTS}
        if (
            all(abs(used[s] - expected_used[s]) < 1e-6 for s in SLOTS)
            or time.monotonic() > deadline
        ):
            return figures
        time.sleep(0.3)


# -- the templates, rendered without a hub -----------------------------------------------------


def render(name: str, person: dict | None, **extra) -> str:
    namespace = page_namespace(person, "/", "/services/queue/")
    return template_environment().get_template(name).render(**namespace, **extra)


def test_service_pages_extend_jupyterhubs_page_with_our_nav_links():
    config = {"api": "/services/queue/api/", "images": []}
    student = render("sessions.html", {"name": "ann"}, page_config=config)
    # JupyterHub's own page: its logo, its stylesheet from the hub's static files, its nav bar.
    assert 'id="jupyterhub-logo"' in student
    assert 'href="/hub/static/css/style.min.css"' in student
    assert 'href="/hub/home"' in student
    # Ours: the Sessions link, our script and stylesheet, the page's config as JSON.
    assert 'id="fgpu-nav-sessions" href="/services/queue/"' in student
    assert 'src="/services/queue/static/sessions.js"' in student
    assert '"api": "/services/queue/api/"' in student
    assert "fgpu-nav-cluster" not in student and "fgpu-user-filter" not in student
    admin = render("sessions.html", {"name": "root", "admin": True}, page_config=config)
    assert 'href="/services/queue/cluster"' in admin and 'id="fgpu-user-filter"' in admin
    assert 'href="/hub/admin"' in admin


def test_templates_prefix_always_names_jupyterhubs_original():
    env = template_environment()
    original = env.get_template("templates/page.html")
    assert original.filename == str(JUPYTERHUB_TEMPLATES / "page.html")
    assert env.get_template("page.html").filename.endswith("templates/hub/page.html")


def test_error_page_is_the_hubs_error_page_and_escapes_the_message():
    html = render(
        "error.html",
        {"name": "ann"},
        status_code=404,
        status_message="Not Found",
        message="No page <script>",
    )
    assert "<h1>404 : Not Found</h1>" in html
    assert "No page &lt;script&gt;" in html


# -- errors -------------------------------------------------------------------------------------


def test_errors_are_json_for_api_clients_and_html_pages_for_browsers(gpu_hub, pages):
    student = QueueUser(gpu_hub, f"erin-{secrets.token_hex(3)}")
    for path, status in [("api/no-such-thing", 404), ("api/sessions/0123abcd", 404)]:
        method = "DELETE" if "sessions/" in path else "GET"
        response = student.http.request(method, f"{gpu_hub.url}{SESSIONS_PAGE}{path}", timeout=30)
        assert response.status_code == status, response.text
        assert response.headers["Content-Type"].startswith("application/json")
        assert response.json()["status"] == status and response.json()["message"]
    anonymous = requests.get(f"{gpu_hub.url}{SESSIONS_PAGE}api/sessions", timeout=30)
    assert anonymous.status_code == 401
    assert anonymous.json()["message"] == "Log in to the hub first."

    page = pages()
    log_in(page, gpu_hub, student.name)
    response = page.goto(f"{gpu_hub.url}{SESSIONS_PAGE}cluster")
    assert response.status == 403
    assert response.headers["content-type"].startswith("text/html")
    expect(page.locator(".error h1")).to_have_text("403 : Forbidden")
    expect(page.locator(".error")).to_contain_text("The cluster view needs the admin:servers scope")
    # The hub's own page: its stylesheet, its nav bar, and our Sessions link in it.
    expect(page.locator("#fgpu-nav-sessions")).to_be_visible()
    assert page.evaluate("getComputedStyle(document.body).fontFamily") != "Times New Roman"
    screenshot(page, "pages-error-403")

    response = page.goto(f"{gpu_hub.url}{SESSIONS_PAGE}no-such-page")
    assert response.status == 404
    expect(page.locator(".error h1")).to_have_text("404 : Not Found")
    response = page.goto(f"{gpu_hub.url}{SESSIONS_PAGE}api/no-such-thing")
    assert response.status == 404
    assert response.headers["content-type"].startswith("application/json")


# -- seed walk-through A: the indicator ---------------------------------------------------------


def test_walkthrough_a_indicator_rises_and_falls_by_exactly_the_session(gpu_hub, pages):
    name = f"amy-{secrets.token_hex(3)}"
    page = pages()
    log_in(page, gpu_hub, name)

    # The hub's home page shows the indicator too.
    page.goto(f"{gpu_hub.url}/hub/home")
    home_frame = page.frame_locator("#fgpu-indicator-frame")
    expect(home_frame.locator("#fgpu-indicator[data-ready]")).to_be_attached()
    expect(page.locator("#fgpu-nav-cluster")).to_have_count(0)

    open_sessions(page, gpu_hub)
    before = indicator(page)
    assert before["fgpu"]["upper"] == (0.0, 2.0), before
    assert before["fgpu"]["lower"] == (0.0, 2.0), before
    screenshot(page, "pages-walkthrough-a-before")

    launch(page, "python-3.11", cpu=1, mem_gib=1, fgpu=0.5, count=1)
    expect(page.locator("#fgpu-launch-warning")).to_be_hidden()
    expect(page.locator("#fgpu-launch-free")).to_contain_text("2 fGPU")
    screenshot(page, "pages-walkthrough-a-dialog")
    submit_launch(page)
    expect(rows(page, "RUNNING")).to_have_count(1, timeout=SPAWN_TIMEOUT_MS)

    amount = {"cpu": 1.0, "mem": float(GIB), "fgpu": 0.5}
    expected = {s: before[s]["upper"][0] + amount[s] for s in SLOTS}
    after = wait_for_indicator(page, expected)
    for slot in SLOTS:
        for kind in ("upper", "lower"):
            used, total = after[slot][kind]
            assert used == pytest.approx(before[slot][kind][0] + amount[slot]), (slot, kind, after)
            # The whole a student could hold does not change: only the used part moves.
            assert total == pytest.approx(before[slot][kind][1]), (slot, kind, after)
    row = rows(page, "RUNNING").first
    expect(row).to_contain_text("python-3.11")
    expect(row).to_contain_text("1 GiB")
    expect(row).to_contain_text("0.5 (simulated)")
    expect(page.locator(".fgpu-indicator-caption")).to_contain_text("simulated")
    # Live usage, from the service's stats sampler (one docker stats round every few seconds).
    expect(row.locator(".fgpu-usage")).to_contain_text(re.compile(r"RAM \d"), timeout=30_000)
    screenshot(page, "pages-walkthrough-a-created")

    # The same figures on the home page and on the spawn form.
    for url in (f"{gpu_hub.url}/hub/home", f"{gpu_hub.url}/hub/spawn/{name}/other"):
        other = pages()
        other.context.add_cookies(page.context.cookies())
        other.goto(url)
        frame = other.frame_locator("#fgpu-indicator-frame")
        expect(frame.locator("#fgpu-indicator[data-ready]")).to_be_attached()
        assert indicator(frame) == after, url
        if "/spawn/" in url:  # the form points to where the rest is started
            elsewhere = other.locator("#fgpu-spawn-elsewhere a")
            expect(elsewhere).to_have_attribute("href", "/services/queue/sessions")
    screenshot(other, "pages-spawn-form-indicator")

    end_with_confirmation(page, page.locator("#fgpu-sessions .fgpu-stop").first)
    expect(rows(page)).to_have_count(0, timeout=60_000)
    restored = wait_for_indicator(page, {s: before[s]["upper"][0] for s in SLOTS})
    assert restored == before
    screenshot(page, "pages-walkthrough-a-destroyed")


# -- seed walk-through B: three at 1 fGPU on 2 fGPU -----------------------------------------------


@pytest.fixture(scope="module")
def bob(gpu_hub):
    return QueueUser(gpu_hub, f"bob-{secrets.token_hex(3)}")


def test_walkthrough_b_pending_row_turns_running_without_a_reload(gpu_hub, pages, bob):
    page = pages()
    log_in(page, gpu_hub, bob.name)
    open_sessions(page, gpu_hub)
    launch(page, "python-3.11", cpu=0.5, mem_gib=0.5, fgpu=1, count=3)
    # The dialog says beforehand that one of the three will wait.
    warning = page.locator("#fgpu-launch-warning")
    expect(warning).to_be_visible()
    expect(warning).to_have_attribute("data-kind", "wait")
    expect(warning).to_contain_text("2 will start now; 1 will wait")
    screenshot(page, "pages-walkthrough-b-dialog")
    page.evaluate("window.fgpuNoReload = true")
    submit_launch(page)

    expect(rows(page, "RUNNING")).to_have_count(2, timeout=SPAWN_TIMEOUT_MS)
    pending = rows(page, "PENDING")
    expect(pending).to_have_count(1)
    expect(pending.locator(".fgpu-position")).to_have_text("1st in line")
    expect(pending.locator(".fgpu-reason")).to_contain_text("fGPU")
    screenshot(page, "pages-walkthrough-b-pending")

    # The hub's spawn-pending page of the waiting server shows the same place in line.
    waiting_server = next(s for s in bob.sessions() if s["status"] == "PENDING")["server_name"]
    spawn_page = pages()
    spawn_page.context.add_cookies(page.context.cookies())
    spawn_page.goto(f"{gpu_hub.url}/hub/spawn-pending/{bob.name}/{waiting_server}")
    expect(spawn_page.locator("#fgpu-queue-position")).to_have_text("In the queue: 1st in line")
    expect(spawn_page.locator("#fgpu-queue-reason")).to_contain_text("fGPU")
    screenshot(spawn_page, "pages-spawn-pending")
    spawn_page.context.close()

    end_with_confirmation(page, rows(page, "RUNNING").first.locator(".fgpu-stop"))
    expect(rows(page, "PENDING")).to_have_count(0, timeout=SPAWN_TIMEOUT_MS)
    expect(rows(page, "RUNNING")).to_have_count(2, timeout=SPAWN_TIMEOUT_MS)
    assert page.evaluate("window.fgpuNoReload") is True
    screenshot(page, "pages-walkthrough-b-promoted")


@pytest.fixture
def bob_running(gpu_hub, bob) -> list[dict]:
    """Bob's running sessions (walk-through B leaves two; started here if it did not)."""
    running = [s for s in bob.sessions() if s["status"] == "RUNNING"]
    if not running:
        server = f"s-{secrets.token_hex(3)}"
        options = {"image": "python-3.11", "cpu": 0.5, "mem": "512M", "fgpu": 1}
        response = gpu_hub.start_server(bob.name, options, server)
        assert response.status_code in (201, 202), response.text
        gpu_hub.wait_ready(bob.name, server)
        deadline = time.monotonic() + 60
        while not running and time.monotonic() < deadline:
            running = [s for s in bob.sessions() if s["status"] == "RUNNING"]
            time.sleep(0.3)
    assert running
    return running


# -- who sees what ------------------------------------------------------------------------------


def test_a_student_never_sees_anothers_session_and_an_admin_sees_all(
    gpu_hub, pages, bob, bob_running
):
    carol = QueueUser(gpu_hub, f"carol-{secrets.token_hex(3)}")
    assert [s for s in carol.sessions() if s["user"] == bob.name] == []
    page = pages()
    log_in(page, gpu_hub, carol.name)
    open_sessions(page, gpu_hub)
    expect(page.locator("#fgpu-sessions[data-updated]")).to_be_attached()
    expect(rows(page)).to_have_count(0)
    expect(page.locator("#fgpu-empty")).to_be_visible()
    expect(page.locator("#fgpu-user-filter")).to_have_count(0)
    assert bob.name not in page.content()

    admin = pages()
    log_in(admin, gpu_hub, "admin")
    open_sessions(admin, gpu_hub)
    bobs = admin.locator(f'#fgpu-sessions tbody tr[data-user="{bob.name}"]')
    expect(bobs).to_have_count(len(bob_running))
    # The user filter shows one user's rows only.
    admin.select_option("#fgpu-user-filter", bob.name)
    expect(rows(admin)).to_have_count(len(bob_running))
    screenshot(admin, "pages-admin-sessions")


def test_cluster_view_draws_each_gpu_slice_with_its_holder(gpu_hub, pages, bob, bob_running):
    admin = pages()
    log_in(admin, gpu_hub, "admin")
    admin.goto(f"{gpu_hub.url}/hub/home")
    admin.click("#fgpu-nav-cluster")
    strip = admin.locator(".fgpu-gpu").first
    holders = strip.locator(f'.fgpu-gpu-hold[data-user="{bob.name}"]')
    expect(holders).to_have_count(len(bob_running))
    # 2 fGPU per GPU: one dashed line between the two slices, each held by one of Bob's sessions.
    expect(strip.locator(".fgpu-gpu-slice-line")).to_have_count(1)
    expect(holders.first).to_contain_text(f"{bob.name} 1 fGPU")
    expect(admin.locator(f'#fgpu-user-quotas tr[data-user="{bob.name}"]')).to_contain_text(
        f"{len(bob_running)}"
    )
    screenshot(admin, "pages-cluster")


def test_a_pending_request_is_in_the_admins_queue_and_its_owner_cancels_it(
    gpu_hub, pages, bob, bob_running, docker_engine
):
    # Bob's sessions hold both fGPU, so one more waits: no container, a place in line.
    taken = sum(s["fgpu"] for s in bob.sessions() if s["status"] == "RUNNING")
    assert taken == 2, bob.sessions()
    server = f"s-{secrets.token_hex(3)}"
    options = {"image": "python-3.11", "cpu": 0.5, "mem": "512M", "fgpu": 1}
    response = gpu_hub.start_server(bob.name, options, server)
    assert response.status_code == 202, response.text

    admin = pages()
    log_in(admin, gpu_hub, "admin")
    admin.goto(f"{gpu_hub.url}{SESSIONS_PAGE}cluster")
    queued = admin.locator("#fgpu-queue tbody tr")
    expect(queued).to_have_count(1)
    expect(queued.first).to_contain_text(bob.name)
    expect(queued.first.locator("td").first).to_have_text("1")
    screenshot(admin, "pages-cluster-queue")

    page = pages()
    log_in(page, gpu_hub, bob.name)
    open_sessions(page, gpu_hub)
    pending = rows(page, "PENDING")
    expect(pending).to_have_count(1)
    # Cancel asks first, saying the place in the queue is given up; "Keep waiting" keeps it.
    pending.locator(".fgpu-cancel").click()
    dialog = page.locator("#fgpu-confirm")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("gives up its place in the queue (1st in line)")
    expect(page.locator("#fgpu-confirm-go")).to_have_text("Cancel request")
    screenshot(page, "pages-confirm-cancel")
    page.click("#fgpu-confirm-keep")
    expect(dialog).to_be_hidden()
    time.sleep(3)  # a poll round or more: a cancel sent anyway would show by now
    expect(rows(page, "PENDING")).to_have_count(1)
    assert [s["status"] for s in bob.sessions() if s["server_name"] == server] == ["PENDING"]
    end_with_confirmation(page, pending.locator(".fgpu-cancel"))
    expect(rows(page, "PENDING")).to_have_count(0, timeout=30_000)
    expect(rows(page, "RUNNING")).to_have_count(len(bob_running))
    expect(queued).to_have_count(0, timeout=30_000)
    assert [s for s in bob.sessions() if s["server_name"] == server] == []
    labels = {"label": [f"fgpu.user={bob.name}"]}
    assert len(docker_engine.containers.list(all=True, filters=labels)) == len(bob_running)
    # The hub's waiting spawn ends by itself.
    deadline = time.monotonic() + 30
    while (model := gpu_hub.server_model(bob.name, server)) and model["pending"]:
        assert time.monotonic() < deadline, model
        time.sleep(0.3)


# -- the app launcher ---------------------------------------------------------------------------


def test_app_launcher_opens_each_app_through_the_proxy(gpu_hub, pages, bob, bob_running):
    page = pages()
    log_in(page, gpu_hub, bob.name)
    open_sessions(page, gpu_hub)
    row = rows(page, "RUNNING").first
    expect(row.locator(".fgpu-app")).to_have_count(4)
    server = row.get_attribute("data-session")
    assert server
    checks = {
        "JupyterLab": ("/lab", ".jp-LabShell"),
        "Notebook": ("/tree", "#main-panel, .jp-NotebookApp, #top-panel"),
        "Terminal": ("/terminals/1", ".xterm, .jp-Terminal"),
        "TensorBoard": ("/tensorboard/", "body"),
    }
    for app, (path, selector) in checks.items():
        with page.context.expect_page() as opened:
            row.locator(f'.fgpu-app[data-app="{app}"]').click()
        tab = opened.value
        tab.wait_for_load_state("domcontentloaded", timeout=SPAWN_TIMEOUT_MS)
        assert path in tab.url, (app, tab.url)
        expect(tab.locator(selector).first).to_be_attached(timeout=SPAWN_TIMEOUT_MS)
        answer = page.context.request.get(tab.url, timeout=SPAWN_TIMEOUT_MS)
        assert answer.status == 200, (app, tab.url, answer.status)
        screenshot(tab, f"pages-app-{app.lower()}")
        tab.close()


def test_admin_stops_a_session_from_the_cluster_view(gpu_hub, pages, bob, bob_running):
    admin = pages()
    log_in(admin, gpu_hub, "admin")
    admin.goto(f"{gpu_hub.url}{SESSIONS_PAGE}cluster")
    target = bob_running[0]["id"]
    end_with_confirmation(
        admin,
        admin.locator(f'#fgpu-running tr[data-session="{target}"] .fgpu-end'),
        f"{bob.name}’s session",
    )
    expect(admin.locator(f'#fgpu-running tr[data-session="{target}"]')).to_have_count(
        0, timeout=60_000
    )
    assert target not in [s["id"] for s in bob.sessions()]


# -- a request that can never start ------------------------------------------------------------


def test_launch_dialog_warns_before_a_request_that_can_never_start(gpu_hub, pages, docker_engine):
    dave = QueueUser(gpu_hub, f"dave-{secrets.token_hex(3)}")
    group = f"one-fgpu-{secrets.token_hex(3)}"
    assert gpu_hub.request("POST", f"groups/{group}").status_code == 201
    quota = {"fgpu_quota": {"fgpu": 1}}
    assert gpu_hub.request("PUT", f"groups/{group}/properties", json=quota).status_code == 200
    members = {"users": [dave.name]}
    assert gpu_hub.request("POST", f"groups/{group}/users", json=members).status_code == 200

    page = pages()
    log_in(page, gpu_hub, dave.name)
    open_sessions(page, gpu_hub)
    launch(page, "python-3.11", cpu=0.5, mem_gib=0.5, fgpu=1.5, count=1)
    warning = page.locator("#fgpu-launch-warning")
    expect(warning).to_have_attribute("data-kind", "never")
    expect(warning).to_contain_text("your quota allows 1 fGPU")
    screenshot(page, "pages-launch-never")

    # Submitted anyway: the service refuses it with its own message, and nothing is left behind.
    page.click("#fgpu-launch-submit")
    error = page.locator("#fgpu-launch-error")
    expect(error).to_be_visible(timeout=60_000)
    expect(error).to_contain_text("quota")
    expect(page.locator("#fgpu-launch")).to_be_visible()
    assert dave.sessions() == []
    assert (
        docker_engine.containers.list(all=True, filters={"label": f"fgpu.user={dave.name}"}) == []
    )


# -- the Finished tab (history) ------------------------------------------------------------------


def test_finished_tab_lists_ended_sessions_with_their_reasons_and_admins_filter_it(gpu_hub, pages):
    fay, admin = QueueUser(gpu_hub, f"fay-{secrets.token_hex(3)}"), QueueUser(gpu_hub, "admin")
    response = fay.call("POST", "sessions", json={**SMALL, "count": 2})
    assert response.status_code == 201, response.text
    own, others = (s["session"]["id"] for s in response.json()["servers"])
    fay.wait_for(
        lambda sessions: [s["status"] for s in sessions] == ["RUNNING"] * 2,
        timeout=SPAWN_TIMEOUT_MS / 1000,
    )
    assert fay.call("DELETE", f"sessions/{own}").status_code == 200
    assert admin.call("DELETE", f"sessions/{others}").status_code == 200
    fay.wait_for(lambda sessions: sessions == [])

    page = pages()
    log_in(page, gpu_hub, fay.name)
    open_sessions(page, gpu_hub)
    page.click("#fgpu-tab-finished")
    finished = page.locator("#fgpu-finished tbody tr")
    expect(finished).to_have_count(2)
    expect(page.locator("#fgpu-sessions")).to_be_hidden()
    by_user = page.locator(f'#fgpu-finished tr[data-session="{own}"]')
    expect(by_user.locator(".fgpu-end-reason")).to_have_text("Stopped by the user")
    by_admin = page.locator(f'#fgpu-finished tr[data-session="{others}"]')
    expect(by_admin.locator(".fgpu-end-reason")).to_have_text("Stopped by an admin")
    expect(by_admin.locator(".fgpu-end-detail")).to_have_text("stopped by admin (an admin)")
    for row in (by_user, by_admin):
        expect(row.locator(".fgpu-duration")).to_have_text(re.compile(r"^\d+:\d\d:\d\d$"))
        expect(row.locator(".fgpu-ended")).not_to_have_text("—")
        expect(row).to_contain_text("256 MiB")
    assert page.locator("#fgpu-finished-user").count() == 0  # students filter by reason only
    screenshot(page, "pages-finished-student")

    page = pages()
    log_in(page, gpu_hub, "admin")
    open_sessions(page, gpu_hub)
    page.click("#fgpu-tab-finished")
    expect(page.locator("#fgpu-user-filter")).to_be_hidden()  # the Active tab's own
    page.fill("#fgpu-finished-user", fay.name)
    page.click("#fgpu-finished-apply")
    expect(page.locator(f'#fgpu-finished tbody tr[data-user="{fay.name}"]')).to_have_count(2)
    expect(page.locator("#fgpu-finished tbody tr")).to_have_count(2)
    page.select_option("#fgpu-finished-reason", "admin")
    expect(page.locator("#fgpu-finished tbody tr")).to_have_count(1)
    expect(page.locator(f'#fgpu-finished tr[data-session="{others}"]')).to_be_visible()
    screenshot(page, "pages-finished-admin")


def test_a_slow_answer_to_an_older_read_never_replaces_the_filtered_list(gpu_hub, pages):
    """The Finished tab's first read (everyone's, for an admin) answers after a filter applied
    meanwhile: only the latest read is shown. The old read is held back by the browser, as a
    loaded service would be slow to answer it."""
    fay, gil = (QueueUser(gpu_hub, f"{n}-{secrets.token_hex(3)}") for n in ("fay", "gil"))
    for user in (fay, gil):  # an ended session each: everyone's list holds both
        response = user.call("POST", "sessions", json={**SMALL, "count": 1})
        assert response.status_code == 201, response.text
        user.wait_for(lambda s: [x["status"] for x in s] == ["RUNNING"], timeout=180)
        assert user.call("DELETE", f"sessions/{user.sessions()[0]['id']}").status_code == 200
        user.wait_for(lambda sessions: sessions == [])
    page = pages()
    log_in(page, gpu_hub, "admin")
    open_sessions(page, gpu_hub)
    held = []

    def hold_everyones(route):
        held.append(route)  # answered only after the filtered read has been shown

    page.route(re.compile(r"/api/sessions\?finished=1&limit=\d+&offset=0$"), hold_everyones)
    page.click("#fgpu-tab-finished")
    page.fill("#fgpu-finished-user", fay.name)
    page.click("#fgpu-finished-apply")
    rows = page.locator("#fgpu-finished tbody tr")
    expect(rows).to_have_count(1)
    assert len(held) == 1
    held[0].continue_()
    page.wait_for_timeout(1000)  # the old answer arrives, and is dropped
    expect(rows).to_have_count(1)
    expect(page.locator(f'#fgpu-finished tbody tr[data-user="{fay.name}"]')).to_have_count(1)


# -- confirm before destroying, land where the work is, the details a student sees -----


def test_stop_asks_first_and_nothing_stops_until_confirmed(gpu_hub, pages):
    """Stop opens the page's own dialog, which says what is lost and what is kept; "Keep it
    running" and Esc leave the session running; only "Stop session" stops it. At 800 px the
    table scrolls inside its box, names stay on one line, and the buttons do not touch."""
    gus = QueueUser(gpu_hub, f"gus-{secrets.token_hex(3)}")
    response = gus.call("POST", "sessions", json={**SMALL, "count": 1})
    assert response.status_code == 201, response.text
    gus.wait_for(lambda s: [x["status"] for x in s] == ["RUNNING"], timeout=SPAWN_TIMEOUT_MS / 1000)
    server = gus.sessions()[0]["server_name"]

    page = pages()
    log_in(page, gpu_hub, gus.name)
    open_sessions(page, gpu_hub)
    stop = rows(page, "RUNNING").first.locator(".fgpu-stop")
    stop.click()
    dialog = page.locator("#fgpu-confirm")
    expect(dialog).to_be_visible()
    expect(dialog).to_have_attribute("aria-labelledby", "fgpu-confirm-title")
    expect(page.locator("#fgpu-confirm-title")).to_have_text(f"Stop “{server}”?")
    expect(dialog).to_contain_text("running kernels end")
    expect(dialog).to_contain_text("home folder (/home/jovyan) is kept")
    expect(dialog).to_contain_text("0.5 cores, 256 MiB memory go back")
    # The safe answer has the focus: Enter alone does not stop anything.
    assert page.evaluate("document.activeElement.id") == "fgpu-confirm-keep"
    screenshot(page, "pages-confirm-stop")
    page.click("#fgpu-confirm-keep")
    expect(dialog).to_be_hidden()
    stop.click()
    expect(dialog).to_be_visible()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    time.sleep(3)  # a poll round or more: a stop sent anyway would show by now
    assert [s["status"] for s in gus.sessions()] == ["RUNNING"]
    expect(rows(page, "RUNNING")).to_have_count(1)

    # 800 px wide: nothing scrolls sideways, the page nor the table's box: each row is a card
    # (pages.css, fgpu-stack; tests/test_narrow_pages.py).
    page.set_viewport_size({"width": 800, "height": 900})
    expect(page.locator("#fgpu-sessions[data-updated]")).to_be_attached()
    assert page.evaluate("document.documentElement.scrollWidth") <= 800
    wrap = page.locator("#fgpu-active-pane .fgpu-table-wrap")
    assert wrap.evaluate("e => e.scrollWidth <= e.clientWidth + 1")
    expect(page.locator("#fgpu-sessions thead")).to_be_hidden()
    # The session's name and image each on one line ("s-/99b9b4" no more).
    for cell in rows(page, "RUNNING").first.locator("td.fgpu-name span").all():
        line = cell.evaluate("e => parseFloat(getComputedStyle(e).lineHeight)")
        assert cell.bounding_box()["height"] < 1.5 * line, cell.text_content()
    screenshot(page, "pages-sessions-800px")
    page.set_viewport_size({"width": 1400, "height": 950})

    end_with_confirmation(page, stop, "Stop session")
    expect(rows(page)).to_have_count(0, timeout=60_000)
    assert gus.sessions() == []


def test_admins_save_image_and_stop_buttons_do_not_touch(gpu_hub, pages, bob, bob_running):
    admin = pages()
    log_in(admin, gpu_hub, "admin")
    open_sessions(admin, gpu_hub)
    row = admin.locator(f'#fgpu-sessions tbody tr[data-user="{bob.name}"]').first
    save, stop = row.locator(".fgpu-save-image"), row.locator(".fgpu-stop")
    expect(stop).to_be_visible()
    first, second = save.bounding_box(), stop.bounding_box()
    assert abs(first["y"] - second["y"]) < 2, (first, second)  # side by side
    assert second["x"] - (first["x"] + first["width"]) >= 4, (first, second)  # with a gap
    screenshot(admin, "pages-admin-actions")

    # The admin's Images page at 800 px: each row's buttons on one line, not stacked.
    admin.set_viewport_size({"width": 800, "height": 900})
    admin.goto(f"{gpu_hub.url}{SESSIONS_PAGE}images")
    buttons = admin.locator("#fgpu-images tbody tr").first.locator("button")
    expect(buttons).to_have_count(4)
    tops = {round(b.bounding_box()["y"]) for b in buttons.all()}
    assert len(tops) == 1, tops
    assert admin.evaluate("document.documentElement.scrollWidth") <= 800
    screenshot(admin, "pages-images-800px")


def test_a_login_lands_on_the_sessions_page_and_a_followed_link_still_wins(gpu_hub, pages):
    name = f"hal-{secrets.token_hex(3)}"
    page = pages()
    log_in(page, gpu_hub, name)
    assert page.url == f"{gpu_hub.url}{SESSIONS_PAGE}sessions", page.url
    expect(page.locator("h1", has_text="Sessions")).to_be_visible()
    # The hub's home page points there first.
    page.goto(f"{gpu_hub.url}/hub/home")
    link = page.locator("#fgpu-home-sessions-link")
    expect(link).to_be_visible()
    screenshot(page, "pages-home")
    link.click()
    expect(page.locator("h1", has_text="Sessions")).to_be_visible()

    # A link followed before logging in (a lab URL) leads there after the login, not to Sessions.
    other = pages()
    other.goto(f"{gpu_hub.url}/user/{name}/lab")
    expect(other.locator("#username_input")).to_be_visible()
    assert "next=" in other.url
    expect(other.locator("#fgpu-demo-login-note")).to_contain_text("password is not checked")
    screenshot(other, "pages-login")
    other.fill("#username_input", name)
    other.click("#login_submit")
    other.wait_for_load_state()
    assert f"/user/{name}/lab" in other.url, other.url
    assert "services/queue" not in other.url


# -- at a quota, the pages say which one -----------------------------------


def fgpu_text(value: float) -> str:
    """An fGPU figure as the pages print it (fgpu.js `trim`): no trailing zeros."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def test_at_the_session_quota_the_pages_name_it_while_the_gpu_is_free(gpu_hub, pages):
    """The issue's case: 3 of 3 sessions held, the GPU free. The indicator and the dialog name the
    session quota with its figures, and the free figures tell the cluster from the quota."""
    hana = QueueUser(gpu_hub, f"hana-{secrets.token_hex(3)}")
    response = hana.call("POST", "sessions", json={**SMALL, "fgpu": 0, "count": 3})
    assert response.status_code in (200, 201), response.text
    hana.wait_for(lambda s: [x["status"] for x in s] == ["RUNNING"] * 3, timeout=240)
    quota_words = "You have 3 of 3 sessions"

    page = pages()
    log_in(page, gpu_hub, hana.name)
    open_sessions(page, gpu_hub)
    why = page.locator(".fgpu-indicator-why")
    expect(why).to_have_count(1)
    expect(why).to_contain_text("Nothing more starts for you now. " + quota_words)
    screenshot(page, "pages-at-session-quota-indicator")

    # What the cluster has free (the module's other tests may hold some of its GPU, never all).
    free_fgpu = fgpu_text(hana.call("GET", "resources").json()["free"]["fgpu"])
    assert free_fgpu != "0"
    launch(page, "python-3.11", cpu=0.5, mem_gib=0.5, fgpu=0.5, count=1)
    expect(page.locator("#fgpu-launch-group-line")).to_contain_text(f"{free_fgpu} fGPU,")
    expect(page.locator("#fgpu-launch-group-line")).to_contain_text("free; none for you now")
    free = page.locator("#fgpu-launch-free")
    expect(free).to_contain_text("Free on the cluster:")
    expect(free).to_contain_text(f"{free_fgpu} fGPU")  # the cluster's GPU is free ...
    expect(free).to_contain_text("Your quota leaves you none of it now. " + quota_words)
    warning = page.locator("#fgpu-launch-warning")
    expect(warning).to_have_attribute("data-kind", "wait")
    expect(warning).to_contain_text("1 will wait in the queue (PENDING) until your quota has room")
    expect(warning).to_contain_text(quota_words)
    screenshot(page, "pages-at-session-quota-dialog")
    page.click("#fgpu-launch-cancel")

    # The hub's Home page frames the same indicator, reason included, whole: the frame grows to
    # what it holds (the reason line was cut off below a fixed height), at 800 px too.
    for width in (1280, 800):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{gpu_hub.url}/hub/home")
        home_why = page.frame_locator("#fgpu-indicator-frame").locator(".fgpu-indicator-why")
        expect(home_why).to_contain_text("Nothing more starts for you now. " + quota_words)
        frame_box = page.locator("#fgpu-indicator-frame").bounding_box()
        why_box = home_why.bounding_box()  # in the page's coordinates
        assert why_box["y"] + why_box["height"] <= frame_box["y"] + frame_box["height"], width
        screenshot(page, f"pages-at-session-quota-home-{width}")

    for session in hana.sessions():
        assert hana.call("DELETE", f"sessions/{session['id']}").status_code == 200
