"""Stopping spawns that wait in the queue, many at once, through the hub's REST API: each stop
answers 202 or 204, and leaves nothing behind (no server listed, no live queue record, no
container). A stop the hub answered 500 left the server listed as running with nothing behind it."""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from .harness import QueueUser, containers_with, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.hub]
SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "256M", "fgpu": 1}
STUDENTS = 100
SERVERS_PER_STUDENT = 2  # the shipped pending quota
LIVE = {"PENDING", "SCHEDULED", "RUNNING"}


@pytest.fixture
def held_gpu(one_gpu_hub):
    """An admin whose running session holds the hub's only GPU: every further 1 fGPU waits."""
    admin = f"admin-{secrets.token_hex(3)}"
    response = one_gpu_hub.request("POST", f"users/{admin}", json={"admin": True})
    assert response.status_code == 201, response.text
    response = one_gpu_hub.start_server(admin, SESSION)
    assert response.status_code in (201, 202), response.text
    one_gpu_hub.wait_ready(admin)
    yield QueueUser(one_gpu_hub, admin)
    one_gpu_hub.stop_server(admin)


def test_stopping_many_waiting_spawns_at_once_leaves_no_ghosts(one_gpu_hub, held_gpu):
    hub, watcher = one_gpu_hub, held_gpu
    users = [f"waiter-{secrets.token_hex(3)}" for _ in range(STUDENTS)]
    for user in users:
        hub.create_user(user)
    targets = [(user, f"s{i}") for user in users for i in range(SERVERS_PER_STUDENT)]

    def mine(sessions):
        return [s for s in sessions if s["user"] in users and s["status"] in LIVE]

    def call(method, target):
        user, server = target
        url = f"{hub.url}/hub/api/users/{user}/servers/{server}"
        body = SESSION if method == "POST" else None
        return requests.request(
            method, url, json=body, headers=dict(hub.api.headers), timeout=180
        ).status_code

    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        started = list(pool.map(lambda t: call("POST", t), targets))
    assert set(started) <= {201, 202}, started
    waiting = watcher.wait_for(lambda s: len(mine(s)) == len(targets), timeout=180)
    assert {s["status"] for s in mine(waiting)} == {"PENDING"}

    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        stopped = list(pool.map(lambda t: call("DELETE", t), targets))
    refused = [t for t, code in zip(targets, stopped, strict=True) if code not in (202, 204)]
    assert refused == [], f"{len(refused)} of {len(targets)} stops refused: {sorted(set(stopped))}"

    wait_until(
        lambda: not mine(watcher.sessions()), 120, "every waiting record ended", interval=0.5
    )
    # The hub lets its stops finish on its own time; a ghost never goes.
    wait_until(
        lambda: not {u for u, _ in hub.active_servers()} & set(users),
        60,
        "the waiters' servers gone from the hub",
        interval=0.5,
    )
    assert [c for user in users for c in containers_with({"fgpu.user": user})] == []
    ended = [s for s in watcher.sessions() if s["user"] in users]
    assert {s["status"] for s in ended} <= {"CANCELLED"}, ended
