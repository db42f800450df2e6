"""QueueManager against real databases: SQLite and PostgreSQL (the `db_url` fixture runs both).

One node with 4 CPU cores, 8 GiB and one 8 GiB GPU at 2 fGPU per GPU: the seed's walk-through.
No hub and no Docker here; the only test double is a stand-in for the hub's REST API in the group
quota test.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import threading
import time
from datetime import datetime
from types import SimpleNamespace

import pytest
from sqlalchemy import event, update

from queue_service.core import placement, resource_model
from queue_service.core.status import Status
from queue_service.engine.session_containers import DockerSessionLister
from queue_service.queue import QueueManager, Refused
from queue_service.queue_pass import SchedulerSettings
from queue_service.quotas import QuotaBook
from queue_service.reconciler import Reconciler
from queue_service.store.db import open_database
from queue_service.store.models import SessionRecord

MIB = 1024**2
GIB = 1024**3
GPU = "GPU-00000000-0000-0000-0000-000000000001"
NODE = resource_model.Node(
    "node-1", "default", cpu=4.0, mem=8 * GIB, gpus=(resource_model.Gpu(GPU, 8 * GIB, 80),)
)
SETTINGS = SchedulerSettings(units_per_gpu=2)
#: Fields of a session's view that come from the DB alone (position is the last pass's answer).
STORED = ("id", "user", "server_name", "status", "image", "cpu", "mem", "fgpu", "grant", "reason")


@pytest.fixture
def open_manager(db_url):
    """Open a QueueManager on this test's database; each call is a fresh service instance."""
    engines = []

    def open_(settings=SETTINGS, quotas=None, nodes=(NODE,)) -> QueueManager:
        db = open_database(db_url)
        engines.append(db.kw["bind"])
        return QueueManager(db, nodes, settings, quotas if quotas is not None else QuotaBook())

    yield open_
    for engine in engines:
        engine.dispose()


@pytest.fixture
def manager(open_manager) -> QueueManager:
    return open_manager()


def ask(user="alice", server="", fgpu=1.0, cpu=0.5, mem=512 * MIB, **extra) -> dict:
    return {
        "user": user,
        "server_name": server,
        "image": "python-3.11",
        "cpu": cpu,
        "mem": mem,
        "fgpu": fgpu,
        **extra,
    }


async def submit_three(manager: QueueManager) -> list[dict]:
    return [await manager.submit(ask(server=f"s{i}"), groups=()) for i in range(3)]


def gpu_use(sessions: list[dict]) -> dict[str, float]:
    used: dict[str, float] = {}
    for session in sessions:
        for uuid, fraction in (session["grant"] or {}).get("gpus", {}).items():
            used[uuid] = used.get(uuid, 0.0) + fraction
    return used


# -- the seed's walk-through ------------------------------------------------------------------


async def test_walk_through_two_granted_one_pending(manager):
    first, second, third = await submit_three(manager)

    for granted in (first, second):
        assert granted["status"] == Status.SCHEDULED
        assert granted["grant"] == {
            "session_id": granted["id"],
            "node": "node-1",
            "gpus": {GPU: 0.5},
        }
        assert granted["position"] is None
        assert granted["gpu_memory"] == {GPU: 8 * GIB}
    assert third["status"] == Status.PENDING
    assert third["grant"] is None
    assert third["position"] == 1
    assert "fGPU" in third["reason"], third["reason"]
    assert [s["id"] for s in manager.sessions()] == [first["id"], second["id"], third["id"]]


async def test_a_request_waiting_for_room_hears_of_a_node_withheld_for_its_isolation(manager):
    await manager.replace_nodes([NODE], withheld={"gpu-7": ["icc"]})
    *_, third = await submit_three(manager)
    assert third["status"] == Status.PENDING
    assert "fGPU" in third["reason"], third["reason"]
    assert third["reason"].endswith(
        "; node gpu-7 takes no sessions until an admin fixes its engine's isolation settings"
    )
    # Fixed: the next inventory has no withheld node, and the reason no longer names it.
    await manager.replace_nodes([NODE])
    await manager.schedule()
    assert "gpu-7" not in (await manager.get(third["id"]))["reason"]


async def test_release_grants_the_pending_inside_the_release_call(manager):
    first, _, third = await submit_three(manager)

    released = await manager.release(first["id"])

    assert released["status"] == Status.TERMINATED
    assert released["ended"] is not None
    # No schedule() call in between: the release itself ran the pass.
    now = await manager.get(third["id"])
    assert now["status"] == Status.SCHEDULED
    assert now["grant"]["gpus"] == {GPU: 0.5}
    assert now["position"] is None
    assert gpu_use(manager.sessions()) == {GPU: 1.0}


async def test_wait_returns_as_soon_as_the_record_changes(manager):
    first, _, third = await submit_three(manager)
    waiter = asyncio.create_task(manager.wait(third["id"], third["version"], timeout=30))
    await asyncio.sleep(0.05)
    assert not waiter.done(), "wait() returned with nothing changed"

    started = time.monotonic()
    await manager.release(first["id"])
    view = await asyncio.wait_for(waiter, 1.0)

    assert time.monotonic() - started < 1.0
    assert view["status"] == Status.SCHEDULED
    assert view["version"] != third["version"]


async def test_wait_times_out_with_the_unchanged_record(manager):
    *_, third = await submit_three(manager)

    started = time.monotonic()
    view = await manager.wait(third["id"], third["version"], timeout=0.2)

    assert 0.15 < time.monotonic() - started < 2
    assert view["status"] == Status.PENDING
    assert view["version"] == third["version"]


async def test_two_hundred_concurrent_submits_never_overbook(manager):
    views = await asyncio.gather(
        *(manager.submit(ask(user=f"user{i}"), groups=()) for i in range(200))
    )

    scheduled = [v for v in views if v["status"] == Status.SCHEDULED]
    assert [v["id"] for v in scheduled] == [views[0]["id"], views[1]["id"]]
    sessions = manager.sessions()
    assert len(sessions) == 200
    by_status = {
        s: [v for v in sessions if v["status"] == s] for s in (Status.SCHEDULED, Status.PENDING)
    }
    assert len(by_status[Status.SCHEDULED]) == 2
    assert len(by_status[Status.PENDING]) == 198
    assert all(used <= 1.0 + 1e-9 for used in gpu_use(sessions).values())
    assert gpu_use(sessions) == {GPU: 1.0}
    positions = sorted(v["position"] for v in by_status[Status.PENDING])
    assert positions == list(range(1, 199))
    # Queue order is submit order: the earliest pending request is first in line.
    pending = by_status[Status.PENDING]
    assert [v["position"] for v in pending] == list(range(1, 199))


# -- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "words"),
    [
        ({"fgpu": 3.0}, ["never start", "3 fGPU", "2 fGPU"]),
        ({"cpu": 5.0}, ["never start", "5 CPU cores", "4 CPU cores"]),
        ({"mem": 16 * GIB}, ["never start", "16 GiB memory", "8 GiB memory"]),
    ],
    ids=["fgpu", "cpu", "mem"],
)
async def test_a_request_bigger_than_any_node_is_refused_and_not_recorded(manager, asked, words):
    with pytest.raises(Refused) as refused:
        await manager.submit(ask(**asked), groups=())

    assert refused.value.cause == "capacity"
    for word in words:
        assert word in refused.value.message, refused.value.message
    assert (await manager.history()) == []


