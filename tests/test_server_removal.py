"""Removing ended sessions' named servers from the hub (queue_service/server_removal.py), on
SQLite and PostgreSQL. The hub here is a stand-in that keeps servers as the hub's REST API shows
them (tests/test_history_hub.py checks the real hub); time is a clock the test moves."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from queue_service.core.status import Status
from queue_service.hub_client import HubError
from queue_service.server_removal import ServerRemover, hub_server_state
from queue_service.store.db import open_database
from queue_service.store.models import SessionRecord

GIB = 1024**3
STOPPED = {"stopped": True, "ready": False, "pending": None}
RUNNING = {"stopped": False, "ready": True, "pending": None}
STOPPING = {"stopped": False, "ready": False, "pending": "stop"}


class HubServers:
    """The hub's servers by user, as `GET users/{name}?include_stopped_servers` answers them;
    `DELETE ... {"remove": true}` fails `failures` times with `status` first."""

    def __init__(self, servers: dict[str, dict[str, dict]], failures: int = 0, status: int = 500):
        self.servers, self.failures, self.status = servers, failures, status
        self.removed: list[tuple[str, str]] = []

    async def user_with_stopped_servers(self, name: str) -> dict:
        if name not in self.servers:
            raise HubError("No such user", 404)
        return {"name": name, "servers": dict(self.servers[name])}

    async def stop_server(self, user: str, server_name: str, remove: bool = False) -> int:
        assert remove, "only removals are asked for"
        if self.failures:
            self.failures -= 1
            raise HubError("the hub answered 500", self.status)
        del self.servers[user][server_name]
        self.removed.append((user, server_name))
        return 204


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def db(db_url):
    sessions = open_database(db_url)
    yield sessions
    sessions.kw["bind"].dispose()


def add(db, n: int, user: str, server: str, status=Status.TERMINATED) -> str:
    ended = datetime.now(UTC) - timedelta(minutes=10 - n) if status != Status.RUNNING else None
    key = f"{n:032x}"
    with db.begin() as s:
        s.add(
            SessionRecord(
                id=key, seq=n, user=user, server_name=server, status=status, image="x",
                cpu=1.0, mem=GIB, fgpu=0.0, reason="", ended=ended,
                end_reason="user" if ended else None,
            )
        )  # fmt: skip
    return key


def removed_marks(db) -> dict[str, bool]:
    with db() as s:
        return {r.id: r.server_removed is not None for r in s.scalars(select(SessionRecord))}


def remover(db, hub, active=(), **kwargs) -> ServerRemover:
    return ServerRemover(db, hub, lambda: set(active), **kwargs)


async def test_a_stopped_named_server_of_an_ended_session_is_removed_once(db):
    ended = add(db, 1, "ann", "s-aaaaaa")
    hub = HubServers({"ann": {"s-aaaaaa": STOPPED, "s-other": STOPPED}})

    assert await remover(db, hub).run_once() == [("ann", "s-aaaaaa")]
    assert await remover(db, hub).run_once() == []

    assert hub.removed == [("ann", "s-aaaaaa")]
    assert hub.servers["ann"] == {"s-other": STOPPED}  # not a session's: left alone
    assert removed_marks(db) == {ended: True}


async def test_a_server_still_stopping_is_removed_once_stopped(db):
    ended = add(db, 1, "ann", "s-aaaaaa")
    hub = HubServers({"ann": {"s-aaaaaa": STOPPING}})
    removal = remover(db, hub)

    assert await removal.run_once() == []
    assert removed_marks(db) == {ended: False}
    hub.servers["ann"]["s-aaaaaa"] = STOPPED
    assert await removal.run_once() == [("ann", "s-aaaaaa")]
    assert hub.removed == [("ann", "s-aaaaaa")]


async def test_a_name_a_newer_session_uses_is_never_removed(db):
    """The same server started again: its old record is settled, the running server kept."""
    old = add(db, 1, "ann", "s-aaaaaa")
    add(db, 2, "ann", "s-aaaaaa", status=Status.RUNNING)
    hub = HubServers({"ann": {"s-aaaaaa": RUNNING}})

    assert await remover(db, hub, active={("ann", "s-aaaaaa")}).run_once() == [("ann", "s-aaaaaa")]

    assert hub.removed == [] and hub.servers["ann"] == {"s-aaaaaa": RUNNING}
    assert removed_marks(db)[old] is True


async def test_the_default_server_and_gone_servers_and_users(db):
    default = add(db, 1, "ann", "")
    gone = add(db, 2, "ann", "s-gone")
    deleted_user = add(db, 3, "zed", "s-zzzzzz")
    hub = HubServers({"ann": {"": STOPPED}})

    assert sorted(await remover(db, hub).run_once()) == [("ann", "s-gone"), ("zed", "s-zzzzzz")]

    assert hub.removed == []
    assert removed_marks(db) == {default: False, gone: True, deleted_user: True}


async def test_a_failed_removal_is_logged_and_tried_again_later_without_holding_others(db, caplog):
    first = add(db, 1, "ann", "s-aaaaaa")
    other = add(db, 2, "bob", "s-bbbbbb")
    hub = HubServers({"ann": {"s-aaaaaa": STOPPED}, "bob": {"s-bbbbbb": STOPPED}}, failures=1)
    clock = Clock()
    removal = remover(db, hub, retry_after=60, clock=clock, log=logging.getLogger("test"))

    with caplog.at_level(logging.WARNING):
        assert await removal.run_once() == [("bob", "s-bbbbbb")]
    assert "could not remove ann's ended server(s) s-aaaaaa" in caplog.text
    assert removed_marks(db) == {first: False, other: True}
    clock.now += 30
    assert await removal.run_once() == []  # waits out the retry delay
    clock.now += 31
    assert await removal.run_once() == [("ann", "s-aaaaaa")]
    assert removed_marks(db) == {first: True, other: True}


async def test_a_hub_that_is_away_is_tried_again(db):
    class AwayHub(HubServers):
        async def user_with_stopped_servers(self, name):
            raise ConnectionRefusedError("connection refused")

    add(db, 1, "ann", "s-aaaaaa")
    clock = Clock()
    removal = remover(db, AwayHub({}), clock=clock, retry_after=5)
    assert await removal.run_once() == []
    clock.now += 6
    removal.hub = HubServers({"ann": {"s-aaaaaa": STOPPED}})
    assert await removal.run_once() == [("ann", "s-aaaaaa")]


def test_the_hubs_server_states():
    model = {"servers": {"a": STOPPED, "b": RUNNING, "c": STOPPING, "d": {"pending": "spawn"}}}
    states = {name: hub_server_state(model, name) for name in ("a", "b", "c", "d", "e")}
    assert states == {"a": "stopped", "b": "active", "c": "active", "d": "active", "e": "gone"}
