"""The usage figures (`GET usage`, its CSV) and the cluster's utilization (`GET utilization`),
tried with a victim's cookie from another site, against the real hub and service: a script on
another origin reads neither, the service's own pages still do."""

from __future__ import annotations

import pytest

from .test_security_handlers import EVIL, Browser

pytestmark = [pytest.mark.docker, pytest.mark.hub]
SCRIPTED = {**EVIL, "Sec-Fetch-Mode": "cors"}


@pytest.mark.parametrize("path", ["usage", "usage?format=csv"])
def test_a_cross_site_script_cannot_read_a_students_usage_with_her_cookie(hub, username, path):
    victim = Browser(hub, username)
    assert victim.call("GET", path, headers=SCRIPTED).status_code == 403
    assert victim.own_page_call("GET", path).status_code == 200


def test_a_cross_site_script_cannot_read_the_clusters_utilization_with_an_admins_cookie(hub):
    admin = Browser(hub, "admin")
    assert admin.call("GET", "utilization?hours=1", headers=SCRIPTED).status_code == 403
    assert admin.own_page_call("GET", "utilization?hours=1").status_code == 200