async def test_a_refused_restart_leaves_the_running_session_alone(manager):
    held = await manager.submit(ask(server="lab"), groups=())

    with pytest.raises(Refused):
        await manager.submit(ask(server="lab", cpu=64.0), groups=())

    assert (await manager.get(held["id"]))["status"] == Status.SCHEDULED
    assert [s["id"] for s in (await manager.history())] == [held["id"]]


async def test_a_malformed_request_is_refused(manager):
    with pytest.raises(Refused, match="Malformed"):
        await manager.submit({"user": "alice", "image": "python-3.11", "cpu": "lots"}, groups=())
    assert (await manager.history()) == []


# -- cancel and release ------------------------------------------------------------------------


async def test_releasing_a_pending_request_cancels_it(manager):
    *granted, third = await submit_three(manager)

    cancelled = await manager.release(third["id"])

    assert cancelled["status"] == Status.CANCELLED
    assert cancelled["end_reason"] == "cancelled"
    assert cancelled["ended"] is not None
    assert cancelled["position"] is None
    assert cancelled["grant"] is None
    assert [s["id"] for s in manager.sessions()] == [g["id"] for g in granted]
    assert third["id"] in [s["id"] for s in (await manager.history())]


async def test_release_is_idempotent(manager):
    first, _, third = await submit_three(manager)
    once = await manager.release(first["id"])
    promoted = await manager.get(third["id"])

    twice = await manager.release(first["id"])

    assert (once["released_from"], twice["released_from"]) == (Status.SCHEDULED, None)
    assert (once["status"], once["end_reason"]) == (Status.TERMINATED, "user")
    assert twice == {**once, "released_from": None}
    assert (await manager.get(third["id"])) == promoted
    cancelled = await manager.release(third["id"])
    assert cancelled["status"] == Status.TERMINATED
    assert (await manager.release(third["id"])) == {**cancelled, "released_from": None}


async def test_release_of_an_unknown_session_is_a_key_error(manager):
    with pytest.raises(KeyError):
        await manager.release("0" * 32)
    with pytest.raises(KeyError):
        (await manager.get("0" * 32))


async def test_release_where_ends_with_the_reason_and_schedules(manager):
    first, _, third = await submit_three(manager)

    await manager.release_where([first["id"]], Status.ERROR, "the container stopped")

    ended = await manager.get(first["id"])
    assert (ended["status"], ended["reason"]) == (Status.ERROR, "the container stopped")
    assert ended["end_reason"] == "error"  # the status's own code, when none is named
    assert (await manager.get(third["id"]))["status"] == Status.SCHEDULED


async def test_release_where_keeps_the_code_it_is_given(manager):
    first, second, _ = await submit_three(manager)

    await manager.release_where([first["id"]], Status.TERMINATED, "idle for 1 h", end_reason="idle")
    await manager.release_where([second["id"]], Status.TERMINATED, "node gone", end_reason="lost")

    assert [(await manager.get(s["id"]))["end_reason"] for s in (first, second)] == ["idle", "lost"]
    assert (await manager.get(first["id"]))["reason"] == "idle for 1 h"


async def test_a_release_names_its_code_and_a_failed_start_ends_as_error(manager):
    first, second, third = await submit_three(manager)

    failed = await manager.release(first["id"], "error", "the container exited with code 3")
    stopped = await manager.release(second["id"], "reclaimed")

    assert (failed["status"], failed["end_reason"]) == (Status.ERROR, "error")
    assert failed["reason"] == "the container exited with code 3"
    assert (stopped["status"], stopped["end_reason"]) == (Status.TERMINATED, "reclaimed")
    assert (await manager.get(third["id"]))["status"] == Status.SCHEDULED


async def test_an_expected_end_names_the_release_that_follows(manager):
    """An admin's stop goes through the hub, whose spawner releases without knowing who asked:
    the code said beforehand is the one recorded, over the release's own."""
    first, second, third = await submit_three(manager)
    manager.expect_end(first["id"], "admin", "stopped by root (an admin)")
    manager.expect_end(third["id"], "admin")
    manager.expect_end(second["id"], "admin")
    manager.forget_expected_end(second["id"])  # the hub refused that stop

    cancelled = await manager.release(third["id"])
    ended = await manager.release(first["id"], "error", "exited")
    plain = await manager.release(second["id"])

    assert (ended["status"], ended["end_reason"]) == (Status.TERMINATED, "admin")
    assert ended["reason"] == "stopped by root (an admin)"
    assert (cancelled["status"], cancelled["end_reason"]) == (Status.CANCELLED, "admin")
    assert plain["end_reason"] == "user"
    # Spent once used: a later end of the same id is not taken for the admin's.
    assert manager._expected_ends == {}


async def test_a_request_that_can_never_fit_ends_as_error(open_manager):
    manager = open_manager(nodes=())
    manager.set_nodes([NODE])
    waiting = [await manager.submit(ask(server=f"s{i}", fgpu=2.0), groups=()) for i in range(2)]
    assert waiting[1]["status"] == Status.PENDING
    manager.set_nodes([resource_model.Node("small", "default", 4.0, 8 * GIB, ())])
    await manager.schedule()

    ended = await manager.get(waiting[1]["id"])
    assert (ended["status"], ended["end_reason"]) == (Status.ERROR, "error")


# -- restarts ----------------------------------------------------------------------------------


async def test_a_restarted_service_finds_the_queue_as_it_was(open_manager):
    before = open_manager()
    first, second, third = await submit_three(before)
    await before.mark_running(first["id"])
    snapshot = before.sessions()

    after = open_manager()  # a service restart: same database, new process state

    restored = after.sessions()
    assert [{k: s[k] for k in STORED} for s in restored] == [
        {k: s[k] for k in STORED} for s in snapshot
    ]
    assert [s["started"] for s in restored] == [s["started"] for s in snapshot]
    await after.schedule()
    assert (await after.get(third["id"]))["status"] == Status.PENDING
    assert (await after.get(third["id"]))["position"] == 1
    assert gpu_use(after.sessions()) == {GPU: 1.0}, "a restart must not double-book the GPU"

    # The old process committed a release and died before its scheduling pass: the new one's
    # first pass hands the freed slice to the waiting request.
    with after.db.begin() as db:
        db.execute(
            update(SessionRecord)
            .where(SessionRecord.id == second["id"])
            .values(status=Status.TERMINATED)
        )
    assert (await after.get(third["id"]))["status"] == Status.PENDING
    await after.schedule()
    assert (await after.get(third["id"]))["status"] == Status.SCHEDULED
    assert (await after.get(third["id"]))["grant"]["gpus"] == {GPU: 0.5}

    # New requests keep queue order after the restart.
    fourth = await after.submit(ask(server="s3"), groups=())
    assert fourth["status"] == Status.PENDING
    assert fourth["position"] == 1


async def test_a_new_start_of_the_same_server_supersedes_the_old_record(manager):
    old = await manager.submit(ask(server="lab", fgpu=2.0), groups=())
    assert old["status"] == Status.SCHEDULED

    new = await manager.submit(ask(server="lab", fgpu=1.0), groups=())

    assert new["id"] != old["id"]
    # The old grant was given back in the same step, so the new one fits at once.
    assert new["status"] == Status.SCHEDULED
    assert new["grant"]["gpus"] == {GPU: 0.5}
    ended = await manager.get(old["id"])
    assert ended["status"] == Status.TERMINATED
    assert "superseded" in ended["reason"]
    assert ended["end_reason"] == "superseded"
    assert [s["id"] for s in manager.sessions()] == [new["id"]]
    # Another server of the same user is not touched.
    other = await manager.submit(ask(server="other", fgpu=2.0), groups=())
    assert (await manager.get(new["id"]))["status"] == Status.SCHEDULED
    assert other["status"] == Status.PENDING


