"""A grant request asked again with its key, answered without another write.

The spawner asks again, with the same key, when its request timed out (queue_client.py). When a
class starts at once the first ask is still waiting its turn behind the others' passes when the
second comes, and each ask used to cost a pass over the whole line: the repeats of a burst of
2,000 kept the service busy for minutes after every request was in, and a release waited behind
them. Here an ask whose key is in flight waits for that first answer, and one whose record is
already active is answered from it, each only for the very request the key was made for (a key
can come from a user: it never claims another request).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Container

#: Keys of requests answered, remembered to tell a repeat: far more than a class asks at once.
ANSWERED_KEPT = 20_000


class RepeatedRequests:
    def __init__(self) -> None:
        self._in_flight: dict[str, tuple[dict, asyncio.Future]] = {}
        self._answered: OrderedDict[str, dict] = OrderedDict()

    def answer_of(self, key: str | None, request: dict, active: Container[str]):
        """An awaitable of the session id if `request` under `key` was asked before and is
        still in flight or active; None when this ask must be made."""
        if key is None:
            return None
        flight = self._in_flight.get(key)
        if flight is not None and flight[0] == request:
            return asyncio.shield(flight[1])
        if self._answered.get(key) == request and key in active:
            done = asyncio.get_running_loop().create_future()
            done.set_result(key)
            return done
        return None

    async def ask(self, key: str | None, request: dict, make: Callable[[], Awaitable[str]]) -> str:
        """`make()` the request, with repeats of it joining while it runs."""
        if key is None or key in self._in_flight:
            return await make()
        future = asyncio.ensure_future(make())
        self._in_flight[key] = (request, future)
        try:
            session_id = await asyncio.shield(future)
        finally:
            self._in_flight.pop(key, None)
        if session_id == key:
            self._answered[key] = request
            self._answered.move_to_end(key)
            while len(self._answered) > ANSWERED_KEPT:
                self._answered.popitem(last=False)
        return session_id
