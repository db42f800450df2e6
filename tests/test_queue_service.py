"""The queue service end to end: a real hub, the real service, real containers, simulated GPUs."""

from __future__ import annotations

import json
import secrets
import time

import pytest
import requests

from .harness import containers_with, running_hub

pytestmark = [pytest.mark.docker, pytest.mark.hub]
SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "512M"}


@pytest.fixture(scope="module")
def gpu_hub(tmp_path_factory, docker_engine):
    """One simulated 8 GiB GPU holding 2 fGPU, as in the seed's walk-through."""
    env = {"FGPU_SIMULATED_GPUS": "1x8GiB", "FGPU_UNITS_PER_GPU": "2"}
    with running_hub(tmp_path_factory.mktemp("gpu-hub"), env=env) as hub:
        yield hub


class Student:
    """A user talking to the queue service through the hub's proxy with their own token."""

    def __init__(self, hub, name: str):
        hub.create_user(name)
        self.hub, self.name = hub, name
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"token {hub.user_token(name)}"

    def call(self, method: str, path: str, **kwargs) -> requests.Response:
        url = f"{self.hub.url}/services/queue/api/{path}"
        return self.http.request(method, url, timeout=60, **kwargs)

    def sessions(self) -> list[dict]:
        response = self.call("GET", "sessions")
        assert response.status_code == 200, response.text
        return response.json()["sessions"]

    def wait_for(self, predicate, timeout: float = 90) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sessions = self.sessions()
            if predicate(sessions):
                return sessions
            time.sleep(0.3)
        raise AssertionError(f"not reached in {timeout} s: {json.dumps(self.sessions(), indent=1)}")


def by_status(sessions: list[dict], status: str) -> list[dict]:
    return [s for s in sessions if s["status"] == status]


@pytest.fixture
def student(gpu_hub):
    return Student(gpu_hub, f"student-{secrets.token_hex(4)}")


def test_seed_walkthrough_two_run_one_waits_then_starts_by_itself(gpu_hub, student):
    response = student.call("POST", "sessions", json={**SESSION, "fgpu": 1, "count": 3})
    assert response.status_code == 201, response.text
    sessions = student.wait_for(
        lambda s: len(by_status(s, "RUNNING")) == 2 and len(by_status(s, "PENDING")) == 1
    )
    (pending,) = by_status(sessions, "PENDING")
    assert pending["position"] == 1 and pending["grant"] is None
    assert "fGPU" in pending["reason"]
    containers = containers_with({"fgpu.user": student.name})
    assert len(containers) == 2
    # Every grant of the one GPU adds up to exactly the whole GPU.
    fractions = [f for s in by_status(sessions, "RUNNING") for f in s["grant"]["gpus"].values()]
    assert fractions == [0.5, 0.5]

    first_running = by_status(sessions, "RUNNING")[0]
    released_at = time.monotonic()
    assert student.call("DELETE", f"sessions/{first_running['id']}").status_code == 200
    sessions = student.wait_for(
        lambda s: (
            len(by_status(s, "RUNNING")) == 2
            and pending["id"] in {r["id"] for r in by_status(s, "RUNNING")}
        )
    )
    print(f"pending → running after a release: {time.monotonic() - released_at:.1f} s")
    assert first_running["id"] not in {s["id"] for s in sessions}
    assert len(containers_with({"fgpu.user": student.name})) == 2
    for session in sessions:
        assert student.call("DELETE", f"sessions/{session['id']}").status_code == 200
    student.wait_for(lambda s: s == [])


def test_grant_reaches_the_container_as_labels_and_env(gpu_hub, student):
    response = student.call("POST", "sessions", json={**SESSION, "fgpu": 0.5, "count": 1})
    assert response.status_code == 201, response.text
    (session,) = student.wait_for(lambda s: len(by_status(s, "RUNNING")) == 1)
    (container,) = containers_with({"fgpu.user": student.name})
    assert container.labels["fgpu.session_id"] == session["id"]
    assert json.loads(container.labels["fgpu.grant"])["gpus"] == session["grant"]["gpus"]
    assert list(session["grant"]["gpus"].values()) == [0.25]
    env = dict(line.split("=", 1) for line in container.attrs["Config"]["Env"])
    assert env["FGPU_FGPU"] == "0.5"
    student.call("DELETE", f"sessions/{session['id']}")
    student.wait_for(lambda s: s == [])


def test_students_see_and_stop_only_their_own_sessions(gpu_hub, student):
    other = Student(gpu_hub, f"student-{secrets.token_hex(4)}")
    response = student.call("POST", "sessions", json={**SESSION, "count": 1})
    assert response.status_code == 201, response.text
    (session,) = student.wait_for(lambda s: len(by_status(s, "RUNNING")) == 1)
    assert other.sessions() == []
    assert other.call("DELETE", f"sessions/{session['id']}").status_code == 404
    assert by_status(student.sessions(), "RUNNING")
    student.call("DELETE", f"sessions/{session['id']}")
    student.wait_for(lambda s: s == [])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({**SESSION, "fgpu": 3}, "fGPU"),
        ({**SESSION, "count": 0}, "count"),
        ({**SESSION, "count": "3"}, "count"),
        ({**SESSION, "cpu": -1}, "greater than zero"),
    ],
)
def test_requests_that_can_never_fit_are_refused_at_once(gpu_hub, student, body, message):
    response = student.call("POST", "sessions", json=body)
    assert 400 <= response.status_code < 500, response.text
    assert message in response.json()["message"]
    assert student.sessions() == []
    assert containers_with({"fgpu.user": student.name}) == []


def test_service_api_needs_a_login(gpu_hub):
    response = requests.get(f"{gpu_hub.url}/services/queue/api/sessions", timeout=30)
    assert response.status_code in (401, 403)
    assert response.headers["Content-Type"].startswith("application/json")
