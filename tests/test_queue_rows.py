"""queue_service/store/queue_rows.py on a real SQLite file: the flush watchers hold what a
session flushes (the queue's pass reads it; tests/test_queue.py runs the pass on both databases)."""

from __future__ import annotations

import gc

from sqlalchemy.orm import sessionmaker

from queue_service.store import queue_rows
from queue_service.store.db import open_database
from queue_service.store.models import SessionRecord


def test_a_new_sessionmaker_at_a_dead_ones_address_still_holds_what_it_flushes(tmp_path):
    """SQLAlchemy keys its listener registry by `id(target)`, and an ended sessionmaker's entry
    lives on until the garbage collector frees its Session class (a reference cycle): a new
    sessionmaker at the same address once looked registered and got no listeners, so a pass lost
    the records it had flushed (the flaky quota test on PostgreSQL). Every sessionmaker is
    watched, whatever `id` it has."""
    url = f"sqlite:///{tmp_path / 'queue.sqlite'}"
    gc.disable()
    try:
        first = open_database(url)
        queue_rows.watch_flushes(first)
        address, engine = id(first), first.kw["bind"]
        del first
        reused = []
        for _ in range(10_000):
            maker = sessionmaker(engine, expire_on_commit=False)
            if id(maker) == address:
                break
            reused.append(maker)  # keep the others alive, so the address comes round
        assert id(maker) == address, "no new sessionmaker came at the old address"
        queue_rows.watch_flushes(maker)
        with maker.begin() as db:
            db.add(SessionRecord(id="a" * 32, seq=1, user="alice", image="x", cpu=1.0, mem=1))
            db.flush()
            assert "a" * 32 in queue_rows.flushed_and_deleted(db)[0]
    finally:
        gc.enable()
    engine.dispose()