async def test_the_same_start_issued_again_adopts_its_record(manager):
    """A spawn re-issued after a hub restart keeps its grant, or its place in line."""
    granted = await manager.submit(ask(server="lab", fgpu=2.0), groups=())
    waiting = await manager.submit(ask(server="later", fgpu=2.0), groups=())
    assert (granted["status"], waiting["status"]) == (Status.SCHEDULED, Status.PENDING)

    assert (await manager.submit(ask(server="lab", fgpu=2.0), groups=()))["id"] == granted["id"]
    again = await manager.submit(ask(server="later", fgpu=2.0), groups=())
    assert (again["id"], again["status"], again["position"]) == (waiting["id"], Status.PENDING, 1)
    assert len(manager.sessions()) == 2


async def test_a_request_that_waits_too_long_times_out(open_manager):
    manager = open_manager(SchedulerSettings(units_per_gpu=2, pending_timeout=0.25))
    first, _, third = await submit_three(manager)
    assert third["status"] == Status.PENDING

    await asyncio.sleep(0.4)
    await manager.schedule()

    ended = await manager.get(third["id"])
    assert ended["status"] == Status.PENDING_TIMEOUT
    assert ended["end_reason"] == "pending_timeout"
    assert "waited over 0.25 s" in ended["reason"]
    assert ended["ended"] is not None
    # Only waiting requests time out; granted ones keep their slice.
    assert (await manager.get(first["id"]))["status"] == Status.SCHEDULED
    await manager.release(first["id"])
    assert (await manager.get(third["id"]))["status"] == Status.PENDING_TIMEOUT


async def test_a_request_times_out_in_a_pass_about_another_resource_group(open_manager):
    """A pass considers again only the requests its change concerns, but timeouts run over
    every waiting one: a submit elsewhere ends the request that waited too long."""
    lab = resource_model.Node(
        "node-2", "lab", 4.0, 8 * GIB, (resource_model.Gpu("GPU-lab", 8 * GIB),)
    )
    settings = SchedulerSettings(units_per_gpu=2, pending_timeout=0.25)
    manager = open_manager(settings, nodes=(NODE, lab))
    asked = [ask(server=f"s{i}", resource_group="default") for i in range(3)]
    _, _, third = [await manager.submit(request, groups=()) for request in asked]
    assert third["status"] == Status.PENDING

    await asyncio.sleep(0.4)
    elsewhere = await manager.submit(ask(user="bob", resource_group="lab"), groups=())

    assert elsewhere["status"] == Status.SCHEDULED
    ended = await manager.get(third["id"])
    assert (ended["status"], ended["reason"]) == (Status.PENDING_TIMEOUT, "waited over 0.25 s")
    assert third["id"] not in {s["id"] for s in manager.sessions()}


# -- quotas ------------------------------------------------------------------------------------


async def test_a_user_quota_keeps_the_second_request_waiting(open_manager):
    manager = open_manager(quotas=QuotaBook(user_default={"fgpu": 1}))
    first = await manager.submit(ask(server="a"), groups=())
    second = await manager.submit(ask(server="b"), groups=())
    others = await manager.submit(ask(user="bob"), groups=())

    assert first["status"] == Status.SCHEDULED
    assert second["status"] == Status.PENDING
    assert "quota" in second["reason"] and "fGPU" in second["reason"], second["reason"]
    # Room was free, and another user took it: the quota, not the GPU, held the request back.
    assert others["status"] == Status.SCHEDULED

    await manager.release(first["id"])
    assert (await manager.get(second["id"]))["status"] == Status.SCHEDULED


async def test_a_request_above_the_whole_user_quota_is_refused(open_manager):
    manager = open_manager(quotas=QuotaBook(user_default={"fgpu": 1}))

    with pytest.raises(Refused) as refused:
        await manager.submit(ask(fgpu=2.0), groups=())

    assert refused.value.cause == "quota"
    assert "quota" in refused.value.message
    assert "never start" in refused.value.message
    assert (await manager.history()) == []


async def test_a_pending_count_quota_refuses_one_more_waiting_request(open_manager):
    manager = open_manager(quotas=QuotaBook(user_default={"pending": 1}))
    await manager.submit(ask(user="bob", server="a", fgpu=2.0), groups=())
    waiting = await manager.submit(ask(server="a"), groups=())
    assert waiting["status"] == Status.PENDING

    with pytest.raises(Refused) as refused:
        await manager.submit(ask(server="b"), groups=())

    assert refused.value.cause == "quota"
    assert "quota allows 1 pending session" in refused.value.message
    assert len(manager.sessions(user="alice")) == 1


class FakeHub:
    """Stands in for the hub's REST API (HubClient.group), nothing else."""

    def __init__(self, properties: dict[str, dict]):
        self.properties = properties
        self.asked: list[str] = []

    async def group(self, name: str) -> dict:
        self.asked.append(name)
        return {"name": name, "properties": self.properties.get(name, {})}


async def test_a_group_quota_is_shared_by_the_group(open_manager):
    quotas = QuotaBook()
    hub = FakeHub({"students": {"fgpu_quota": {"fgpu": 1, "cpu": 2}}})
    for user in ("carol", "dave"):
        await quotas.refresh({"name": user, "groups": ["students"]}, hub)
    await quotas.refresh({"name": "erin", "groups": []}, hub)
    assert hub.asked == ["students", "students"]
    manager = open_manager(quotas=quotas)

    carol = await manager.submit(ask(user="carol"), groups=("students",))
    dave = await manager.submit(ask(user="dave"), groups=("students",))
    erin = await manager.submit(ask(user="erin"), groups=())

    assert carol["status"] == Status.SCHEDULED
    assert dave["status"] == Status.PENDING
    assert "group 'students'" in dave["reason"] and "quota" in dave["reason"], dave["reason"]
    assert erin["status"] == Status.SCHEDULED

    with pytest.raises(Refused) as refused:
        await manager.submit(ask(user="dave", server="big", cpu=3.0), groups=("students",))
    assert refused.value.cause == "quota"
    assert "group 'students' quota" in refused.value.message

    await manager.release(carol["id"])
    assert (await manager.get(dave["id"]))["status"] == Status.SCHEDULED


async def test_allocatable_counts_what_the_group_already_holds(open_manager):
    quotas = QuotaBook()
    hub = FakeHub({"students": {"fgpu_quota": {"cpu": 2}}})
    for user in ("carol", "dave"):
        await quotas.refresh({"name": user, "groups": ["students"]}, hub)
    manager = open_manager(quotas=quotas)
    await manager.submit(ask(user="carol", cpu=1.5, fgpu=0), groups=("students",))

    shown = (await manager.resources("dave", ("students",), admin=False))["allocatable"]["cpu"]
    taken = await manager.submit(ask(user="dave", cpu=shown, fgpu=0), groups=("students",))

    # What the page offers must be what starts: the group's 2 cores less carol's 1.5.
    assert taken["status"] == Status.SCHEDULED, taken["reason"]
    assert shown == 0.5


