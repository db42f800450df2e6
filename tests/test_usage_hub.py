"""Usage accounting and budgets against the real hub, service and containers (one simulated 8 GiB
GPU holding 2 fGPU): the figures of a real session are its slots × the time it held them, who may
read whose, the CSV export, a budget that refuses a launch with its message, and the Usage page
with its chart in Chromium (screenshots under test-output/browser/usage-*). The service's clock
is moved (tests/service_clock.py) to show a used-up budget letting a launch in once its window has
moved."""

from __future__ import annotations

import csv
import io
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from playwright.sync_api import expect
from sqlalchemy import create_engine, text

from .browser import log_in, screenshot
from .harness import QueueUser, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.hub]

SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "512M", "fgpu": 1, "count": 1}
SLOTS = {"cpu_hours": 0.5, "mem_gib_hours": 0.5, "fgpu_hours": 1.0}
FIGURES = tuple(SLOTS)


def service_db(hub):
    return create_engine(f"sqlite:///{hub.workdir / 'fgpu_queue.sqlite'}")


def held_hours(hub, session_id: str) -> tuple[float, bool]:
    """(hours from the session's grant to its end, whether its use is filed), from the DB."""
    engine = service_db(hub)
    try:
        with engine.connect() as db:
            scheduled, ended = db.execute(
                text("SELECT scheduled_at, ended FROM sessions WHERE id = :id"), {"id": session_id}
            ).one()
            filed = db.execute(
                text("SELECT count(*) FROM usage_recorded WHERE session_id = :id"),
                {"id": session_id},
            ).scalar()
    finally:
        engine.dispose()
    span = datetime.fromisoformat(str(ended)) - datetime.fromisoformat(str(scheduled))
    return span.total_seconds() / 3600, bool(filed)


def launch_and_wait(user: QueueUser, **changes) -> dict:
    response = user.call("POST", "sessions", json={**SESSION, **changes})
    assert response.status_code == 201, response.text
    running = user.wait_for(lambda s: any(x["status"] == "RUNNING" for x in s), timeout=150)
    return next(x for x in running if x["status"] == "RUNNING")


def end(user: QueueUser, session_id: str) -> None:
    assert user.call("DELETE", f"sessions/{session_id}").status_code == 200
    user.wait_for(lambda s: session_id not in {x["id"] for x in s}, timeout=90)


def usage(caller, **params) -> dict:
    response = caller.call("GET", "usage", params=params)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def alice_used(gpu_hub):
    """alice ran one session and ended it: (alice, its id, the hours it held its slots)."""
    alice = QueueUser(gpu_hub, f"alice-{secrets.token_hex(3)}")
    session = launch_and_wait(alice)
    # While it runs it counts up to now: more than nothing, no more than it held so far.
    live = usage(alice)["totals"]
    since_grant = datetime.now(UTC) - datetime.fromisoformat(session["scheduled"])
    assert 0 < live["fgpu_hours"] <= since_grant.total_seconds() / 3600
    assert live["cpu_hours"] == pytest.approx(0.5 * live["fgpu_hours"], rel=1e-9)
    end(alice, session["id"])
    hours, filed = held_hours(gpu_hub, session["id"])
    assert filed, "the session's use was not filed as it ended"
    return alice, session["id"], hours


def test_a_sessions_usage_is_its_slots_times_the_time_it_held_them(alice_used):
    alice, _, hours = alice_used
    answer = usage(alice)
    assert {row["user"] for row in answer["usage"]} == {alice.name}
    assert {row["resource_group"] for row in answer["usage"]} == {"default"}
    for figure, slot in SLOTS.items():
        assert answer["totals"][figure] == pytest.approx(slot * hours, rel=1e-9), figure
    today = datetime.now(UTC).date()
    assert (answer["from"], answer["to"]) == (str(today - timedelta(days=29)), str(today))
    # A span that ends before today has none of it.
    yesterday = str(today - timedelta(days=1))
    assert usage(alice, to=yesterday)["usage"] == []


