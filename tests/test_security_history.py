"""The history (`GET sessions?finished=1`, the Finished tab) and the admin's stop, tried as an
attacker would, against the real hub and service: another student's history, narrow tokens,
cross-site requests with a victim's cookie."""

from __future__ import annotations

import pytest
import requests

from .harness import QueueUser
from .test_history_hub import ended, finished, launch
from .test_security_handlers import EVIL, Browser, narrow_admin_token

pytestmark = [pytest.mark.docker, pytest.mark.hub]
API = "/services/queue/api"


@pytest.fixture
def ended_session(hub, username) -> tuple[QueueUser, str]:
    """A student with one ended session (cancelled at once: nothing need start)."""
    owner = QueueUser(hub, username)
    (server,) = launch(owner)
    session_id = server["session"]["id"]
    assert owner.call("DELETE", f"sessions/{session_id}").status_code == 200
    ended(owner, session_id)
    return owner, session_id


def token_with(hub, user: str, scopes: list[str]) -> requests.Session:
    response = hub.request("POST", f"users/{user}/tokens", json={"scopes": scopes, "note": "n"})
    assert response.status_code == 201, response.text
    http = requests.Session()
    http.headers["Authorization"] = f"token {response.json()['token']}"
    return http


def test_a_student_never_reads_anothers_history(hub, ended_session):
    owner, session_id = ended_session
    mallory = QueueUser(hub, f"mallory-{owner.name[-8:]}")
    assert session_id not in {s["id"] for s in finished(mallory)["sessions"]}
    for query in (f"&user={owner.name}", f"&user={owner.name}&reason=user&limit=1000"):
        response = mallory.call("GET", f"sessions?finished=1{query}")
        assert response.status_code == 403, response.text
        assert "Only admins" in response.json()["message"]
    # Nor through the single-session read or stop: the same 404 as for no session at all.
    assert mallory.call("DELETE", f"sessions/{session_id}").status_code == 404
    # The admin sees it.
    assert ended(QueueUser(hub, "admin"), session_id, f"&user={owner.name}")["user"] == owner.name


def test_a_token_without_the_service_reads_nothing(hub, ended_session):
    owner, session_id = ended_session
    no_service = token_with(hub, owner.name, ["read:users!user=" + owner.name])
    response = no_service.get(f"{hub.url}{API}/sessions?finished=1", timeout=60)
    assert response.status_code == 403, response.text
    assert session_id not in response.text
    # An admin's token narrowed to the service alone has no admin powers: no one else's history.
    narrow = narrow_admin_token(hub, ["access:services!service=queue"])
    answer = narrow.get(f"{hub.url}{API}/sessions?finished=1", timeout=60).json()
    assert session_id not in {s["id"] for s in answer["sessions"]}
    response = narrow.get(f"{hub.url}{API}/sessions?finished=1&user={owner.name}", timeout=60)
    assert response.status_code == 403, response.text


def test_a_cross_site_script_cannot_read_the_history_with_the_victims_cookie(hub, ended_session):
    owner, session_id = ended_session
    victim = Browser(hub, owner.name)
    scripted = {**EVIL, "Sec-Fetch-Mode": "cors"}
    response = victim.call("GET", "sessions?finished=1", headers=scripted)
    assert response.status_code == 403, response.text
    assert session_id not in response.text
    # The service's own page reads it, with its token.
    own = victim.own_page_call("GET", "sessions?finished=1")
    assert own.status_code == 200 and session_id in own.text


def test_a_cross_site_request_cannot_use_an_admins_cookie_to_stop_a_session(hub, username):
    student = QueueUser(hub, username)
    (server,) = launch(student)
    session_id = server["session"]["id"]
    admin = Browser(hub, "admin")
    response = admin.call("DELETE", f"sessions/{session_id}", headers=EVIL)
    assert response.status_code == 403, response.text
    assert session_id in {s["id"] for s in student.sessions()}
    # Ended later by its owner, the record says so: the refused stop left no admin end behind.
    assert student.call("DELETE", f"sessions/{session_id}").status_code == 200
    assert ended(student, session_id)["end_reason"] in ("user", "cancelled")
