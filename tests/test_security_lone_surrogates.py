"""Lone surrogates (JSON's `"\\ud800"`) on the real hub and service: text no file name, row,
environment or command line can hold, in a spawn's `env`, a batch job's `command`, a file's new
name and a share's user name. Each is a 400 that names the field, and changes nothing."""

from __future__ import annotations

import os

import pytest

from .harness import QueueUser
from .test_folders_hub import OCTETS, made, on_disk

pytestmark = [pytest.mark.docker, pytest.mark.hub]

SLOTS = {"image": "python-3.11", "cpu": 0.5, "mem": "512M"}
LONE = "x\ud800y"


def refused(response, field: str) -> None:
    assert response.status_code == 400, response.text
    message = response.json()["message"]
    assert field in message and "lone surrogate" in message, message


def test_an_env_value_with_a_lone_surrogate_is_a_400_from_the_hub(hub, username):
    hub.create_user(username)
    answer = hub.request(
        "POST", f"users/{username}/servers/", json={**SLOTS, "env": {"SECRET": LONE}}
    )
    refused(answer, "env.SECRET")
    assert hub.server_model(username) is None


def test_a_jobs_command_with_a_lone_surrogate_is_a_400(hub, username):
    user = QueueUser(hub, username)
    answer = user.call("POST", "sessions", json={**SLOTS, "type": "batch", "command": LONE})
    refused(answer, "command")
    assert user.sessions() == []


def test_a_rename_to_a_lone_surrogate_is_a_400(hub, username):
    user = QueueUser(hub, username)
    folder = made(user, "work")
    url = f"folders/{folder['id']}/files/a.txt"
    assert user.call("PUT", url + "?offset=0", data=b"a", headers=OCTETS).status_code == 201
    refused(user.call("PATCH", url, json={"to": LONE}), "to")
    assert os.listdir(on_disk(hub, folder)) == ["a.txt"]


def test_a_share_with_a_lone_surrogate_user_name_is_a_400(hub, username):
    user = QueueUser(hub, username)
    folder = made(user, "work")
    answer = user.call(
        "POST", f"folders/{folder['id']}/shares", json={"user": LONE, "permission": "ro"}
    )
    refused(answer, "user")
    assert user.call("GET", f"folders/{folder['id']}").json()["shares"] == []
