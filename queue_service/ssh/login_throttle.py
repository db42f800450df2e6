"""Failed SSH logins hold back their own source address, not anybody else's logins.

Each password login costs a call to the hub (`GET /hub/api/user` with the token) and each key
login a database read and a call; a client that fails again and again would queue that work in
front of everybody's logins and the service's own calls to the hub. So:

- a source address (an IPv6 client's /64: one host holds all of it) that has failed
  `allowed` logins is held back: its next connections are closed at once and its logins refused
  without a check, for 1 s, then 2, 4, ... up to `backoff_max` seconds after each further
  failure. Its first login that succeeds clears its record; so does `backoff_max` without one.
- one source has at most `CHECKS_PER_SOURCE` logins checked at a time; the others wait their
  turn on the event loop (no thread, no call), and a source held back meanwhile is refused when
  its turn comes;
- a token the hub refused is remembered (its SHA-256, never the token) for
  `FAILED_TOKEN_SECONDS`: the same wrong password again is refused without asking the hub. A
  token the hub does not know never becomes valid, so this refuses nothing that would pass.

Not by user name: tokens are random (128 bits), which no rate of guesses finds, and a name held
back would let anybody lock a student out of their own account.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import time
from dataclasses import dataclass

#: Logins of one source checked at once.
CHECKS_PER_SOURCE = 4
#: The first hold once a source has used up its failures; each further failure doubles it.
FIRST_HOLD_SECONDS = 1.0
#: How long a token the hub refused is refused without asking it.
FAILED_TOKEN_SECONDS = 600
#: Sources and refused tokens kept at most (the oldest go first).
MAX_KEPT = 100_000


def source_of(peername) -> str:
    """The address a connection is counted under: its IP address, an IPv4-mapped one as IPv4,
    an IPv6 one's /64."""
    address = peername[0] if peername else ""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return address
    if ip.version == 6 and ip.ipv4_mapped:
        return str(ip.ipv4_mapped)
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


@dataclass
class _Failures:
    count: int = 0
    last: float = 0.0
    #: Held back until (the clock's time).
    until: float = 0.0


class LoginThrottle:
    """Failed logins per source address, and the holds they earn."""

    def __init__(self, allowed: int, backoff_max: float, log, clock=time.monotonic):
        self.allowed = allowed
        self.backoff_max = backoff_max
        self.log = log
        self.clock = clock
        self._sources: dict[str, _Failures] = {}
        self._turns: dict[str, tuple[asyncio.Semaphore, list[int]]] = {}

    def held_back(self, source: str) -> bool:
        """Whether `source`'s logins are refused now, unchecked."""
        record = self._current(source)
        return record is not None and self.clock() < record.until

    @contextlib.asynccontextmanager
    async def turn(self, source: str):
        """Wait for one of `source`'s CHECKS_PER_SOURCE turns to check a login."""
        semaphore, users = self._turns.setdefault(
            source, (asyncio.Semaphore(CHECKS_PER_SOURCE), [0])
        )
        users[0] += 1
        try:
            async with semaphore:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._turns[source]

    def failed(self, source: str) -> None:
        record = self._current(source) or self._new(source)
        record.count += 1
        record.last = self.clock()
        over = record.count - self.allowed
        if over >= 0:
            hold = min(self.backoff_max, FIRST_HOLD_SECONDS * 2 ** min(over, 32))
            record.until = record.last + hold
            self.log.warning(
                "SSH: %d failed logins from %s; its logins are refused for %g s",
                record.count,
                source,
                hold,
            )

    def succeeded(self, source: str) -> None:
        self._sources.pop(source, None)

    def _current(self, source: str) -> _Failures | None:
        """`source`'s record, unless it is older than `backoff_max` and its hold is over."""
        record = self._sources.get(source)
        if record is not None and self.clock() - max(record.last, record.until) > self.backoff_max:
            del self._sources[source]
            return None
        return record

    def _new(self, source: str) -> _Failures:
        if len(self._sources) >= MAX_KEPT:
            del self._sources[next(iter(self._sources))]
        record = self._sources[source] = _Failures()
        return record


class RefusedTokens:
    """SHA-256 digests of tokens the hub refused lately (never the tokens)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._until: dict[bytes, float] = {}

    def __contains__(self, token: str) -> bool:
        until = self._until.get(_digest(token))
        return until is not None and self.clock() < until

    def add(self, token: str) -> None:
        digest = _digest(token)
        self._until.pop(digest, None)
        if len(self._until) >= MAX_KEPT:
            del self._until[next(iter(self._until))]
        self._until[digest] = self.clock() + FAILED_TOKEN_SECONDS


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
