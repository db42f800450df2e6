"""Logins a site can trust, against a real hub.

- The demo login is for 127.0.0.1: on any other address the hub refuses to start and says why,
  unless the admin says so explicitly; on 127.0.0.1 any name gets in and `admin` is an admin.
- The guide's site recipe (docs/source/howto/configure.md) carries none of the demo's settings over.
- A user deleted and created again under the same name is a new account: the old account's home
  volume and private images are kept, and out of its reach.
"""

from __future__ import annotations

import re
import secrets
import time

import pytest
import requests

from .harness import TEST_LABEL, QueueUser, containers_with, refused_start, running_hub
from .test_jupyterhub_config import guide_site_recipe
from .test_storage import run_in, start_session

SITE_PASSWORD = "site-secret"

# Stands in for the recipe's PAM (which needs OS accounts): one password for every name, so that
# only the allow configuration decides who gets in.
SITE_LOGIN = f"""
from jupyterhub.auth import Authenticator

class SiteLogin(Authenticator):
    async def authenticate(self, handler, data):
        return data["username"] if data["password"] == {SITE_PASSWORD!r} else None

c.JupyterHub.authenticator_class = SiteLogin
"""


def form_login(hub, name: str, password: str = "any") -> int:
    """Log in through the hub's login form as a browser does; the answer's status (302: in)."""
    browser = requests.Session()
    page = browser.get(f"{hub.url}/hub/login", timeout=60)
    assert page.status_code == 200, page.text
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text).group(1)
    answer = browser.post(
        f"{hub.url}/hub/login",
        data={"username": name, "password": password, "_xsrf": xsrf},
        allow_redirects=False,
        timeout=60,
    )
    assert answer.status_code in (302, 403), answer.text
    return answer.status_code


def hub_user(hub, name: str) -> dict | None:
    response = hub.request("GET", f"users/{name}")
    if response.status_code == 404:
        return None
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.hub
def test_on_127_0_0_1_any_name_logs_in_and_admin_is_an_admin(hub):
    student = f"student-{secrets.token_hex(4)}"
    assert form_login(hub, student) == 302
    assert hub_user(hub, student)["admin"] is False
    assert form_login(hub, "admin") == 302
    assert hub_user(hub, "admin")["admin"] is True


@pytest.mark.hub
def test_the_demo_login_refuses_to_start_on_a_network_address(tmp_path):
    message = refused_start(tmp_path / "refused", env={"FGPU_HUB_IP": "0.0.0.0"})
    assert "Refusing to start: the demo login" in message
    assert "http://0.0.0.0:" in message and "FGPU_DEMO_LOGIN_ON_NETWORK=1" in message
    assert "Traceback" not in message


@pytest.mark.hub
def test_the_admin_can_run_the_demo_login_on_the_network_explicitly(tmp_path):
    env = {"FGPU_HUB_IP": "0.0.0.0", "FGPU_DEMO_LOGIN_ON_NETWORK": "1"}
    with running_hub(tmp_path / "allowed", env=env) as hub:
        assert form_login(hub, "anyone") == 302
        assert "anyone can log in as admin" in hub.log_text()


@pytest.mark.hub
def test_the_guide_site_recipe_inherits_no_demo_login_settings(tmp_path):
    recipe = guide_site_recipe().replace('load_subconfig("jupyterhub_config.py")', "")
    with running_hub(tmp_path / "site", extra_config=recipe + SITE_LOGIN) as hub:
        # The recipe's allow list decides: the demo's allow_all would have let anyone in.
        assert form_login(hub, "mallory", SITE_PASSWORD) == 403
        assert hub_user(hub, "mallory") is None
        assert form_login(hub, "alice", "wrong") == 403
        assert form_login(hub, "alice", SITE_PASSWORD) == 302
        assert hub_user(hub, "alice")["admin"] is False
        # `admin` is nobody here: not let in, never created, never an admin.
        assert form_login(hub, "admin", SITE_PASSWORD) == 403
        assert hub_user(hub, "admin") is None
        assert hub_user(hub, "teacher")["admin"] is True


def home_volume_of(container) -> str:
    (home,) = [m for m in container.attrs["Mounts"] if m["Destination"] == "/home/jovyan"]
    return home["Name"]


def listed_images(user: QueueUser) -> set[str]:
    response = user.call("GET", "images")
    assert response.status_code == 200, response.text
    return {image["name"] for image in response.json()["images"]}


@pytest.mark.docker
@pytest.mark.hub
def test_a_new_user_of_a_deleted_users_name_inherits_neither_home_nor_private_images(
    hub, username, docker_engine
):
    first = start_session(hub, username)
    run_in(first, "echo from the first account > ~/old-account.txt")
    old_home = home_volume_of(first)
    admin = QueueUser(hub, "admin")
    session_id = first.labels["fgpu.session_id"]
    committed = admin.call("POST", f"sessions/{session_id}/image", json={"tag": "t1"})
    assert committed.status_code == 201, committed.text
    private = committed.json()["catalog"]["name"]
    try:
        hub.stop_server(username)
        deleted = hub.request("DELETE", f"users/{username}")
        assert deleted.status_code == 204, deleted.text

        # A new account of the same name: a fresh home, the old one kept as it was.
        second = start_session(hub, username)
        new_home = home_volume_of(second)
        assert new_home != old_home and new_home.startswith(f"fgpu-home-{username}_u")
        assert run_in(second, "ls -A ~; test ! -e ~/old-account.txt && echo absent").endswith(
            "absent"
        )
        kept = docker_engine.containers.run(
            "fgpu/jupyter-base:py3.11",
            ["cat", "/old/old-account.txt"],
            volumes={old_home: {"bind": "/old", "mode": "ro"}},
            remove=True,
            labels={TEST_LABEL: hub.run_id},
        )
        assert kept.decode().strip() == "from the first account"

        # The old account's private image: not on the new account's spawn form, not startable,
        # and (once the service's 10 s user cache has the new account) not in its own listing;
        # admins still see it.
        offered = admin.call("GET", f"images?user={username}")
        assert offered.status_code == 200, offered.text
        assert private not in {image["name"] for image in offered.json()["images"]}
        refused = hub.start_server(
            username, {"image": private, "cpu": 0.5, "mem": "512M"}, server="old-image"
        )
        assert refused.status_code == 403, refused.text
        assert "earlier account" in refused.json()["message"]
        assert containers_with({"fgpu.user": username, "fgpu.server_name": "old-image"}) == []
        user = QueueUser(hub, username)
        deadline = time.monotonic() + 30
        while private in listed_images(user) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert private not in listed_images(user)
        assert private in {i["name"] for i in admin.call("GET", "images?all=1").json()["images"]}

        # An admin hands it over to the new account, which may then start it.
        handed = admin.call("PATCH", f"images/{private}", json={"owner": username})
        assert handed.status_code == 200, handed.text
        assert private in listed_images(user)
        started = hub.start_server(
            username, {"image": private, "cpu": 0.5, "mem": "512M"}, server="handed"
        )
        assert started.status_code in (201, 202), started.text
        hub.wait_ready(username, "handed")
    finally:
        admin.call("DELETE", f"images/{private}")
        docker_engine.images.remove(committed.json()["image"], force=True)