async def test_a_malformed_group_quota_is_ignored_not_fatal(open_manager, caplog):
    log = logging.getLogger("test-quotas")
    quotas = QuotaBook(log=log)
    hub = FakeHub({"students": {"fgpu_quota": {"fgpus": 1}}})
    await quotas.refresh({"name": "carol", "groups": ["students"]}, hub)
    manager = open_manager(quotas=quotas)

    with caplog.at_level(logging.ERROR, logger="test-quotas"):
        await quotas.refresh({"name": "dave", "groups": ["students"]}, hub)
    carol = await manager.submit(ask(user="carol"), groups=("students",))
    dave = await manager.submit(ask(user="dave"), groups=("students",))

    assert "group students: unknown quota key(s) fgpus" in caplog.text
    assert (carol["status"], dave["status"]) == (Status.SCHEDULED, Status.SCHEDULED)


# -- running and accounting ----------------------------------------------------------------------


async def test_mark_running_records_the_start(manager):
    first, _, third = await submit_three(manager)
    assert first["started"] is None

    running = await manager.mark_running(first["id"])

    assert running["status"] == Status.RUNNING
    started = datetime.fromisoformat(running["started"])
    assert started.tzinfo is not None
    assert abs(time.time() - started.timestamp()) < 60
    assert running["grant"] == first["grant"]
    # A running session still holds its slice, and ends as TERMINATED.
    assert (await manager.release(first["id"]))["status"] == Status.TERMINATED
    assert (await manager.get(third["id"]))["status"] == Status.SCHEDULED


async def test_only_a_granted_session_can_start_running(manager):
    first, _, third = await submit_three(manager)
    with pytest.raises(Refused) as waiting:
        await manager.mark_running(third["id"])
    assert waiting.value.cause == "conflict" and "PENDING" in waiting.value.message
    assert (await manager.get(third["id"]))["status"] == Status.PENDING
    # Fail closed: a grant that ended while its container was starting is not revived.
    await manager.release_where([first["id"]], Status.ERROR, "no container started within 180 s")
    with pytest.raises(Refused) as ended:
        await manager.mark_running(first["id"])
    assert ended.value.cause == "conflict"
    assert "ERROR: no container started within 180 s" in ended.value.message
    assert (await manager.get(first["id"]))["status"] == Status.ERROR
    # Running already: confirming again changes nothing.
    assert (await manager.mark_running(third["id"]))["status"] == Status.RUNNING
    assert (await manager.mark_running(third["id"]))["status"] == Status.RUNNING


async def test_a_release_says_what_it_ended(manager):
    first, _, third = await submit_three(manager)
    assert (await manager.release(third["id"]))["released_from"] == Status.PENDING
    assert (await manager.release(first["id"]))["released_from"] == Status.SCHEDULED
    assert (await manager.release(first["id"]))["released_from"] is None


async def test_resources_rise_and_fall_by_exactly_the_session(manager):
    empty = await manager.resources("alice", (), admin=True)
    assert empty["allocated"] == {"cpu": 0, "mem": 0, "fgpu": 0}
    assert empty["capacity"] == {"cpu": 4.0, "mem": 8 * GIB, "fgpu": 2}
    assert empty["allocatable"] == {"cpu": 4.0, "mem": 8 * GIB, "fgpu": 2}
    assert empty["units_per_gpu"] == 2

    session = await manager.submit(ask(cpu=1.5, mem=3 * GIB, fgpu=1.0), groups=())
    await manager.mark_running(session["id"])
    held = await manager.resources("alice", (), admin=True)
    others = await manager.resources("bob", (), admin=False)

    assert held["allocated"] == {"cpu": 1.5, "mem": 3 * GIB, "fgpu": 1.0}
    assert held["sessions"] == 1
    assert held["allocatable"] == {"cpu": 2.5, "mem": 5 * GIB, "fgpu": 1.0}
    assert others["allocated"] == {"cpu": 0, "mem": 0, "fgpu": 0}
    assert others["allocatable"] == held["allocatable"]
    assert "nodes" not in others
    (node,) = held["nodes"]
    assert (node["cpu_free"], node["mem_free"]) == (2.5, 5 * GIB)
    assert [(g["uuid"], g["fraction_free"], g["fgpu_free"]) for g in node["gpus"]] == [
        (GPU, 0.5, 1.0)
    ]

    await manager.release(session["id"])
    after = await manager.resources("alice", (), admin=True)
    assert after["allocated"] == empty["allocated"]
    assert after["allocatable"] == empty["allocatable"]
    assert after["nodes"][0]["gpus"][0]["fraction_free"] == 1.0


LAB_NODE = resource_model.Node(
    "lab-1", "lab", cpu=2.0, mem=4 * GIB, gpus=(resource_model.Gpu("GPU-lab-0", 8 * GIB, 80),)
)


async def test_resources_per_resource_group_and_in_total(open_manager):
    manager = open_manager(
        quotas=QuotaBook(user_default={"fgpu": 3, "resource_groups": ["default", "lab"]}),
        nodes=(NODE, LAB_NODE),
    )
    session = await manager.submit(ask(cpu=1.0, mem=GIB, fgpu=1.5), groups=())
    shown = await manager.resources("alice", (), admin=False)
    groups = shown["resource_groups"]

    assert set(groups) == {"default", "lab"}
    assert groups["default"]["capacity"] == {"cpu": 4.0, "mem": 8 * GIB, "fgpu": 2}
    assert groups["lab"]["capacity"] == {"cpu": 2.0, "mem": 4 * GIB, "fgpu": 2}
    # Best fit put it on the first node of the cluster, the default group's.
    assert session["grant"]["node"] == "node-1"
    assert groups["default"]["allocated"] == {"cpu": 1.0, "mem": GIB, "fgpu": 1.5}
    assert groups["lab"]["allocated"] == {"cpu": 0, "mem": 0, "fgpu": 0}
    # Free in the group, capped by the user's 3 fGPU quota less the 1.5 held.
    assert groups["default"]["allocatable"] == {"cpu": 3.0, "mem": 7 * GIB, "fgpu": 0.5}
    assert groups["lab"]["allocatable"] == {"cpu": 2.0, "mem": 4 * GIB, "fgpu": 1.5}
    assert shown["allocated"] == groups["default"]["allocated"]
    assert shown["allocatable"] == {"cpu": 5.0, "mem": 11 * GIB, "fgpu": 1.5}
    assert shown["capacity"] == {"cpu": 6.0, "mem": 12 * GIB, "fgpu": 4}


async def test_a_request_naming_a_resource_group_goes_only_to_that_groups_nodes(open_manager):
    manager = open_manager(nodes=(NODE, LAB_NODE))
    # Best fit alone puts it on node-1, the first node; the named group wins.
    in_lab = await manager.submit(ask(server="lab", fgpu=1.0, resource_group="lab"), groups=())
    assert (in_lab["status"], in_lab["grant"]["node"]) == ("SCHEDULED", "lab-1")
    # Once the lab's GPU is full, the next one waits for the lab though node-1 is free.
    second = await manager.submit(ask(server="lab2", fgpu=1.5, resource_group="lab"), groups=())
    assert second["status"] == "PENDING" and second["grant"] is None
    anywhere = await manager.submit(ask(server="any", fgpu=1.5), groups=())
    assert anywhere["grant"]["node"] == "node-1"
    await manager.release(in_lab["id"])
    assert (await manager.get(second["id"]))["grant"]["node"] == "lab-1"


