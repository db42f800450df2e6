"""fgpu_spawner/named_servers.py, on its own: what counts against the limit, and the user taken from
the hub's loaded users without another query. A real hub's answers are in test_security_limits.py
and test_security_handlers.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from tornado import web

from fgpu_spawner.named_servers import ActiveNamedServerLimit


def spawner(active: bool = True, batch: bool = False, pending: str | None = None):
    options = {"type": "batch"} if batch else {}
    return SimpleNamespace(active=active, user_options=options, pending=pending)


class Handler:
    """What the limit reads of JupyterHub's handler: the path, the body, and the users it holds."""

    def __init__(self, user, server: str, body: dict | None = None, loaded: bool = True):
        self.path_args = [user.name, server]
        self.request = SimpleNamespace(body=json.dumps(body or {}).encode())
        self.users = {7: user} if loaded else {}
        self.found = []
        self._user = user

    def find_user(self, name):
        self.found.append(name)
        return self._user if name == self._user.name else None


def user(**spawners):
    return SimpleNamespace(name="ana", spawners=spawners)


def test_running_and_waiting_servers_count_and_stopped_ones_do_not():
    ana = user(a=spawner(), b=spawner(active=False), c=spawner())
    assert ActiveNamedServerLimit(3)(Handler(ana, "new")) == 0
    with pytest.raises(web.HTTPError) as refused:
        ActiveNamedServerLimit(2)(Handler(ana, "new"))
    assert refused.value.status_code == 400
    assert "already has 2 named servers running or waiting" in refused.value.log_message


def test_a_waiting_batch_job_counts_only_against_the_jobs_room():
    ana = user(a=spawner(), job=spawner(batch=True, pending="spawn"))
    assert ActiveNamedServerLimit(2)(Handler(ana, "new")) == 0
    with pytest.raises(web.HTTPError):
        ActiveNamedServerLimit(1, jobs_waiting=1)(Handler(ana, "j2", body={"type": "batch"}))


def test_the_user_the_hub_holds_is_used_without_another_lookup():
    ana = user(a=spawner())
    held = Handler(ana, "new")
    ActiveNamedServerLimit(5)(held)
    assert held.found == []
    not_held = Handler(ana, "new", loaded=False)
    ActiveNamedServerLimit(5)(not_held)
    assert not_held.found == ["ana"]


def test_a_page_that_only_shows_the_number_gets_it():
    handler = SimpleNamespace(path_args=[], request=None)
    assert ActiveNamedServerLimit(4)(handler) == 4
