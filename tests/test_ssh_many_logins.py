"""Many SSH logins at once against the shared GPU hub's SSH service, with asyncssh as the client on
loopback addresses of their own.

Failed ones (queue_service/ssh/login_throttle.py): 100 clients failing at once from one address
cost the hub a bounded number of token checks, while a user from another address logs in and
runs a command; the same wrong token twice costs the hub one check. The rules themselves, on a
clock the test moves: tests/test_login_throttle.py. The time of a good login during such an
attack: benchmarks/ssh_sftp.py.

Good ones: logins into one session at once all enter it (as VS Code's Remote-SSH opens several),
none told that the session is being saved (engine/container_calls.py, `ContainerLocks`)."""

from __future__ import annotations

import asyncio
import re
import secrets

import asyncssh
import pytest

from queue_service.ssh.login_throttle import CHECKS_PER_SOURCE

from .harness import QueueUser

pytestmark = [pytest.mark.docker, pytest.mark.hub]

LAB = {"image": "python-3.11", "cpu": 0.5, "mem": "256M"}
#: The shipped `QueueService.ssh_failed_logins_allowed`.
ALLOWED = 10
ATTACKERS = 100
#: The hub's log line of a token it refused to the service (`GET /hub/api/user`).
HUB_REFUSAL = re.compile(r"\b40[13] GET /hub/api/user ")


def hub_refusals(hub) -> int:
    return len(HUB_REFUSAL.findall(hub.log_text()))


async def log_in(hub, address: str, name: str, password: str, command: str = "true"):
    """asyncssh's client from `address`: the command's result, or the error of a refused login."""
    try:
        async with asyncssh.connect(
            "127.0.0.1",
            int(hub.env["FGPU_SSH_PORT"]),
            local_addr=(address, 0),
            username=name,
            password=password,
            known_hosts=None,
            client_keys=None,
            preferred_auth="password",
        ) as connection:
            return await connection.run(command)
    except (asyncssh.Error, OSError) as e:
        return e


@pytest.fixture(scope="module")
def dan(gpu_hub):
    """A user with a running session (no GPU)."""
    user = QueueUser(gpu_hub, f"dan-{secrets.token_hex(3)}")
    response = gpu_hub.start_server(user.name, LAB)
    assert response.status_code in (201, 202), response.text
    gpu_hub.wait_ready(user.name)
    user.token = user.http.headers["Authorization"].split()[1]
    return user


def test_a_source_that_keeps_failing_is_held_back_while_others_log_in(gpu_hub, dan):
    before = hub_refusals(gpu_hub)

    async def attack_and_log_in():
        # Well-formed tokens, each its own: only the hub can tell they are wrong.
        wrong = [
            log_in(gpu_hub, "127.0.0.2", dan.name, secrets.token_hex(16)) for _ in range(ATTACKERS)
        ]
        return await asyncio.gather(
            log_in(gpu_hub, "127.0.0.1", dan.name, dan.token, "echo in"), *wrong
        )

    good, *refused = asyncio.run(attack_and_log_in())
    assert isinstance(good, asyncssh.SSHCompletedProcess), good
    assert (good.exit_status, good.stdout) == (0, "in\n"), good.stderr
    assert all(isinstance(e, (asyncssh.Error, OSError)) for e in refused)
    # The hub was asked about the failures the source was allowed, and the few already in its
    # turns then; the rest were refused unchecked, or closed before the key exchange.
    checked = hub_refusals(gpu_hub) - before
    assert ALLOWED <= checked < ALLOWED + CHECKS_PER_SOURCE
    assert "failed logins from 127.0.0.2; its logins are refused for" in gpu_hub.log_text()


def test_the_same_wrong_token_again_costs_the_hub_no_check(gpu_hub, dan):
    wrong = secrets.token_hex(16)
    before = hub_refusals(gpu_hub)
    for _ in range(3):
        refused = asyncio.run(log_in(gpu_hub, "127.0.0.3", dan.name, wrong))
        assert isinstance(refused, asyncssh.PermissionDenied), refused
    assert hub_refusals(gpu_hub) - before == 1
    # Fewer failures than allowed: the right token from the same address still logs in.
    good = asyncio.run(log_in(gpu_hub, "127.0.0.3", dan.name, dan.token, "echo in"))
    assert isinstance(good, asyncssh.SSHCompletedProcess), good
    assert good.stdout == "in\n"


def test_logins_into_one_session_at_once_all_enter_it(gpu_hub, dan):
    async def at_once():
        return await asyncio.gather(
            *(log_in(gpu_hub, "127.0.0.1", dan.name, dan.token, f"echo {n}") for n in range(8))
        )

    runs = asyncio.run(at_once())
    assert [(r.exit_status, r.stdout, r.stderr) for r in runs] == [
        (0, f"{n}\n", "") for n in range(8)
    ], runs