async def test_a_request_goes_first_to_a_node_that_holds_its_image(open_manager):
    second_node = dataclasses.replace(NODE, name="node-2", gpus=())
    manager = open_manager(nodes=(NODE, second_node))
    # node-2 holds python-3.11, as the nodes' reports say.
    manager.image_nodes = lambda: {"python-3.11": frozenset({"node-2"})}
    other = await manager.submit(ask(server="b", fgpu=0, image="scikit-learn-1.5"), groups=())
    assert other["grant"]["node"] == "node-1"
    # Best fit alone would put it beside the first (the node with the least CPU left).
    held = await manager.submit(ask(server="a", fgpu=0), groups=())
    assert held["grant"]["node"] == "node-2"


async def test_a_resource_group_the_user_may_not_use_offers_nothing(open_manager):
    manager = open_manager(
        quotas=QuotaBook(user_default={"resource_groups": ["default"]}), nodes=(NODE, LAB_NODE)
    )
    groups = (await manager.resources("alice", (), admin=False))["resource_groups"]
    assert groups["lab"]["allowed"] is False
    assert groups["lab"]["allocatable"] == {"cpu": 0, "mem": 0, "fgpu": 0}
    assert groups["default"]["allowed"] is True
    assert groups["default"]["allocatable"]["fgpu"] == 2


async def test_the_total_allocatable_counts_only_the_groups_the_user_may_use(open_manager):
    manager = open_manager(
        quotas=QuotaBook(user_default={"resource_groups": ["lab"]}), nodes=(NODE, LAB_NODE)
    )
    shown = await manager.resources("alice", (), admin=False)
    assert shown["allocatable"] == shown["resource_groups"]["lab"]["allocatable"]
    assert shown["allocatable"] == {"cpu": 2.0, "mem": 4 * GIB, "fgpu": 2}


async def test_a_used_up_session_quota_leaves_nothing_allocatable(open_manager):
    manager = open_manager(quotas=QuotaBook(user_default={"sessions": 1}))
    await manager.submit(ask(fgpu=0.5), groups=())
    shown = await manager.resources("alice", (), admin=False)
    assert shown["allocatable"] == {"cpu": 0, "mem": 0, "fgpu": 0}
    assert shown["resource_groups"]["default"]["allocatable"] == shown["allocatable"]
    assert (await manager.resources("bob", (), admin=False))["allocatable"]["fgpu"] == 1.5


async def test_resources_name_the_quota_that_is_used_up_beside_what_the_cluster_has_free(
    open_manager,
):
    manager = open_manager(quotas=QuotaBook(user_default={"sessions": 1, "pending": 2}))
    await manager.submit(ask(fgpu=0.5), groups=())
    await manager.submit(ask(server="b", fgpu=0.5), groups=())
    shown = await manager.resources("alice", (), admin=False)

    # Nothing for alice, though the cluster still has 1 fGPU: her quota is what stops her.
    assert shown["allocatable"]["fgpu"] == 0
    assert shown["free"]["fgpu"] == 1.5
    assert shown["resource_groups"]["default"]["free"] == shown["free"]
    sessions, pending = shown["limits"]
    assert sessions["kind"] == "sessions" and sessions["reached"] is True
    assert sessions["text"] == "You have 1 of 1 sessions (running or starting; your quota)."
    assert (pending["kind"], pending["used"], pending["left"]) == ("pending", 1, 1)
    assert pending["reached"] is False


async def test_admins_see_which_session_holds_which_slice(manager):
    first, second, third = await submit_three(manager)
    resources = await manager.resources("admin", (), admin=True)
    (gpu,) = resources["nodes"][0]["gpus"]
    assert gpu["fraction_free"] == 0
    assert sorted(gpu["slices"], key=lambda s: s["server_name"]) == [
        {"session_id": s["id"], "user": "alice", "server_name": name, "fraction": 0.5, "fgpu": 1.0}
        for s, name in ((first, "s0"), (second, "s1"))
    ]
    await manager.release(first["id"])
    (gpu,) = (await manager.resources("admin", (), admin=True))["nodes"][0]["gpus"]
    assert {s["session_id"] for s in gpu["slices"]} == {second["id"], third["id"]}


async def test_a_zero_quota_leaves_nothing_allocatable(open_manager):
    manager = open_manager(quotas=QuotaBook(user_default={"fgpu": 0}))

    resources = await manager.resources("alice", (), admin=False)

    with pytest.raises(Refused, match="quota"):
        await manager.submit(ask(fgpu=1.0), groups=())
    assert resources["allocatable"]["fgpu"] == 0


# -- time stamps as the reconciler reads them ------------------------------------------------------


#: A Docker client with no session containers: `containers.list` is the reconciler's only call.
NO_CONTAINERS = SimpleNamespace(containers=SimpleNamespace(list=lambda **filters: []))


async def test_a_fresh_grant_is_not_reclaimed_in_a_timezone_east_of_utc(
    open_manager, db_url, monkeypatch, request
):
    monkeypatch.setenv("TZ", "Asia/Seoul")
    time.tzset()
    try:
        manager = open_manager()
        session = await manager.submit(ask(), groups=())
        await Reconciler(
            manager, sessions=DockerSessionLister(NO_CONTAINERS), start_grace=180
        ).reconcile()
        status = (await manager.get(session["id"]))["status"]
    finally:
        monkeypatch.undo()
        time.tzset()
    assert status == Status.SCHEDULED


# -- nothing leaks, nothing starts by itself ----------------------------------


async def test_a_repeated_submit_with_the_same_key_returns_the_same_record(manager):
    key = "a" * 32
    first = await manager.submit(ask(id=key), groups=())
    again = await manager.submit(ask(id=key), groups=())
    assert first["id"] == again["id"] == key
    assert [s["id"] for s in manager.sessions()] == [key]


async def test_a_key_is_32_hex_digits_and_belongs_to_its_server(manager):
    with pytest.raises(Refused, match="32 hex digits") as refused:
        await manager.submit(ask(id="../etc"), groups=())
    assert refused.value.cause == "invalid"
    await manager.submit(ask(server="s1", id="b" * 32), groups=())
    with pytest.raises(Refused, match="another server") as refused:
        await manager.submit(ask(server="s2", id="b" * 32), groups=())
    assert refused.value.cause == "conflict"


async def test_a_request_released_before_it_arrives_never_queues(manager):
    """The spawn timed out waiting for the answer and released its key; the request, still on its
    way, must not then wait in line and start a server the user saw fail."""
    key = "c" * 32
    with pytest.raises(KeyError):
        await manager.release(key)
    with pytest.raises(Refused, match="given up") as refused:
        await manager.submit(ask(id=key), groups=())
    assert refused.value.cause == "conflict"
    assert manager.sessions() == []


def labelled(session_id: str, fgpu: float, gpus: dict) -> SimpleNamespace:
    grant = {"session_id": session_id, "node": NODE.name, "gpus": gpus}
    return SimpleNamespace(
        id=session_id,
        user="orphan",
        server_name="lost",
        image="python-3.11",
        cpu=0.5,
        mem=512 * MIB,
        fgpu=fgpu,
        node=NODE.name,
        grant_json=json.dumps(grant),
    )


