"""The demo login only behind the loopback public address, on a real hub.

The hub's own port (`hub_ip:hub_port`: the session network's gateway on one host) serves
`/hub/login` and the token API as well, and every session reaches it. A container on the session
network, as a session is, must not log in there, as `admin` least of all, nor mint a token, even
when it writes `X-Forwarded-For: 127.0.0.1`; the same login at the public address still works.
"""

from __future__ import annotations

import json
import re
import secrets

import pytest
import requests

from fgpu_spawner.network import SESSION_NETWORK

from .harness import TEST_LABEL
from .test_security_auth import form_login, hub_user

# Run inside a container on the session network: the login page, a login through the form (with
# the XSRF token a page at the public address hands out), then an admin token asked for with a
# password in the body (the hub's token API takes that without a cookie). Prints each answer's
# status and text as JSON.
FROM_A_SESSION = r"""
import json, re, sys, urllib.request as r
from http.cookiejar import CookieJar
from urllib.error import HTTPError
from urllib.parse import urlencode

class Stay(r.HTTPRedirectHandler):
    def redirect_request(self, *args):
        return None

base, name, xsrf, cookie = sys.argv[1:5]
opener = r.build_opener(r.HTTPCookieProcessor(CookieJar()), Stay())
# Forged on every request: the hub's anonymous XSRF token is bound to the client's address.
opener.addheaders += [("X-Forwarded-For", "127.0.0.1"), ("X-Real-Ip", "127.0.0.1")]

def status(request):
    try:
        answer = opener.open(request, timeout=30)
        return [answer.status, answer.read().decode()]
    except HTTPError as e:
        return [e.code, e.read().decode()]

page = status(r.Request(base + "/hub/login"))
form = urlencode({"username": name, "password": "", "_xsrf": xsrf}).encode()
login = status(r.Request(base + "/hub/login", data=form, headers={"Cookie": "_xsrf=" + cookie}))
body = json.dumps({"auth": {"username": "admin", "password": ""}}).encode()
token = status(r.Request(base + "/hub/api/users/admin/tokens", data=body))
print(json.dumps({"page": page, "login": login, "token": token}))
"""


def hub_port(hub) -> int:
    """The hub's own port, which the test harness picks for each hub (harness._config_text)."""
    config = (hub.workdir / "test_config.py").read_text()
    return int(re.search(r"c\.JupyterHub\.hub_port = (\d+)", config).group(1))


def session_network_gateway(docker_engine) -> str:
    network = docker_engine.networks.get(SESSION_NETWORK)
    return network.attrs["IPAM"]["Config"][0]["Gateway"]


def public_login_form_xsrf(hub) -> tuple[str, str]:
    """The login form's XSRF token and cookie, as a page at the public address hands them out."""
    browser = requests.Session()
    page = browser.get(f"{hub.url}/hub/login", timeout=60)
    assert page.status_code == 200, page.text
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text).group(1)
    return xsrf, browser.cookies.get("_xsrf")


def admin_token_ids(hub) -> set[str]:
    response = hub.request("GET", "users/admin/tokens")
    assert response.status_code == 200, response.text
    return {token["id"] for token in response.json()["api_tokens"]}


@pytest.mark.docker
@pytest.mark.hub
def test_a_session_cannot_use_the_demo_login_on_the_hubs_own_port(hub, docker_engine):
    hub_url = f"http://{session_network_gateway(docker_engine)}:{hub_port(hub)}"
    student = f"mallory-{secrets.token_hex(4)}"
    tokens_before = admin_token_ids(hub)
    xsrf, cookie = public_login_form_xsrf(hub)
    output = docker_engine.containers.run(
        "fgpu/jupyter-base:py3.11",
        ["python", "-c", FROM_A_SESSION, hub_url, student, xsrf, cookie],
        network=SESSION_NETWORK,
        labels={TEST_LABEL: hub.run_id},
        remove=True,
    )
    answers = json.loads(output.decode().strip().splitlines()[-1])

    for asked in ("page", "login"):
        status, text = answers[asked]
        assert status == 403, answers
        assert "demo login is taken only at http://127.0.0.1:" in text
    assert answers["token"][0] == 403, answers
    # Nothing left behind: no account of that name, no new admin token.
    assert hub_user(hub, student) is None
    assert admin_token_ids(hub) == tokens_before
    assert "Demo login refused from" in hub.log_text()

    # The same login at the public address (the proxy on 127.0.0.1) still gets in.
    assert form_login(hub, student) == 302
    assert hub_user(hub, student)["admin"] is False