def test_admins_read_everyones_usage_filtered_and_as_csv(gpu_hub, alice_used):
    alice, _, hours = alice_used
    admin = QueueUser(gpu_hub, "admin")
    everyone = usage(admin)
    assert alice.name in {row["user"] for row in everyone["usage"]}
    mine = usage(admin, user=alice.name)
    assert mine["usage"] == usage(alice)["usage"]

    group = f"course-{secrets.token_hex(3)}"
    assert gpu_hub.request("POST", f"groups/{group}").status_code == 201
    members = {"users": [alice.name]}
    assert gpu_hub.request("POST", f"groups/{group}/users", json=members).status_code == 200
    assert usage(admin, group=group)["usage"] == mine["usage"]

    response = admin.call("GET", "usage", params={"user": alice.name, "format": "csv"})
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/csv")
    assert "attachment" in response.headers["Content-Disposition"]
    table = list(csv.DictReader(io.StringIO(response.text)))
    assert list(table[0]) == ["day", "user", "resource_group", *FIGURES]
    assert [{**row, **{f: float(row[f]) for f in FIGURES}} for row in table] == mine["usage"]
    assert sum(float(row["fgpu_hours"]) for row in table) == pytest.approx(hours, rel=1e-9)


def test_students_and_narrow_tokens_read_only_their_own_usage(gpu_hub, alice_used):
    alice = alice_used[0]
    bob = QueueUser(gpu_hub, f"bob-{secrets.token_hex(3)}")
    refused = bob.call("GET", "usage", params={"user": alice.name})
    assert refused.status_code == 403
    assert "Only admins may read another user's usage" in refused.json()["message"]
    assert usage(bob)["usage"] == []
    assert usage(bob, user=bob.name)["usage"] == []
    csv_text = bob.call("GET", "usage", params={"format": "csv"}).text
    assert alice.name not in csv_text
    assert csv_text.strip() == "day,user,resource_group,cpu_hours,mem_gib_hours,fgpu_hours"

    # An admin's token made without admin:servers reads as a plain user.
    gpu_hub.create_user("admin")
    made = gpu_hub.request(
        "POST", "users/admin/tokens", json={"scopes": ["access:services!service=queue"]}
    )
    assert made.status_code == 201, made.text
    narrow = requests.Session()
    narrow.headers["Authorization"] = f"token {made.json()['token']}"
    api = f"{gpu_hub.url}/services/queue/api/usage"
    assert narrow.get(api, params={"user": alice.name}, timeout=60).status_code == 403
    rows = narrow.get(api, timeout=60).json()["usage"]
    assert alice.name not in {row["user"] for row in rows}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"from": "last week"}, "`from` must be an ISO date (YYYY-MM-DD), not 'last week'"),
        ({"to": "2026-13-01"}, "`to` must be an ISO date"),
        ({"from": "2026-11-20", "to": "2026-11-19"}, "from (2026-11-20) is after to (2026-11-19)"),
        ({"from": "2000-01-01", "to": "2026-11-19"}, "at most 3660 days"),
        ({"format": "xml"}, "format must be json or csv, not 'xml'"),
    ],
)
def test_bad_usage_queries_get_a_clear_400(gpu_hub, params, message):
    student = QueueUser(gpu_hub, "carl")
    response = student.call(
        "GET", "usage", params={**params, "format": params.get("format", "csv")}
    )
    assert response.status_code == 400, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    assert message in response.json()["message"]