async def test_an_adopted_session_holds_its_slice_in_the_next_pass(manager):
    adopted = await manager.adopt([labelled("d" * 32, 2.0, {GPU: 1.0})], "adopted")
    assert adopted == ["d" * 32]
    view = await manager.get("d" * 32)
    assert (view["status"], view["grant"]["gpus"], view["reason"]) == (
        Status.RUNNING,
        {GPU: 1.0},
        "adopted",
    )
    # The whole GPU is the orphan's: a new fGPU request waits rather than get it a second time.
    waiting = await manager.submit(ask(user="bob"), groups=())
    assert waiting["status"] == Status.PENDING
    # Adopting again changes nothing.
    assert await manager.adopt([labelled("d" * 32, 2.0, {GPU: 1.0})], "adopted") == []


async def test_nothing_is_granted_before_the_engine_has_been_counted(manager):
    holder = await manager.submit(ask(server="s1", fgpu=2.0), groups=())
    waiting = await manager.submit(ask(server="s2"), groups=())
    assert (holder["status"], waiting["status"]) == (Status.SCHEDULED, Status.PENDING)
    manager.engine_problem = "The Docker engine is not answering."
    with pytest.raises(Refused, match="not answering") as refused:
        await manager.submit(ask(server="s3"), groups=())
    assert refused.value.cause == "unavailable"
    # A container the engine has not listed yet may hold the freed slice: the waiting request
    # is not placed on it until the engine's containers are counted.
    await manager.release(holder["id"])
    assert (await manager.get(waiting["id"]))["status"] == Status.PENDING
    manager.engine_problem = None
    await manager.schedule()
    assert (await manager.get(waiting["id"]))["status"] == Status.SCHEDULED


async def test_writes_and_passes_leave_the_event_loop_free(manager):
    """A slow database (each statement 50 ms here, as a distant PostgreSQL might be) must not
    stall the service: the pages and long-polls share its event loop."""
    engine = manager.db.kw["bind"]

    def slow(*_args):
        time.sleep(0.05)

    event.listen(engine, "before_cursor_execute", slow)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    counting = asyncio.create_task(ticker())
    try:
        started = time.monotonic()
        await manager.submit(ask(), groups=())
        await manager.release(manager.sessions()[0]["id"])
        await manager.history()
        took = time.monotonic() - started
    finally:
        counting.cancel()
        event.remove(engine, "before_cursor_execute", slow)
    # The loop ran all along: about one tick per 10 ms of the time the database took.
    assert took > 0.2
    assert ticks >= took / 0.01 / 3, (ticks, took)


async def test_a_pass_wakes_only_the_waiters_whose_record_changed(open_manager):
    """A release that grants one waiting request must not wake a waiter elsewhere in the queue
    whose record stays as it was (with 2,000 waiters, waking all made every pass slow)."""
    other_gpu = "GPU-00000000-0000-0000-0000-000000000002"
    other = resource_model.Node(
        "node-2", "busy", 4.0, 8 * GIB, (resource_model.Gpu(other_gpu, 8 * GIB),)
    )
    manager = open_manager(nodes=(NODE, other))
    busy = {"resource_group": "busy", "fgpu": 2.0}
    await manager.submit(ask(user="holder", **busy), groups=())
    unchanged = await manager.submit(ask(user="bob", **busy), groups=())
    held = await manager.submit(ask(user="carol", fgpu=2.0), groups=())
    waiting = await manager.submit(ask(user="dave", fgpu=2.0), groups=())
    assert (unchanged["status"], waiting["status"]) == (Status.PENDING, Status.PENDING)

    asleep = asyncio.create_task(manager.wait(unchanged["id"], unchanged["version"], 30))
    woken = asyncio.create_task(manager.wait(waiting["id"], waiting["version"], 30))
    await asyncio.sleep(0.05)
    await manager.release(held["id"])
    granted = await asyncio.wait_for(woken, 5)

    assert granted["status"] == Status.SCHEDULED and granted["position"] is None
    await asyncio.sleep(0.2)
    assert not asleep.done()
    asleep.cancel()
    ended = await asyncio.wait_for(
        manager.wait(held["id"], (await manager.get(held["id"]))["version"], 0.1), 5
    )
    assert ended["status"] == Status.TERMINATED  # an ended record is still read (from memory)


# -- a launch records its sessions first -------------------------------------


def keyed(n: int, **asked) -> dict:
    return ask(server=f"s{n}", id=f"{n:032x}", **asked)


async def test_a_launch_is_recorded_as_submits_one_after_another_would_be(open_manager):
    manager = open_manager(quotas=QuotaBook(user_default={"sessions": 1, "pending": 1}))
    records = await manager.submit_many([keyed(1), keyed(2)], groups=())
    assert [r["id"] for r in records] == [f"{1:032x}", f"{2:032x}"]
    # The first holds the one session the quota allows; the second waits on the quota.
    assert [r["status"] for r in records] == [Status.SCHEDULED, Status.PENDING]
    assert "quota" in records[1]["reason"]


async def test_a_launch_refused_for_one_of_its_sessions_records_none(open_manager):
    manager = open_manager(quotas=QuotaBook(user_default={"sessions": 1, "pending": 1}))
    before = await manager.submit(ask(user="bob"), groups=())
    # One granted and one waiting fill the quota; the third is one pending request too many.
    with pytest.raises(Refused, match="quota allows 1 pending session") as refused:
        await manager.submit_many([keyed(1), keyed(2), keyed(3)], groups=())
    assert refused.value.cause == "quota"
    assert await manager.history() == [await manager.get(before["id"])]
    # Nothing of it stays in the in-memory view either: bob's record reads as before.
    assert (await manager.get(before["id"]))["status"] == before["status"]
    # The keys are free for a launch that fits.
    assert len(await manager.submit_many([keyed(1), keyed(2)], groups=())) == 2


async def test_a_launched_key_is_given_only_to_the_request_it_was_made_for(manager):
    (record,) = await manager.submit_many([keyed(1, fgpu=0.5)], groups=())
    # The same server asking for more with the record's key (a user can pick the key).
    with pytest.raises(Refused, match="another server or request") as refused:
        await manager.submit(keyed(1, fgpu=2.0), groups=())
    assert refused.value.cause == "conflict"
    with pytest.raises(Refused, match="another server or request"):
        await manager.submit({**keyed(1, fgpu=0.5), "user": "mallory"}, groups=())
    # The launch's own spawn gets it.
    assert (await manager.submit(keyed(1, fgpu=0.5), groups=()))["id"] == record["id"]


async def test_a_withdrawn_launch_leaves_nothing_and_its_keys_never_queue(manager):
    records = await manager.submit_many([keyed(1, fgpu=2.0), keyed(2, fgpu=2.0)], groups=())
    assert [r["status"] for r in records] == [Status.SCHEDULED, Status.PENDING]
    await manager.withdraw([r["id"] for r in records])
    assert await manager.history() == []
    with pytest.raises(Refused, match="given up"):
        await manager.submit(keyed(1, fgpu=2.0), groups=())
    # The slice the withdrawn grant held is free again.
    assert (await manager.submit(ask(fgpu=2.0), groups=()))["status"] == Status.SCHEDULED


