"""Who may read whose resource groups and allowances (`GET api/resources?user=NAME`), tried as an
attacker would, against the real hub and the service with three groups (`grouped_hub`).

The spawner reads a user's groups for the spawn form; admins may read anyone's; a student only
their own. Narrow tokens, other services and cross-site requests get nothing.
"""

from __future__ import annotations

import secrets

import pytest

from .harness import QueueUser
from .test_security_handlers import EVIL, Browser, narrow_admin_token

pytestmark = [pytest.mark.docker, pytest.mark.hub]


@pytest.fixture
def student(grouped_hub):
    return QueueUser(grouped_hub, f"student-{secrets.token_hex(4)}")


def allowed_of(response) -> dict:
    assert response.status_code == 200, response.text
    return {name: g["allowed"] for name, g in response.json()["resource_groups"].items()}


def test_a_student_reads_their_own_allowances_but_not_anothers(grouped_hub, student):
    other = QueueUser(grouped_hub, f"student-{secrets.token_hex(4)}")
    own = allowed_of(student.call("GET", f"resources?user={student.name}"))
    assert own == allowed_of(student.call("GET", "resources"))
    refused = student.call("GET", f"resources?user={other.name}")
    assert refused.status_code == 403, refused.text
    assert refused.json()["message"] == "Only admins may read another user's resources."
    assert "resource_groups" not in refused.json()


def test_admins_read_anyones_but_a_narrow_admin_token_does_not(grouped_hub, student):
    admin = QueueUser(grouped_hub, "admin")
    path = f"resources?user={student.name}"
    assert allowed_of(admin.call("GET", path)) == {
        "default": True,
        "gpu-a100": True,
        "restricted": False,
    }
    api = f"{grouped_hub.url}/services/queue/api"
    narrow = narrow_admin_token(grouped_hub, ["access:services!service=queue"])
    refused = narrow.get(f"{api}/{path}", timeout=60)
    assert refused.status_code == 403, refused.text
    # A token of the student's that does not reach the service at all.
    response = grouped_hub.request(
        "POST",
        f"users/{student.name}/tokens",
        json={"scopes": [f"read:users:name!user={student.name}"]},
    )
    assert response.status_code == 201, response.text
    headers = {"Authorization": f"token {response.json()['token']}"}
    unreachable = narrow.get(f"{api}/resources", headers=headers, timeout=60)
    assert unreachable.status_code == 403, unreachable.text


def test_no_other_service_reads_a_users_allowances(grouped_hub, student):
    # The harness's admin service: a hub service with every scope, but not the spawner.
    response = grouped_hub.api.get(
        f"{grouped_hub.url}/services/queue/api/resources?user={student.name}", timeout=60
    )
    assert response.status_code == 403, response.text
    assert "spawner" in response.json()["message"]


def test_a_cross_site_script_cannot_read_the_victims_allowances(grouped_hub, student):
    victim = Browser(grouped_hub, student.name)
    for path in (f"resources?user={student.name}", "resources"):
        stolen = victim.call("GET", path, headers={**EVIL, "Sec-Fetch-Mode": "cors"})
        assert stolen.status_code == 403, stolen.text
        assert "resource_groups" not in stolen.text
    assert allowed_of(victim.own_page_call("GET", f"resources?user={student.name}"))["default"]
