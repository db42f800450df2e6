"""queue_service/repeated_requests.py, through a real QueueManager on SQLite and PostgreSQL: a
request asked again with its key costs no further pass, and claims nothing but itself."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from queue_service.queue import QueueManager, Refused
from queue_service.quotas import QuotaBook
from queue_service.store.db import open_database

from .test_queue import NODE, SETTINGS, ask


@pytest.fixture
def queue(db_url):
    db = open_database(db_url)
    yield QueueManager(db, (NODE,), SETTINGS, QuotaBook())
    db.kw["bind"].dispose()


def counting_passes(manager) -> list[int]:
    """How many writes (each a transaction and a pass) the manager makes from now on."""
    made = [0]
    change_and_pass = manager._change_and_pass

    def counted(*args):
        made[0] += 1
        return change_and_pass(*args)

    manager._change_and_pass = counted
    return made


async def test_asks_of_one_key_at_once_make_one_record_and_one_pass(queue):
    key = uuid.uuid4().hex
    passes = counting_passes(queue)
    views = await asyncio.gather(*(queue.submit(ask(id=key), groups=()) for _ in range(20)))
    assert {v["id"] for v in views} == {key}
    assert passes[0] == 1
    assert [s["id"] for s in queue.sessions()] == [key]
    # Asked again once it is in: answered from the record, still one pass.
    again = await queue.submit(ask(id=key), groups=())
    assert again["id"] == key and passes[0] == 1


async def test_a_key_claims_only_its_own_request_in_flight_or_answered(queue):
    key = uuid.uuid4().hex
    # Two requests under one key at once: one is queued, the other refused, whichever came first.
    both = await asyncio.gather(
        queue.submit(ask(id=key), groups=()),
        queue.submit(ask(id=key, cpu=2.0), groups=()),
        return_exceptions=True,
    )
    (made,) = [b for b in both if isinstance(b, dict)]
    (refused,) = [b for b in both if isinstance(b, Refused)]
    assert made["id"] == key and "belongs to another server or request" in str(refused)
    # Once it is in, another user's request under its key is refused, not answered with it.
    with pytest.raises(Refused, match="belongs to another server or request"):
        await queue.submit(ask(id=key, user="mallory", cpu=made["cpu"]), groups=())
    assert [s["user"] for s in queue.sessions()] == ["alice"]


async def test_a_released_request_asked_again_is_decided_by_the_queue_not_remembered(queue):
    key = uuid.uuid4().hex
    await queue.submit(ask(id=key), groups=())
    await queue.release(key)
    passes = counting_passes(queue)
    again = await queue.submit(ask(id=key), groups=())
    assert passes[0] == 1  # not answered from memory: the record has ended
    assert again["id"] == key and again["status"] in ("CANCELLED", "TERMINATED")