async def test_a_view_follows_a_new_inventory_though_its_record_stayed_the_same(manager):
    """Views are reused across passes while their record is unchanged; a new inventory (the
    engine answered, a node changed) must still reach them."""
    granted = await manager.submit(ask(), groups=())
    assert (await manager.get(granted["id"]))["gpu_memory"] == {GPU: 8 * GIB}
    bigger = resource_model.Node(
        "node-1", "default", 4.0, 8 * GIB, (resource_model.Gpu(GPU, 16 * GIB),)
    )
    manager.set_nodes([bigger])
    await manager.schedule()
    assert (await manager.get(granted["id"]))["gpu_memory"] == {GPU: 16 * GIB}


async def test_a_new_inventory_waits_for_the_pass_in_progress(manager):
    """The service reads the Swarm's nodes on the loop while a pass may run on the DB thread: the
    pass must see one inventory, whole, so a new one is taken between writes."""
    entered, go_on = threading.Event(), threading.Event()

    def held_admission(db, request, groups):
        entered.set()
        go_on.wait(10)

    manager.admission_check = held_admission
    submitted = asyncio.create_task(manager.submit(ask(), groups=()))
    assert await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
    replaced = asyncio.create_task(manager.replace_nodes([]))
    await asyncio.sleep(0.2)
    assert manager.nodes == [NODE], "the inventory changed under a pass"
    go_on.set()
    assert (await submitted)["status"] == Status.SCHEDULED
    await replaced
    assert manager.nodes == []


# -- a pass considers again only the requests a change concerns ----------------------

GROUPS_OF_NODES = {
    "a": [("a1", 2), ("a2", 1)],
    "b": [("b1", 2)],
    "c": [("c1", 0), ("c2", 1)],
}
RANDOM_NODES = tuple(
    resource_model.Node(
        name,
        group,
        cpu=2.0,
        mem=4 * GIB,
        gpus=tuple(resource_model.Gpu(f"GPU-{name}-{i}", 8 * GIB) for i in range(gpus)),
    )
    for group, nodes in GROUPS_OF_NODES.items()
    for name, gpus in nodes
)
RANDOM_USERS = [f"u{n}" for n in range(6)]


async def random_quotas(rng) -> QuotaBook:
    """A user quota (or none) and a hub group of some users with a quota of its own (or none)."""
    default = rng.choice([{}, {"fgpu": 2}, {"sessions": 2}, {"cpu": 2, "pending": 3}])
    quotas = QuotaBook(user_default=default)
    hub = FakeHub({"lab": {"fgpu_quota": rng.choice([{"fgpu": 3}, {"sessions": 3}, {}])}})
    for user in RANDOM_USERS:
        await quotas.refresh({"name": user, "groups": ["lab"] if rng.random() < 0.5 else []}, hub)
    return quotas


def random_request(rng, n: int) -> dict:
    return {
        **ask(
            user=rng.choice(RANDOM_USERS),
            server=f"s{rng.randrange(4)}",
            fgpu=rng.choice([0.0, 0.5, 1.0, 1.0, 1.5, 2.0, 3.0]),
            cpu=rng.choice([0.25, 0.5, 1.0]),
            mem=rng.choice([256, 512, 1024]) * MIB,
        ),
        "id": f"{rng.getrandbits(120):030x}{n:02x}"[-32:],
        "resource_group": rng.choice(["a", "a", "b", "c", None]),
    }


async def random_operation(rng, n: int, ids: list[str]):
    """One change (a callable run the same on each manager) with its name, for the message."""
    known = rng.choice(ids) if ids else "0" * 32
    kind = rng.choices(
        ["submit", "launch", "release", "running", "lost", "schedule", "withdraw", "nodes"],
        weights=[10, 2, 6, 3, 2, 1, 1, 1],
    )[0]
    if kind == "submit":
        request = random_request(rng, n)
        ids.append(request["id"])
        return kind, lambda m: m.submit(request, groups=m.quotas.groups_of(request["user"]))
    if kind == "launch":
        user = rng.choice(RANDOM_USERS)
        batch = [{**random_request(rng, n + i), "user": user} for i in range(rng.randint(1, 3))]
        ids.extend(r["id"] for r in batch)
        return kind, lambda m: m.submit_many(batch, groups=m.quotas.groups_of(user))
    if kind == "release":
        return kind, lambda m: m.release(known)
    if kind == "running":
        return kind, lambda m: m.mark_running(known)
    if kind == "lost":
        schedule = rng.random() < 0.5
        return kind, lambda m: m.release_where([known], Status.TERMINATED, "lost", schedule)
    if kind == "withdraw":
        return kind, lambda m: m.withdraw([known])
    if kind == "nodes":
        nodes = [node for node in RANDOM_NODES if rng.random() < 0.9]

        async def set_nodes(m):
            m.set_nodes(nodes)
            await m.schedule()

        return kind, set_nodes
    return kind, lambda m: m.schedule()


async def outcome_of(manager: QueueManager, operation) -> tuple:
    try:
        await operation(manager)
    except Refused as refusal:
        return ("refused", refusal.cause, refusal.message)
    except KeyError:
        return ("unknown",)
    return ("done",)


def decisions(manager: QueueManager) -> list[tuple]:
    """Every active record as a pass leaves it: what it holds, why it waits, where it stands."""
    return [
        (
            view["id"],
            view["status"],
            view["grant"] and view["grant"]["gpus"],
            view["reason"],
            view["position"],
            record.skips,
        )
        for view, record in zip(manager.sessions(), manager.active_records(), strict=True)
    ]


def assert_nothing_overbooked(manager: QueueManager) -> None:
    """No GPU, node or quota holds more than it has (from the records, not the scheduler)."""
    used: dict[str, float] = {}
    for record in manager.active_records():
        if record.status in (Status.SCHEDULED, Status.RUNNING):
            for uuid, fraction in record.gpus.items():
                used[uuid] = used.get(uuid, 0) + fraction
            used[record.node] = used.get(record.node, 0) + record.cpu
    assert all(share <= 1 + 1e-9 for key, share in used.items() if key.startswith("GPU")), used
    assert all(used.get(node.name, 0) <= node.cpu + 1e-9 for node in RANDOM_NODES), used
    quota = manager.quotas.snapshot().default_user
    for user in RANDOM_USERS:
        held = [r for r in manager.active_records() if r.user == user and r.status != "PENDING"]
        if quota.max_sessions is not None:
            assert len(held) <= quota.max_sessions
        if quota.max_slots.fgpu is not None:
            assert sum(r.fgpu for r in held) <= quota.max_slots.fgpu + 1e-9


@pytest.mark.parametrize("seed", range(10))
async def test_the_incremental_pass_decides_as_a_pass_over_every_request(
    open_manager, tmp_path, seed
):
    """Random submits, launches, releases, starts, losses, withdrawals and inventory changes, on
    three resource groups with user and hub-group quotas: after every change the queue that
    considers again only the requests the change concerns holds exactly what the reference
    (every pass over every request, on a database of its own) holds, the same grants, reasons,
    positions and skip counts, and never more than a GPU, a node or a quota has."""
    rng = random.Random(seed)
    quotas = await random_quotas(rng)
    settings = SchedulerSettings(
        units_per_gpu=2,
        placement=rng.choice(placement.PLACEMENTS),
        max_skips=rng.choice([1, 2, 3]),
        pending_timeout=0,
    )
    fast = open_manager(settings=settings, quotas=quotas, nodes=RANDOM_NODES)
    reference_db = open_database(f"sqlite:///{tmp_path / 'reference.sqlite'}")
    reference = QueueManager(reference_db, RANDOM_NODES, settings, quotas, incremental=False)
    ids: list[str] = []
    for n in range(100):
        kind, operation = await random_operation(rng, n, ids)
        outcome = await outcome_of(fast, operation)
        assert outcome == await outcome_of(reference, operation), (n, kind)
        assert decisions(fast) == decisions(reference), (n, kind)
        assert_nothing_overbooked(fast)
    reference_db.kw["bind"].dispose()


