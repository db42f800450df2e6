"""Storage folders and who they reach, on the real hub and service: the share endpoint tells a
student nothing of who exists, a handed-over automount folder does not automount for its new
owner until they say so, and a user deleted and created again within the service's cache time
is a new account that sees nothing of the old one's folders."""

from __future__ import annotations

import secrets

import pytest

from .harness import QueueUser
from .test_folders_hub import made

pytestmark = [pytest.mark.docker, pytest.mark.hub]


def share(owner: QueueUser, folder: dict, **target):
    return owner.call("POST", f"folders/{folder['id']}/shares", json={**target, "permission": "ro"})


def test_the_share_endpoint_tells_a_student_nothing_of_who_exists(hub, username):
    student = QueueUser(hub, username)
    folder = made(student, "notes")
    present, missing = f"there-{secrets.token_hex(3)}", f"absent-{secrets.token_hex(3)}"
    hub.create_user(present)
    group = hub.join_group(present, {})
    answers = [
        share(student, folder, user=present),
        share(student, folder, user=missing),
        share(student, folder, group=group),
        share(student, folder, group=f"no-group-{secrets.token_hex(3)}"),
    ]
    assert [a.status_code for a in answers] == [201] * 4, [a.text for a in answers]
    assert len({tuple(sorted(a.json())) for a in answers}) == 1
    # The share with a name the hub did not have opens nothing to an account made later.
    later = QueueUser(hub, missing)
    assert later.call("GET", "folders").json()["folders"] == []
    # An admin, who may list the hub's users anyway, is told.
    admin = QueueUser(hub, "admin")
    admins_folder = made(admin, f"admin-{secrets.token_hex(3)}")
    told = share(admin, admins_folder, user=f"absent-{secrets.token_hex(3)}")
    assert told.status_code == 400 and "no user" in told.json()["message"], told.text


def test_a_handed_over_automount_folder_does_not_automount_for_its_new_owner(hub, username):
    giver, taker = QueueUser(hub, f"giver-{secrets.token_hex(3)}"), QueueUser(hub, username)
    folder = made(giver, ".ipython")
    assert folder["automount"]
    admin = QueueUser(hub, "admin")
    given = admin.call("PATCH", f"folders/{folder['id']}", json={"owner": taker.name})
    assert given.status_code == 200, given.text
    (seen,) = taker.call("GET", "folders").json()["folders"]
    assert (seen["name"], seen["own"], seen["automount"]) == ("ipython", True, False)
    # Renamed back by the new owner: their own choice, and then it automounts.
    renamed = taker.call("PATCH", f"folders/{folder['id']}", json={"name": ".ipython"})
    assert renamed.status_code == 200 and renamed.json()["automount"], renamed.text


def test_a_user_created_again_at_once_sees_nothing_of_the_old_accounts_folders(hub, username):
    old = QueueUser(hub, username)
    made(old, "old-account-data")
    assert [f["name"] for f in old.call("GET", "folders").json()["folders"]] == ["old-account-data"]
    assert hub.request("DELETE", f"users/{username}").status_code == 204
    new = QueueUser(hub, username)  # within the service's 10 s cache of the hub's user model
    assert new.call("GET", "folders").json()["folders"] == []
    made(new, "new-account-data")
    # The old account's token, while HubAuth still knows it, never acts as the new account.
    answer = old.call("GET", "folders")
    if answer.status_code == 200:
        assert "new-account-data" not in answer.text, answer.text
    else:
        assert answer.status_code in (401, 403), answer.text
