"""History, against the real hub, service and containers: ended sessions with their end
codes in `GET sessions?finished=1`, and their named servers removed from the hub."""

from __future__ import annotations

import pytest
import requests

from .harness import QueueUser, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.hub]
SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "256M"}


def launch(user: QueueUser, count: int = 1) -> list[dict]:
    response = user.call("POST", "sessions", json={**SESSION, "count": count})
    assert response.status_code == 201, response.text
    return response.json()["servers"]


def finished(user: QueueUser, query: str = "") -> dict:
    response = user.call("GET", f"sessions?finished=1{query}")
    assert response.status_code == 200, response.text
    return response.json()


def ended(user: QueueUser, session_id: str, query: str = "") -> dict:
    """The session's entry in the history, once it is there."""
    return wait_until(
        lambda: next((s for s in finished(user, query)["sessions"] if s["id"] == session_id), None),
        90,
        f"session {session_id} in the history",
        interval=0.5,
    )


def hub_servers(hub, user: str) -> dict:
    """Every server the hub has for `user`, stopped ones included (as its home page lists)."""
    response = hub.request("GET", f"users/{user}", params={"include_stopped_servers": "1"})
    assert response.status_code == 200, response.text
    return response.json()["servers"]


def test_ended_sessions_are_listed_with_their_codes_and_their_servers_leave_the_hub(hub, username):
    student, admin = QueueUser(hub, username), QueueUser(hub, "admin")
    own, others = (s["session"] for s in launch(student, count=2))
    names = {s["server_name"] for s in (own, others)}
    student.wait_for(lambda sessions: {s["status"] for s in sessions} == {"RUNNING"}, timeout=180)

    assert student.call("DELETE", f"sessions/{own['id']}").status_code == 200
    assert admin.call("DELETE", f"sessions/{others['id']}").status_code == 200

    mine = ended(student, own["id"])
    assert (mine["end_reason"], mine["end_reason_label"]) == ("user", "Stopped by the user")
    assert mine["status"] == "TERMINATED" and mine["duration"] > 0
    assert (mine["cpu"], mine["mem"], mine["fgpu"]) == (0.5, 256 * 1024**2, 0.0)
    by_admin = ended(admin, others["id"], f"&user={username}&reason=admin")
    assert by_admin["end_reason"] == "admin"
    assert by_admin["reason"] == "stopped by admin (an admin)"
    history = finished(student)["sessions"]
    assert [s["id"] for s in history[:2]] == [others["id"], own["id"]]  # newest end first
    assert {s["user"] for s in history} == {username}
    # The admin filters: this student's admin-ended sessions only.
    assert [s["id"] for s in finished(admin, f"&user={username}&reason=admin")["sessions"]] == [
        others["id"]
    ]

    # Stopped, and then removed from the hub: its home page no longer lists them.
    wait_until(
        lambda: not names & set(hub_servers(hub, username)),
        60,
        f"{names} removed from the hub",
        interval=0.5,
    )
    assert "could not remove" not in hub.log_text()


def test_bad_history_filters_are_a_clear_400(hub, username):
    student = QueueUser(hub, username)
    for query, words in [
        ("&reason=bored", "Unknown reason 'bored'"),
        ("&from=yesterday", "`from` must be an ISO date"),
        ("&limit=100000", "`limit` must be a whole number from 1 to 1000"),
        ("&offset=x", "`offset` must be a whole number"),
    ]:
        response = student.call("GET", f"sessions?finished=1{query}")
        assert response.status_code == 400, (query, response.text)
        assert response.headers["Content-Type"].startswith("application/json")
        assert words in response.json()["message"], query
    response = student.call("GET", "sessions?finished=maybe")
    assert response.status_code == 400 and "`finished` must be 1 or 0" in response.json()["message"]


def test_a_start_that_fails_ends_as_error_in_the_history(hub, username):
    """The spawner's release of a failed start names the code: the container exited early."""
    student = QueueUser(hub, username)
    response = hub.start_server(username, {"image": "exits-early", "cpu": 0.5}, server="broken")
    assert response.status_code == 500, response.text

    (failed,) = wait_until(
        lambda: finished(student)["sessions"], 60, "the failed start in the history"
    )
    assert (failed["server_name"], failed["status"]) == ("broken", "ERROR")
    assert (failed["end_reason"], failed["end_reason_label"]) == (
        "error",
        "Failed to start or error",
    )


def test_the_spawner_may_name_only_known_end_codes(hub, username):
    spawner = requests.Session()
    spawner.headers["Authorization"] = f"token {hub.spawner_token}"
    response = spawner.delete(
        f"{hub.url}/services/queue/api/grants/{'0' * 32}?end_reason=bored", timeout=60
    )
    assert response.status_code == 400, response.text
    assert "Unknown end_reason 'bored'" in response.json()["message"]