async def test_a_record_changed_outside_is_read_again_before_a_pass_changes_it(manager):
    """A pass trusts the records in memory, but reads each one it changes from the DB first: one
    ended outside this process (an admin's SQL) is never granted, and the pass runs over what
    the DB holds."""
    holder = await manager.submit(ask(server="s1", fgpu=2.0), groups=())
    waiting = await manager.submit(ask(server="s2", fgpu=2.0), groups=())
    later = await manager.submit(ask(server="s3", fgpu=1.0), groups=())
    with manager.db.begin() as db:
        db.execute(
            update(SessionRecord)
            .where(SessionRecord.id == waiting["id"])
            .values(status=Status.CANCELLED, reason="cancelled by hand")
        )
    await manager.release(holder["id"])

    gone = await manager.get(waiting["id"])
    assert (gone["status"], gone["reason"]) == (Status.CANCELLED, "cancelled by hand")
    assert waiting["id"] not in {s["id"] for s in manager.sessions()}
    assert (await manager.get(later["id"]))["status"] == Status.SCHEDULED
    assert gpu_use(manager.sessions()) == {GPU: 0.5}


# --- batch jobs -------------------------------------------------------------------------


def job_of(command: str = "python train.py") -> str:
    from image_catalog.job_options import check_job

    return check_job({"type": "batch", "command": command})


async def test_a_job_and_a_session_each_wait_by_their_own_pending_timeout(open_manager):
    settings = SchedulerSettings(units_per_gpu=2, pending_timeout=0.25, job_pending_timeout=30)
    manager = open_manager(settings)
    await manager.submit(ask(server="big", fgpu=2.0), groups=())
    session = await manager.submit(ask(server="s"), groups=())
    job = await manager.submit(ask(server="j", job=job_of()), groups=())
    assert (session["status"], job["status"]) == (Status.PENDING, Status.PENDING)
    assert (job["type"], session["type"]) == ("batch", "interactive")

    await asyncio.sleep(0.4)
    await manager.schedule()

    assert (await manager.get(session["id"]))["status"] == Status.PENDING_TIMEOUT
    assert (await manager.get(job["id"]))["status"] == Status.PENDING


async def test_a_job_times_out_by_the_jobs_pending_timeout(open_manager):
    settings = SchedulerSettings(units_per_gpu=2, pending_timeout=30, job_pending_timeout=0.25)
    manager = open_manager(settings)
    await manager.submit(ask(server="big", fgpu=2.0), groups=())
    session = await manager.submit(ask(server="s"), groups=())
    job = await manager.submit(ask(server="j", job=job_of()), groups=())
    await asyncio.sleep(0.4)
    await manager.schedule()
    ended = await manager.get(job["id"])
    assert (ended["status"], ended["end_reason"]) == (Status.PENDING_TIMEOUT, "pending_timeout")
    assert ended["reason"] == "waited over 0.25 s"
    assert (await manager.get(session["id"]))["status"] == Status.PENDING


async def test_a_job_its_owner_stops_ends_cancelled_whether_waiting_or_running(open_manager):
    manager = open_manager()
    running = await manager.submit(ask(server="j1", fgpu=2.0, job=job_of()), groups=())
    waiting = await manager.submit(ask(server="j2", fgpu=2.0, job=job_of()), groups=())
    await manager.mark_running(running["id"])
    assert waiting["status"] == Status.PENDING

    cancelled = await manager.release(waiting["id"])
    assert (cancelled["status"], cancelled["end_reason"]) == (Status.CANCELLED, "cancelled")
    stopped = await manager.release(running["id"])
    assert (stopped["status"], stopped["end_reason"]) == (Status.TERMINATED, "cancelled")
    # An admin's end, or an interactive session's stop, keep their own codes.
    other = await manager.submit(ask(server="j3", job=job_of()), groups=())
    assert (await manager.release(other["id"], "admin"))["end_reason"] == "admin"
    session = await manager.submit(ask(server="s"), groups=())
    assert (await manager.release(session["id"]))["end_reason"] == "user"


async def test_an_exited_job_keeps_its_code_and_log_and_its_slice_goes_on_in_the_same_pass(
    open_manager,
):
    manager = open_manager()
    job = await manager.submit(ask(server="j1", fgpu=2.0, job=job_of()), groups=())
    await manager.mark_running(job["id"])
    nxt = await manager.submit(ask(server="j2", fgpu=2.0, job=job_of()), groups=())
    assert nxt["status"] == Status.PENDING

    await manager.end_job(job["id"], "failed", "failed: the job exited with code 1", 1, "a\nb\n")

    ended = await manager.get(job["id"])
    assert (ended["status"], ended["end_reason"], ended["exit_code"]) == (
        Status.TERMINATED,
        "failed",
        1,
    )
    assert ended["reason"] == "failed: the job exited with code 1"
    assert await manager.job_log(job["id"]) == "a\nb\n"
    assert (await manager.get(nxt["id"]))["status"] == Status.SCHEDULED
    # Ended already (the event and a reconciler round both saw the exit): nothing changes.
    await manager.end_job(job["id"], "finished", "finished", 0, "")
    again = await manager.get(job["id"])
    assert (again["end_reason"], again["exit_code"]) == ("failed", 1)
    assert await manager.job_log(job["id"]) == "a\nb\n"


async def test_a_stop_the_service_asks_for_is_expected_and_then_forgotten(open_manager):
    manager = open_manager()
    job = await manager.submit(ask(server="j", job=job_of()), groups=())
    manager.expect_end(job["id"], "timeout", "timeout: ...")
    manager.forget_expected_end(job["id"])  # the hub refused the stop
    assert manager.take_expected_end(job["id"]) is None
    manager.expect_end(job["id"], "timeout", "timeout: ...")
    assert manager.take_expected_end(job["id"]) == ("timeout", "timeout: ...")
    assert manager.take_expected_end(job["id"]) is None  # taken once


async def test_a_job_is_claimed_only_by_a_request_with_the_very_same_job(open_manager):
    """queue.py compares a known key's fields: the spawn's grant request must carry the job's
    same text, and a session's request cannot claim a job's record (nor the reverse)."""
    manager = open_manager()
    key = "c" * 32
    job = await manager.submit(ask(server="j", job=job_of(), id=key), groups=())
    again = await manager.submit(ask(server="j", job=job_of(), id=key), groups=())
    assert again["id"] == job["id"]
    for other in (None, job_of("python other.py")):
        with pytest.raises(Refused, match="belongs to another server or request"):
            await manager.submit(ask(server="j", job=other, id=key), groups=())


@pytest.mark.parametrize("job", ["not json", "[1]", 3])
async def test_a_malformed_job_in_a_grant_request_is_refused(open_manager, job):
    manager = open_manager()
    with pytest.raises(Refused, match="^Malformed grant request: "):
        await manager.submit(ask(server="j", job=job), groups=())