def test_a_used_up_budget_refuses_a_launch_until_the_window_moves(
    gpu_hub, pages, docker_engine, service_clock
):
    dana = QueueUser(gpu_hub, f"dana-{secrets.token_hex(3)}")
    group = f"budget-{secrets.token_hex(3)}"
    assert gpu_hub.request("POST", f"groups/{group}").status_code == 201
    # A budget a running session uses up within a second: 0.0001 fGPU-hours is 0.36 fGPU-seconds.
    properties = {"fgpu_quota": {"fgpu_hours_per_week": 0.0001}}
    assert gpu_hub.request("PUT", f"groups/{group}/properties", json=properties).status_code == 200
    members = {"users": [dana.name]}
    assert gpu_hub.request("POST", f"groups/{group}/users", json=members).status_code == 200

    first = launch_and_wait(dana, fgpu=0.5)
    wait_until(
        lambda: usage(dana)["totals"]["fgpu_hours"] > 0.0001, timeout=30, what="budget used up"
    )
    refused = dana.call("POST", "sessions", json={**SESSION, "fgpu": 0.5})
    assert refused.status_code in (400, 403), refused.text
    message = refused.json()["message"]
    assert f"The group {group} has used its budget of 0.0001 fGPU-hours per week" in message
    monday = datetime.now(UTC).date() + timedelta(days=7 - datetime.now(UTC).weekday())
    assert f"frees up at {monday} 00:00 UTC" in message, message
    assert [s["id"] for s in dana.sessions()] == [first["id"]]
    containers = docker_engine.containers.list(filters={"label": f"fgpu.user={dana.name}"})
    assert len(containers) == 1

    budgets = dana.call("GET", "resources").json()["budgets"]
    assert [(b["group"], b["figure"], b["used_up"]) for b in budgets] == [
        (group, "fgpu_hours", True)
    ]
    page = pages()
    log_in(page, gpu_hub, dana.name)
    page.goto(f"{gpu_hub.url}/services/queue/")
    line = page.locator(f'.fgpu-indicator-budget[data-budget="{group}:fgpu_hours:week"]')
    expect(line).to_have_attribute("data-used-up", "1", timeout=30_000)
    expect(line).to_contain_text("used up until")
    screenshot(page, "usage-budget-indicator")
    end(dana, first["id"])

    # Next Monday the window has moved: the same launch is let through (the service's clock
    # moves; the test sleeps through nothing).
    service_clock.move_to(datetime.combine(monday, datetime.min.time(), UTC) + timedelta(minutes=1))
    try:
        budgets = wait_until(
            lambda: (b := window_of(dana))[0]["window_start"].startswith(str(monday)) and b,
            10,
            "the service's clock in next week",
        )
        assert [(b["used"], b["used_up"]) for b in budgets] == [(0, False)], budgets
        second = launch_and_wait(dana, fgpu=0.5)
        assert second["id"] != first["id"]
        end(dana, second["id"])
    finally:
        service_clock.reset()
        this_week = str(monday - timedelta(days=7))
        wait_until(
            lambda: window_of(dana)[0]["window_start"].startswith(this_week),
            10,
            "the service's clock back",
        )


def window_of(user: QueueUser) -> list[dict]:
    return user.call("GET", "resources").json()["budgets"]


def test_the_usage_page_shows_the_figures_and_their_chart(gpu_hub, pages, alice_used):
    alice, _, hours = alice_used
    page = pages()
    log_in(page, gpu_hub, alice.name)
    page.goto(f"{gpu_hub.url}/hub/home")
    page.click("#fgpu-nav-usage")
    expect(page.locator("h1", has_text="Usage")).to_be_visible()
    expect(page.locator("#fgpu-usage[data-ready]")).to_be_attached(timeout=30_000)
    totals = usage(alice)["totals"]
    for figure in FIGURES:
        cell = page.locator(f'#fgpu-usage-total td[data-figure="{figure}"]')
        assert float(cell.get_attribute("data-value")) == pytest.approx(totals[figure], rel=1e-9)
    assert page.locator("#fgpu-usage-user").count() == 0  # no filters for students
    expect(page.locator("#fgpu-usage-chart[data-ready]")).to_be_attached()
    drawn = page.evaluate(
        """() => Chart.getChart(document.getElementById('fgpu-usage-chart')).data.datasets
            .map(d => [d.label, d.data.reduce((a, b) => a + b, 0)])"""
    )
    assert dict(drawn)["fGPU-hours"] == pytest.approx(hours, rel=1e-6)
    assert dict(drawn)["CPU core-hours"] == pytest.approx(0.5 * hours, rel=1e-6)
    csv_url = page.locator("#fgpu-usage-csv").get_attribute("href")
    assert "format=csv" in csv_url
    with page.expect_download() as download:
        page.click("#fgpu-usage-csv")
    text_ = Path(download.value.path()).read_text()
    assert alice.name in text_ and text_.startswith("day,user,resource_group")
    screenshot(page, "usage-student")

    admin = pages()
    log_in(admin, gpu_hub, "admin")
    admin.goto(f"{gpu_hub.url}/services/queue/usage")
    expect(admin.locator("#fgpu-usage[data-ready]")).to_be_attached(timeout=30_000)
    admin.fill("#fgpu-usage-user", alice.name)
    admin.click("#fgpu-usage-show")
    expect(admin.locator("#fgpu-usage tbody tr")).to_have_count(len(usage(alice)["usage"]))
    expect(admin.locator(f'#fgpu-usage tbody tr[data-user="{alice.name}"]').first).to_be_visible()
    assert alice.name in admin.locator("#fgpu-usage-csv").get_attribute("href")
    screenshot(admin, "usage-admin")
