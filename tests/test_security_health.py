"""`GET api/health` on the real hub and service: anyone (a load balancer, a probe) learns the
status and nothing more; only an admin's full token or the service's own pages read the checks;
a cross-site script cannot read them with an admin's cookie; nothing can be changed through it."""

from __future__ import annotations

import pytest
import requests

from .harness import QueueUser, wait_until
from .test_security_handlers import EVIL, Browser, narrow_admin_token

pytestmark = [pytest.mark.docker, pytest.mark.hub]
SCRIPTED = {**EVIL, "Sec-Fetch-Mode": "cors"}
CHECKS = {"database", "engine", "scheduler", "containers"}


def health_url(hub) -> str:
    return f"{hub.url}/services/queue/api/health"


def test_anyone_learns_the_status_and_nothing_more(hub):
    def answered_ok():
        response = requests.get(health_url(hub), timeout=60)
        return response if response.json().get("status") == "ok" else None

    response = wait_until(answered_ok, 60, "the service reports ok")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response.headers["Cache-Control"] == "no-store"
    probe = requests.head(health_url(hub), timeout=60)
    assert (probe.status_code, probe.content) == (200, b"")


def test_an_admin_reads_every_check_with_what_to_do(hub):
    admin = QueueUser(hub, "admin")
    response = admin.call("GET", "health")
    assert response.status_code == 200, response.text
    checks = {check["name"]: check for check in response.json()["checks"]}
    assert set(checks) == CHECKS
    assert {check["status"] for check in checks.values()} == {"ok"}
    assert "answered" in checks["engine"]["message"]


def test_a_student_and_an_admins_narrow_token_see_no_checks(hub, username):
    student = QueueUser(hub, username)
    response = student.call("GET", "health")
    assert response.status_code == 200, response.text
    assert set(response.json()) == {"status"}
    narrow = narrow_admin_token(hub, ["access:services!service=queue"])
    response = narrow.get(health_url(hub), timeout=60)
    assert response.status_code == 200, response.text
    assert set(response.json()) == {"status"}


def test_a_cross_site_script_cannot_read_the_checks_with_an_admins_cookie(hub):
    admin = Browser(hub, "admin")
    response = admin.call("GET", "health", headers=SCRIPTED)
    assert "checks" not in response.text
    assert response.status_code == 403
    # The service's own pages can.
    assert "checks" in admin.own_page_call("GET", "health").json()


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_nothing_changes_through_it(hub, method):
    admin = QueueUser(hub, "admin")
    before = admin.sessions()
    response = admin.call(method, "health", json={"status": "fail"})
    assert response.status_code == 405, response.text
    anonymous = requests.request(method, health_url(hub), json={}, timeout=60)
    assert anonymous.status_code == 405
    assert "checks" not in anonymous.text
    assert admin.sessions() == before
    assert requests.get(health_url(hub), timeout=60).json()["status"] != "fail"
