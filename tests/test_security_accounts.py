"""A user deleted and created again under the same name is a new account, on a
real hub: the old account's finished sessions, usage figures and budget use are not the new
account's, while admins still read them by name. (Homes and private images: test_security_auth.)
"""

from __future__ import annotations

import pytest

from .harness import QueueUser, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.hub]

SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "256M"}
# A budget one session uses up within a second: 0.0001 core-hours are 0.72 s of 0.5 cores.
BUDGET_HOURS = 0.0001
BUDGET = {"fgpu_quota": {"cpu_hours_per_week": BUDGET_HOURS}}


def finished(user: QueueUser, query: str = "") -> list[dict]:
    response = user.call("GET", f"sessions?finished=1{query}")
    assert response.status_code == 200, response.text
    return response.json()["sessions"]


def cpu_hours(user: QueueUser) -> float:
    response = user.call("GET", "usage")
    assert response.status_code == 200, response.text
    return response.json()["totals"]["cpu_hours"]


def budget_used(user: QueueUser) -> float:
    response = user.call("GET", "resources")
    assert response.status_code == 200, response.text
    (budget,) = response.json()["budgets"]
    return budget["used"]


def run_and_end(user: QueueUser) -> str:
    """Launch one session from the Sessions page's API, wait until it runs, end it: its id."""
    response = user.call("POST", "sessions", json={**SESSION, "count": 1})
    assert response.status_code == 201, response.text
    session_id = response.json()["servers"][0]["session"]["id"]
    user.wait_for(lambda s: any(x["status"] == "RUNNING" for x in s), timeout=150)
    assert user.call("DELETE", f"sessions/{session_id}").status_code == 200
    wait_until(lambda: finished(user), 90, "the ended session in the history", interval=0.5)
    return session_id


def started_by_the_hub_and_ended(hub, name: str) -> None:
    """A session through the hub's own API (the spawner asks for its grant), stopped again."""
    response = hub.start_server(name, SESSION, server="old")
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(name, "old")
    hub.stop_server(name, "old")


def test_a_new_account_of_a_deleted_users_name_starts_with_no_history_usage_or_budget_use(
    hub, username
):
    admin = QueueUser(hub, "admin")
    hub.create_user(username)
    group = hub.join_group(username, BUDGET)
    started_by_the_hub_and_ended(hub, username)
    first = QueueUser(hub, username)
    (old,) = finished(first)
    assert old["account"] != ""
    assert cpu_hours(first) > 0 and budget_used(first) > BUDGET_HOURS
    refused = first.call("POST", "sessions", json={**SESSION, "count": 1})
    assert refused.status_code == 403, refused.text
    assert f"The group {group} has used its budget" in refused.json()["message"]

    assert hub.request("DELETE", f"users/{username}").status_code == 204
    second = QueueUser(hub, username)
    joined = hub.request("POST", f"groups/{group}/users", json={"users": [username]})
    assert joined.status_code == 200, joined.text

    # The new account: nothing of the old one's, in the history, the usage or the budget, whose
    # indicator follows once the service's 10 s cache of user models has the new account.
    assert finished(second) == []
    assert cpu_hours(second) == 0
    wait_until(lambda: budget_used(second) == 0, 30, "the new account's budget use at 0")
    # Admins still read the name's whole history, each session with its account.
    assert old["id"] in {s["id"] for s in finished(admin, f"&user={username}")}

    # The budget lets the new account in, and its own session is its own, under another key.
    new_id = run_and_end(second)
    (mine,) = finished(second)
    assert mine["id"] == new_id and mine["account"] not in ("", old["account"])
    assert cpu_hours(second) > 0
