"""The SSH login throttle's rules (queue_service/ssh/login_throttle.py) on a clock the test moves:
a source is held back once it has used up its failures, for twice as long after each further
one, up to the most; a success or a quiet spell clears it; one source's turns are bounded; a
token the hub refused is known again by its digest. With a real hub and clients:
tests/test_ssh_many_logins.py."""

from __future__ import annotations

import asyncio
import logging

from queue_service.hub_client import HubClient
from queue_service.ssh.hub_logins import TokenLogins
from queue_service.ssh.login_throttle import (
    CHECKS_PER_SOURCE,
    FAILED_TOKEN_SECONDS,
    LoginThrottle,
    RefusedTokens,
    source_of,
)
from queue_service.ssh.server import HubLogin

from .harness import free_port

LOG = logging.getLogger("test")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def throttle(allowed: int = 3, hold_max: float = 10.0) -> tuple[LoginThrottle, Clock]:
    clock = Clock()
    return LoginThrottle(allowed, hold_max, LOG, clock), clock


def test_a_source_is_held_back_after_its_failures_for_longer_each_time_up_to_the_most():
    rules, clock = throttle()
    for _ in range(2):
        rules.failed("10.0.0.1")
    assert not rules.held_back("10.0.0.1")
    holds = []
    for _ in range(6):
        rules.failed("10.0.0.1")
        start = clock.now
        while rules.held_back("10.0.0.1"):
            clock.now += 0.5
        holds.append(clock.now - start)
    assert holds == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert not rules.held_back("10.0.0.2")  # nobody else


def test_a_success_or_a_quiet_spell_clears_a_source():
    rules, clock = throttle(allowed=2)
    rules.failed("10.0.0.1")
    rules.succeeded("10.0.0.1")
    rules.failed("10.0.0.1")
    assert not rules.held_back("10.0.0.1")  # one failure since the success
    rules.failed("10.0.0.1")
    assert rules.held_back("10.0.0.1")
    clock.now += 1 + 10.5  # the hold, then longer than the longest hold without a failure
    rules.failed("10.0.0.1")
    assert not rules.held_back("10.0.0.1")  # counted from one again


def test_one_source_has_a_bounded_number_of_checks_at_once_and_others_are_not_held():
    rules, _ = throttle()
    inside = {"a": 0, "b": 0}
    most = {"a": 0, "b": 0}

    async def check(source: str, release: asyncio.Event) -> None:
        async with rules.turn(source):
            inside[source] += 1
            most[source] = max(most[source], inside[source])
            await release.wait()
            inside[source] -= 1

    async def run() -> None:
        release_a, release_b = asyncio.Event(), asyncio.Event()
        waiting = [asyncio.create_task(check("a", release_a)) for _ in range(20)]
        await asyncio.sleep(0)
        other = asyncio.create_task(check("b", release_b))
        await asyncio.sleep(0)
        assert inside == {"a": CHECKS_PER_SOURCE, "b": 1}  # b is not behind a's queue
        release_b.set()
        release_a.set()
        await asyncio.gather(*waiting, other)

    asyncio.run(run())
    assert most == {"a": CHECKS_PER_SOURCE, "b": 1}


def test_addresses_are_counted_per_host():
    assert source_of(("192.0.2.7", 40000)) == "192.0.2.7"
    assert source_of(("::ffff:192.0.2.7", 40000, 0, 0)) == "192.0.2.7"
    assert source_of(("2001:db8:1:2:aaaa::1", 40000, 0, 0)) == "2001:db8:1:2::/64"
    assert source_of(("2001:db8:1:2:bbbb::9", 1, 0, 0)) == source_of(("2001:db8:1:2::5", 2, 0, 0))
    assert source_of(None) == ""


def test_a_refused_token_is_known_again_for_a_while_by_its_digest_only():
    clock = Clock()
    refused = RefusedTokens(clock)
    refused.add("0123456789abcdef")
    assert "0123456789abcdef" in refused
    assert "0123456789abcdeg" not in refused
    assert all(b"0123456789abcdef" not in digest for digest in refused._until)
    clock.now += FAILED_TOKEN_SECONDS + 1
    assert "0123456789abcdef" not in refused


def test_a_hub_that_does_not_answer_holds_back_nobody():
    """Logins refused because the hub is down (restarting, say) are no failures of the source's:
    a class is not held back for the hub's restart. A real HubClient, on a port nobody serves."""
    hub = HubClient(f"http://127.0.0.1:{free_port()}/hub/api", "service-token")
    rules, _ = throttle(allowed=1)
    login = HubLogin(TokenLogins(hub, keys=None, log=LOG), rules, forwards=None)
    login.source = "10.0.0.1"

    async def three_logins() -> list[bool]:
        return [await login.validate_password("ann", "0123456789abcdef" * 2) for _ in range(3)]

    assert asyncio.run(three_logins()) == [False] * 3
    assert not rules.held_back("10.0.0.1")
