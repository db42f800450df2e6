"""`/services/queue/metrics`: the pure page builder, then a real hub, service and container.

The page is read back with prometheus_client's own parser (JupyterHub depends on it), so a format
mistake fails here rather than in a scraper.
"""

from __future__ import annotations

import secrets
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from queue_service.core.metrics import CONTENT_TYPE, escape, render

SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "512M"}


def families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value_of(samples, **labels) -> float:
    (match,) = [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    return match


RUNNING = {
    "id": "abc",
    "user": 'ann "the" admin\\',
    "server_name": "s-1",
    "status": "RUNNING",
    "cpu": 0.5,
    "mem": 536870912,
    "fgpu": 1.0,
    "usage": {
        "cpu_percent": 12.5,
        "mem_bytes": 1000,
        "mem_limit_bytes": 536870912,
        "gpu_mem_bytes": None,
        "gpu_util_percent": None,
        "sampled_at": "2026-01-01T00:00:00+00:00",
    },
}
NODES = [
    {
        "name": "node-1",
        "gpus": [
            {"uuid": "GPU-a", "index": 0, "fraction_free": 0.5, "fgpu_free": 1.0},
            {"uuid": "GPU-b", "index": 1, "fraction_free": 1.0, "fgpu_free": 2.0},
        ],
    }
]


def test_the_page_parses_and_carries_every_gauge():
    pending = {**RUNNING, "id": "def", "status": "PENDING", "usage": None}
    page = families(render([RUNNING, pending], NODES, units_per_gpu=2))

    labels = {"session": "abc", "user": RUNNING["user"], "server": "s-1"}
    assert value_of(page["fgpu_session_allocated_fgpu"], **labels) == 1.0
    assert value_of(page["fgpu_session_allocated_mem_bytes"], **labels) == 536870912
    assert value_of(page["fgpu_session_cpu_percent"], **labels) == 12.5
    assert value_of(page["fgpu_session_mem_bytes"], **labels) == 1000
    # Unknown is left out, never written as 0; a pending session holds nothing.
    assert page["fgpu_session_gpu_mem_bytes"] == []
    assert [s.labels["session"] for s in page["fgpu_session_allocated_cpu_cores"]] == ["abc"]
    assert value_of(page["fgpu_gpu_allocated_fraction"], gpu="GPU-a") == 0.5
    assert value_of(page["fgpu_gpu_allocated_fraction"], gpu="GPU-b") == 0.0
    assert value_of(page["fgpu_gpu_allocated_fgpu"], gpu="GPU-a", node="node-1") == 1.0
    assert value_of(page["fgpu_gpu_capacity_fgpu"], gpu="GPU-b", index="1") == 2.0
    queue = page["fgpu_queue_sessions"]
    assert {s.labels["status"]: s.value for s in queue} == {
        "PENDING": 1,
        "SCHEDULED": 0,
        "RUNNING": 1,
    }


def test_label_values_are_escaped():
    assert escape('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


# -- against a real hub ------------------------------------------------------------------------------
# The shared `gpu_hub` (tests/conftest.py) has the scraper set up as queue_service/core/metrics.py says.


def as_user(hub, name: str, admin: bool = False) -> requests.Session:
    response = hub.request("POST", f"users/{name}", json={"admin": admin})
    assert response.status_code == 201, response.text
    session = requests.Session()
    session.headers["Authorization"] = f"token {hub.user_token(name)}"
    return session


@pytest.mark.docker
@pytest.mark.hub
def test_metrics_of_a_running_session_through_the_hub(gpu_hub):
    hub, name = gpu_hub, f"student-{secrets.token_hex(4)}"
    student = as_user(hub, name)
    api = f"{hub.url}/services/queue/api/"
    response = student.post(api + "sessions", json={**SESSION, "fgpu": 0.5, "count": 1})
    assert response.status_code == 201, response.text
    # The session runs, and within a round or two of the sampler its record carries usage.
    deadline, session = time.monotonic() + 120, None
    while time.monotonic() < deadline:
        sessions = student.get(api + "sessions", timeout=30).json()["sessions"]
        if sessions and sessions[0]["status"] == "RUNNING" and sessions[0]["usage"]:
            session = sessions[0]
            break
        time.sleep(0.5)
    assert session is not None, sessions
    print(f"usage in GET sessions: {session['usage']}")
    assert set(session["usage"]) == {
        "cpu_percent",
        "mem_bytes",
        "mem_limit_bytes",
        "gpu_mem_bytes",
        "gpu_util_percent",
        "sampled_at",
    }
    assert session["usage"]["mem_limit_bytes"] == 512 * 1024**2
    assert session["usage"]["gpu_mem_bytes"] is None  # simulated GPUs: NVML has nothing

    url = f"{hub.url}/services/queue/metrics"
    scraper = requests.get(url, headers={"Authorization": f"token {hub.scraper_token}"}, timeout=30)
    admin = as_user(hub, f"admin-{secrets.token_hex(3)}", admin=True).get(url, timeout=30)
    refused = student.get(url, timeout=30)

    assert refused.status_code == 403 and "read:metrics" in refused.json()["message"]
    for response in (scraper, admin):
        assert response.status_code == 200, response.text
        assert response.headers["Content-Type"] == CONTENT_TYPE
    page = families(scraper.text)
    labels = {"session": session["id"], "user": name, "server": session["server_name"]}
    assert value_of(page["fgpu_session_allocated_fgpu"], **labels) == 0.5
    assert value_of(page["fgpu_session_mem_limit_bytes"], **labels) == 512 * 1024**2
    assert value_of(page["fgpu_session_mem_bytes"], **labels) > 0
    (gpu,) = page["fgpu_gpu_allocated_fraction"]
    assert gpu.value == 0.25
    assert value_of(page["fgpu_queue_sessions"], status="RUNNING") == 1

    assert student.delete(api + f"sessions/{session['id']}", timeout=60).status_code == 200
