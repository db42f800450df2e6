"""Cluster utilization over time against the real hub, service and containers (one simulated 8 GiB
GPU holding 2 fGPU, a sample every 2 seconds): the samples follow a real session from its grant
to its end and outlive a restart, `api/utilization` is for admins alone and refuses bad spans with a clear 400, and the
Cluster page draws its charts from the API's answer in Chromium (screenshot under
test-output/browser/cluster-utilization.png)."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

import pytest
import requests
from playwright.sync_api import expect

from .browser import log_in, screenshot
from .harness import QueueUser, restart, running_hub, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.hub]

GIB = 1024**3
SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "512M", "fgpu": 1, "count": 1}
HELD = {"cpu": 0.5, "mem": 512 * 1024**2, "fgpu": 1.0}
NOTHING = {"cpu": 0.0, "mem": 0.0, "fgpu": 0.0}
RESOURCES = ("cpu", "mem", "fgpu")
# An hour of samples is then 1800 rows, read whole (not averaged) up to 720 of them: 24 minutes,
# longer than this module runs.
INTERVAL = 2.0
FAST_SAMPLES = f"""
c.QueueService.utilization_interval = {INTERVAL}
c.DockerEngine.stats_interval = 1
"""


@pytest.fixture(scope="module")
def util_hub(tmp_path_factory, docker_engine):
    env = {"FGPU_SIMULATED_GPUS": "1x8GiB", "FGPU_UNITS_PER_GPU": "2"}
    workdir = tmp_path_factory.mktemp("utilization-hub")
    with running_hub(workdir, env=env, extra_config=FAST_SAMPLES) as hub:
        yield hub


def utilization(caller: QueueUser, **params) -> dict:
    response = caller.call("GET", "utilization", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def sample_where(caller: QueueUser, holds, what: str, timeout: float = 120) -> dict:
    """The newest sample of the last hour for which `holds(sample)` is true, polled for."""

    def found():
        return next(
            (s for s in reversed(utilization(caller, hours=1)["samples"]) if holds(s)), None
        )

    return wait_until(found, timeout=timeout, what=what, interval=INTERVAL / 2)


def slots(sample: dict, series: str) -> dict:
    return {resource: sample[resource][series] for resource in RESOURCES}


@pytest.fixture(scope="module")
def alice_ran(util_hub):
    """alice ran one session and ended it: the samples while it held its slice and after."""
    admin = QueueUser(util_hub, "admin")
    alice = QueueUser(util_hub, f"alice-{secrets.token_hex(3)}")
    response = alice.call("POST", "sessions", json=SESSION)
    assert response.status_code == 201, response.text
    running = alice.wait_for(lambda s: any(x["status"] == "RUNNING" for x in s), timeout=150)
    session = next(x for x in running if x["status"] == "RUNNING")
    during = sample_where(
        admin,
        # Use is measured once the container runs, CPU % after two stats rounds.
        lambda s: (
            s["fgpu"]["allocated"] == 1.0 and s["mem"]["used"] and s["cpu"]["used"] is not None
        ),
        "a sample with the session's slice and its measured use",
    )
    assert alice.call("DELETE", f"sessions/{session['id']}").status_code == 200
    alice.wait_for(lambda s: session["id"] not in {x["id"] for x in s}, timeout=90)
    ended = datetime.now(UTC)
    after = sample_where(
        admin,
        lambda s: datetime.fromisoformat(s["at"]) > ended,
        "a sample after the session ended",
    )
    return {"admin": admin, "alice": alice, "during": during, "after": after}


def test_the_samples_follow_a_session_from_its_grant_to_its_end(util_hub, alice_ran):
    admin, during, after = alice_ran["admin"], alice_ran["during"], alice_ran["after"]
    capacity = admin.call("GET", "resources").json()["capacity"]
    assert capacity["fgpu"] == 2
    for sample in (during, after):
        assert slots(sample, "capacity") == pytest.approx(capacity)
        assert sample["seconds"] == INTERVAL
    assert slots(during, "allocated") == HELD
    assert 0 < during["mem"]["used"] <= HELD["mem"]
    assert during["cpu"]["used"] >= 0
    assert during["fgpu"]["used"] is None  # simulated GPUs: nothing measures GPU use
    assert slots(after, "allocated") == NOTHING
    assert slots(after, "used") == NOTHING  # nothing runs: no use, known to be none

    answer = utilization(admin, hours=1)
    assert (answer["interval"], answer["width"], answer["units_per_gpu"]) == (INTERVAL, None, 2)
    moments = [datetime.fromisoformat(s["at"]) for s in answer["samples"]]
    assert moments == sorted(moments)
    span = datetime.fromisoformat(answer["from"]), datetime.fromisoformat(answer["to"])
    assert span[0] <= moments[0] and moments[-1] <= span[1]
    assert during in answer["samples"] and after in answer["samples"]


def test_from_and_to_choose_the_span(alice_ran):
    admin, during = alice_ran["admin"], alice_ran["during"]
    exactly = utilization(admin, **{"from": during["at"], "to": during["at"]})
    assert exactly["samples"] == [during]
    naive = during["at"].replace("+00:00", "")  # without an offset: UTC
    assert utilization(admin, **{"from": naive, "to": naive})["samples"] == [during]
    before = utilization(admin, to=during["at"], hours=1)["samples"]
    assert before[-1] == during and alice_ran["after"] not in before


def test_students_narrow_tokens_and_services_are_refused(util_hub):
    student = QueueUser(util_hub, f"bob-{secrets.token_hex(3)}")
    refused = student.call("GET", "utilization")
    assert refused.status_code == 403
    assert "Cluster utilization needs the admin:servers scope" in refused.json()["message"]

    util_hub.create_user("admin")
    made = util_hub.request(
        "POST", "users/admin/tokens", json={"scopes": ["access:services!service=queue"]}
    )
    assert made.status_code == 201, made.text
    api = f"{util_hub.url}/services/queue/api/utilization"
    narrow = requests.get(
        api, headers={"Authorization": f"token {made.json()['token']}"}, timeout=60
    )
    assert narrow.status_code == 403, narrow.text

    spawner = requests.get(
        api, headers={"Authorization": f"token {util_hub.spawner_token}"}, timeout=60
    )
    assert spawner.status_code == 403, spawner.text
    anonymous = requests.get(api, timeout=60)
    assert anonymous.status_code == 401
    assert anonymous.json()["message"] == "Log in to the hub first."


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"from": "yesterday"},
            "`from` must be an ISO date (2026-11-24) or time (2026-11-24T06:00:00Z), not 'yesterday'",
        ),
        ({"to": "2026-13-01"}, "`to` must be an ISO date (2026-11-24) or time"),
        ({"from": "2026-11-20T00:00Z", "to": "2026-11-19"}, "is after to"),
        ({"from": "2026-11-20", "hours": "2"}, "Give either from or hours, not both"),
        ({"hours": "-1"}, "`hours` must be a number above 0 and at most 87840, not '-1'"),
        ({"hours": "nan"}, "`hours` must be a number above 0"),
        ({"hours": "inf"}, "`hours` must be a number above 0"),
        ({"hours": "a week"}, "`hours` must be a number above 0"),
        ({"from": "1990-01-01", "to": "2026-11-19"}, "at most 3660 days"),
        (
            {"to": "0001-01-01T00:00:00", "hours": "48"},
            "`to` must be from 1970-01-01 to 2999-12-31",
        ),
    ],
)
def test_bad_spans_get_a_clear_400(alice_ran, params, message):
    response = alice_ran["admin"].call("GET", "utilization", params=params)
    assert response.status_code == 400, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    assert message in response.json()["message"]


DRAWN = """() => Object.fromEntries(["cpu", "mem", "fgpu"].map(key => {
    const canvas = document.getElementById("fgpu-util-" + key);
    const chart = Chart.getChart(canvas);
    return [key, {
        to: canvas.dataset.to, hours: canvas.dataset.hours,
        lines: Object.fromEntries(chart.data.datasets.map(d => [d.label, d.data])),
    }];
}))"""
SERIES = {"Capacity": "capacity", "Allocated": "allocated", "Used": "used"}
SCALE = {"cpu": 1, "mem": 1 / GIB, "fgpu": 1}


def test_the_cluster_page_draws_the_apis_samples(util_hub, pages, alice_ran):
    page = pages()
    answers = []
    page.on("response", lambda r: answers.append(r) if "/api/utilization?" in r.url else None)
    log_in(page, util_hub, "admin")
    page.goto(f"{util_hub.url}/services/queue/cluster")
    expect(page.locator("#fgpu-util-fgpu[data-ready]")).to_be_attached(timeout=30_000)
    # The hub's samples are minutes old: the page opens on the hour, where they are not a sliver.
    expect(page.locator("#fgpu-util-range")).to_have_value("1")
    # ... and the axis starts where they start, not an hour back.
    first = page.evaluate("Chart.getChart(document.getElementById('fgpu-util-fgpu')).scales.x.min")
    to = page.evaluate("Date.parse(document.getElementById('fgpu-util-fgpu').dataset.to)")
    assert to - first < 30 * 60_000, "the axis shows the samples' minutes, not the whole hour"
    page.select_option("#fgpu-util-range", "1")
    for key in RESOURCES:
        expect(page.locator(f'#fgpu-util-{key}[data-hours="1"]')).to_be_attached()
    drawn = page.evaluate(DRAWN)

    assert len({chart["to"] for chart in drawn.values()}) == 1, "the charts drew one answer"
    (answer,) = [
        data
        for data in (r.json() for r in answers if r.ok and r.url.endswith("utilization?hours=1"))
        if data["to"] == drawn["fgpu"]["to"]
    ]
    assert answer["samples"], answer
    for key, chart in drawn.items():
        for label, series in SERIES.items():
            line = chart["lines"][label]
            wanted = [s[key][series] for s in answer["samples"]]
            assert [p["y"] for p in line] == [
                None if v is None else pytest.approx(v * SCALE[key], rel=1e-12) for v in wanted
            ], (key, label)
            moments = [
                datetime.fromisoformat(s["at"]).timestamp() * 1000 for s in answer["samples"]
            ]
            assert [p["x"] for p in line] == pytest.approx(moments, abs=1)
    # alice's session is in the last hour: 1 of 2 fGPU allocated, half a core.
    assert max(p["y"] for p in drawn["fgpu"]["lines"]["Allocated"]) == 1.0
    assert max(p["y"] for p in drawn["fgpu"]["lines"]["Capacity"]) == 2.0
    assert max(p["y"] for p in drawn["cpu"]["lines"]["Allocated"]) == 0.5
    expect(page.locator("#fgpu-util-note")).to_contain_text("points")
    screenshot(page, "cluster-utilization")

    page.select_option("#fgpu-util-range", "168")  # a week: the same samples, a wider axis
    for key in RESOURCES:
        expect(page.locator(f'#fgpu-util-{key}[data-hours="168"]')).to_be_attached()
    week = page.evaluate(DRAWN)["fgpu"]
    assert max(p["y"] for p in week["lines"]["Allocated"]) == 1.0
    assert any(r.url.endswith("utilization?hours=168") for r in answers)


def test_the_samples_outlive_a_restart_and_sampling_goes_on(util_hub, alice_ran):
    """Last in the module: it restarts the hub (and with it the service)."""
    admin, during = alice_ran["admin"], alice_ran["during"]
    restart(util_hub)
    restarted = datetime.now(UTC)
    kept = utilization(admin, **{"from": during["at"], "to": during["at"]})["samples"]
    assert kept == [during]
    sample_where(
        admin,
        lambda s: datetime.fromisoformat(s["at"]) > restarted,
        "a sample taken after the restart",
    )
