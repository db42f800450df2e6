"""queue_service/automatic_ends.py: lifetimes per group, planned ends, warnings, and the lifetime
end on a clock the test sets, against a real QueueManager (SQLite and PostgreSQL). The hub's REST
API is stood in for (group properties, server activity, stops), as in test_queue.py; the warning
inside a real container is tested in tests/test_automatic_ends_hub.py."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime

import pytest

from fgpu_spawner.idle import stop_reason
from queue_service.automatic_ends import (
    IDLE,
    LIFETIME,
    RECLAIMED,
    AutomaticEnds,
    IdlePolicy,
    LifetimeError,
    PlannedEnd,
    group_idle_policy,
    group_lifetime,
    parse_duration,
    planned_end,
    strictest,
    tightest,
    warning_message,
)
from queue_service.core.errors import Refusal
from queue_service.core.status import Status
from queue_service.hub_client import HubError
from queue_service.quotas import QuotaBook

from .test_queue import ask, open_manager  # noqa: F401 (the fixture)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(3600, 3600), ("90", 90), ("90m", 5400), ("8h", 28800), ("1d", 86400), ("1h30m", 5400)],
)
def test_durations_are_seconds_or_strings(value, seconds):
    assert parse_duration(value) == seconds


def test_zero_means_no_limit():
    assert parse_duration(0) is None and parse_duration("0") is None


@pytest.mark.parametrize("value", [-5, "-1h", "8 hours", "h", "", True, [1], {"h": 1}, "nan"])
def test_bad_durations_are_refused_with_a_message(value):
    with pytest.raises(LifetimeError, match="is not a duration"):
        parse_duration(value)


def test_a_bad_group_value_names_the_group():
    with pytest.raises(LifetimeError, match="group cs101: max_session_lifetime 'soon' is not"):
        group_lifetime("cs101", {"max_session_lifetime": "soon"})
    assert group_lifetime("cs101", {}) is None


def test_the_tightest_limit_of_the_groups_applies():
    assert tightest({"a": 7200.0, "b": None, "c": 3600.0}) == (3600.0, "c")
    assert tightest({"a": None}) is None


def test_the_first_end_ahead_is_planned():
    lifetime = (3600.0, "cs101")
    assert planned_end(1000.0, lifetime, None, 0) == PlannedEnd(LIFETIME, 4600.0, 3600.0, "cs101")
    # Idle since 1500 with a 600 s timeout: the culler may stop it at 2100, before the lifetime.
    assert planned_end(1000.0, lifetime, 1500.0, 600) == PlannedEnd(IDLE, 2100.0, 600.0)
    assert planned_end(1000.0, None, None, 0) is None
    assert "ends at 01:16:40 UTC (in about 10 min)" in warning_message(
        PlannedEnd(LIFETIME, 4600.0, 3600.0, "cs101"), 4000.0
    )


def test_the_spawner_takes_a_stop_for_the_cullers_only_past_its_timeout():
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    naive = datetime(2026, 1, 1, 11, 0)  # the hub's ORM keeps naive UTC
    assert stop_reason(naive, None, 3600, now) == IDLE
    assert stop_reason(naive, None, 3601, now) is None
    assert stop_reason(None, naive, 3600, now) == IDLE  # no activity yet: since the start
    assert stop_reason(naive, None, 0, now) is None  # no culler


class Hub:
    """Stands in for the hub's REST API: group properties, server activity, stops."""

    def __init__(self, properties: dict[str, dict]):
        self.properties = properties
        self.activity: dict[tuple[str, str], str | None] = {}
        self.stopped: list[tuple[str, str]] = []

    async def group(self, name: str) -> dict:
        return {"name": name, "properties": self.properties.get(name, {})}

    async def user(self, name: str) -> dict:
        return {"name": name, "groups": ["cs101"]}

    async def server_activity(self) -> dict:
        return dict(self.activity)

    async def stop_server(self, user: str, server_name: str) -> int:
        self.stopped.append((user, server_name))
        return 204


class Notes:
    """Records what would be written inside the sessions."""

    def __init__(self):
        self.calls: list[tuple] = []

    async def warn(self, session_id, text, terminals):
        self.calls.append(("warn", session_id, terminals, text))
        return True

    async def clear(self, session_id):
        self.calls.append(("clear", session_id))
        return True


async def running_session(manager, user="alice"):
    record = await manager.submit(ask(user=user, fgpu=0), groups=("cs101",))
    return await manager.mark_running(record["id"])


async def keeper_for(open_manager, properties, clock, idle_timeout=0.0):  # noqa: F811
    hub = Hub(properties)
    quotas = QuotaBook()
    await quotas.refresh(await hub.user("alice"), hub)
    await quotas.refresh({"name": "bob", "groups": ["cs101"]}, hub)
    manager = open_manager(quotas=quotas)
    notes = Notes()
    ends = AutomaticEnds(
        manager,
        hub,
        quotas,
        idle_timeout=idle_timeout,
        warning_lead=600,
        notifier=notes,
        clock=lambda: clock[0],
        log=logging.getLogger("test-ends"),
    )
    manager.ends_of = ends.view
    return manager, hub, ends, notes


async def test_a_session_is_warned_then_ended_at_its_lifetime(open_manager):  # noqa: F811
    clock = [0.0]
    manager, hub, ends, notes = await keeper_for(
        open_manager, {"cs101": {"max_session_lifetime": "1h"}}, clock
    )
    session = await running_session(manager)
    bob = await manager.submit(ask(user="bob", fgpu=2, cpu=4.0), groups=("cs101",))
    assert bob["status"] == Status.PENDING
    started = datetime.fromisoformat(session["started"]).timestamp()

    clock[0] = started + 3600 - 601
    await ends.round()
    view = await manager.get(session["id"])
    assert view["ends"]["why"] == LIFETIME and not view["ends"]["warning"]
    assert view["ends"]["text"] == "maximum lifetime of 1 h (cs101)"
    assert notes.calls == [("clear", session["id"])]  # a new session: an old warning goes

    clock[0] = started + 3600 - 600
    await ends.round()
    await ends.round()  # warned once, not every round
    assert (await manager.get(session["id"]))["ends"]["warning"]
    assert [c[:3] for c in notes.calls[1:]] == [("warn", session["id"], True)]
    assert "in about 10 min" in notes.calls[1][3] and hub.stopped == []

    clock[0] = started + 3600
    await ends.round()
    await ends.round()
    for task in list(ends._tasks):
        await task
    assert hub.stopped == [("alice", "")]  # asked once
    # The hub's stop reaches the spawner, whose release names no reason: the planned one counts.
    ended = await manager.release(session["id"])
    assert (ended["end_reason"], ended["status"]) == (LIFETIME, Status.TERMINATED)
    assert ended["reason"] == "lifetime: reached the maximum of 1 h (group cs101)"
    assert (await manager.get(bob["id"]))["status"] == Status.SCHEDULED  # the slice went on


async def test_a_stop_the_hub_refuses_leaves_no_planned_reason_behind(open_manager):  # noqa: F811
    clock = [0.0]
    manager, hub, ends, notes = await keeper_for(
        open_manager, {"cs101": {"max_session_lifetime": "1h"}}, clock
    )

    async def refuse(user, server_name):
        raise HubError(503, "the hub is restarting")

    hub.stop_server = refuse
    session = await running_session(manager)
    clock[0] = datetime.fromisoformat(session["started"]).timestamp() + 3600
    await ends.round()
    for task in list(ends._tasks):
        await task
    # The student then stops it: an ordinary stop, not the lifetime end that never happened.
    ended = await manager.release(session["id"])
    assert (ended["end_reason"], ended["reason"]) == ("user", "")


async def test_a_bad_lifetime_is_logged_once_and_ignored(open_manager, caplog):  # noqa: F811
    clock = [0.0]
    manager, hub, ends, notes = await keeper_for(
        open_manager, {"cs101": {"max_session_lifetime": "forever"}}, clock
    )
    session = await running_session(manager)
    clock[0] = 10**10
    with caplog.at_level(logging.ERROR, logger="test-ends"):
        await ends.round()
        await ends.round()
    assert caplog.text.count("group cs101: max_session_lifetime 'forever' is not a duration") == 1
    assert (await manager.get(session["id"]))["ends"] is None and hub.stopped == []


async def test_an_idle_end_is_predicted_warned_in_the_file_only_and_withdrawn(open_manager):  # noqa: F811
    clock = [0.0]
    manager, hub, ends, notes = await keeper_for(open_manager, {}, clock, idle_timeout=3600)
    session = await running_session(manager)
    hub.activity[("alice", "")] = "2026-01-01T12:00:00Z"
    active = datetime(2026, 1, 1, 12, 0, tzinfo=UTC).timestamp()

    clock[0] = active + 3000
    await ends.round()
    view = (await manager.get(session["id"]))["ends"]
    assert view["why"] == IDLE and view["at"] == "2026-01-01T13:00:00+00:00" and view["warning"]
    # No terminal message: output there is activity, and would postpone the end it announces.
    assert [c[:3] for c in notes.calls] == [("warn", session["id"], False)]

    hub.activity[("alice", "")] = "2026-01-01T12:50:00Z"  # the student came back
    await ends.round()
    assert notes.calls[-1] == ("clear", session["id"])
    assert hub.stopped == []  # idle ends are the culler's


def test_only_idle_may_be_claimed_by_a_spawner():
    ends = AutomaticEnds(None, None, None, idle_timeout=60)
    assert ends.spawner_claim(None) == (None, None)
    code, reason = ends.spawner_claim("idle")
    assert code == IDLE and reason == "idle: no activity for 1 min, stopped by the idle culler"
    with pytest.raises(Refusal, match="Unknown end reason 'lifetime'"):
        ends.spawner_claim("lifetime")


def test_an_idle_policy_is_read_and_checked():
    policy = group_idle_policy(
        "gpu", {"idle_policy": {"fgpu_timeout": "20m", "timeout": "1h", "reclaim": "when_waiting"}}
    )
    assert (policy.limit_for(1), policy.limit_for(0)) == (1200, 3600)
    assert policy.when_waiting and policy.cpu_percent == 10
    assert policy.busy({"cpu_percent": 12.0}) and policy.busy({"gpu_util_percent": 50.0})
    assert not policy.busy({"cpu_percent": 0.5, "gpu_util_percent": None}) and not policy.busy(None)
    assert group_idle_policy("gpu", {}) is None
    for bad, message in [
        ("20m", "must be a mapping"),
        ({"timeout": "soon"}, "'soon' is not a duration"),
        ({"cpu_percent": 150}, "150 is not a percentage"),
        ({"reclaim": "never"}, "reclaim must be always or when_waiting"),
        ({"timout": 5}, "unknown key(s) timout"),
    ]:
        with pytest.raises(LifetimeError, match=re.escape(message)) as refused:
            group_idle_policy("gpu", {"idle_policy": bad})
        assert str(refused.value).startswith("group gpu: idle_policy")


def test_the_strictest_policy_of_the_groups_applies():
    a = IdlePolicy(timeout=3600, fgpu_timeout=None, cpu_percent=5, when_waiting=True, group="a")
    b = IdlePolicy(timeout=7200, fgpu_timeout=600, cpu_percent=20, when_waiting=False, group="b")
    both = strictest([a, b])
    assert (both.timeout, both.fgpu_timeout, both.cpu_percent) == (3600, 600, 20)
    assert not both.when_waiting and both.group == "a, b"
    assert strictest([]) is None


async def test_an_idle_gpu_session_is_kept_while_nobody_waits_then_reclaimed(open_manager):  # noqa: F811
    clock = [0.0]
    policy = {"idle_policy": {"fgpu_timeout": "20m", "timeout": "2h", "reclaim": "when_waiting"}}
    manager, hub, ends, notes = await keeper_for(open_manager, {"cs101": policy}, clock)
    usage = {"cpu_percent": 0.0}
    manager.usage_of = lambda session_id: usage
    session = await manager.mark_running(
        (await manager.submit(ask(user="alice", fgpu=2, cpu=1), groups=("cs101",)))["id"]
    )
    started = datetime.fromisoformat(session["started"]).timestamp()

    # Busy (CPU over the threshold) 10 minutes in: idle only 20 minutes after that.
    clock[0] = started + 600
    usage["cpu_percent"] = 80.0
    await ends.round()
    usage["cpu_percent"] = 0.5
    clock[0] = started + 600 + 1199
    await ends.round()
    assert (await manager.get(session["id"]))["ends"] is None
    clock[0] = started + 1800
    await ends.round()
    view = (await manager.get(session["id"]))["ends"]
    assert view["kept_idle"] and view["at"] is None  # idle, but nobody waits

    # A request that needs a GPU slice arrives: warned now, reclaimed after the lead.
    bob = await manager.submit(ask(user="bob", fgpu=1, cpu=1), groups=("cs101",))
    assert bob["status"] == Status.PENDING
    await ends.round()
    view = (await manager.get(session["id"]))["ends"]
    assert (view["why"], view["warning"], view["kept_idle"]) == (RECLAIMED, True, False)
    assert datetime.fromisoformat(view["at"]).timestamp() == started + 1800 + 600
    assert notes.calls[-1][:3] == ("warn", session["id"], False)  # no terminal: it is activity
    assert "another student waits" in notes.calls[-1][3]

    # The request is cancelled: the warning goes; it comes again with the next one.
    await manager.release(bob["id"])
    clock[0] += 60
    await ends.round()
    assert notes.calls[-1] == ("clear", session["id"])
    assert (await manager.get(session["id"]))["ends"]["kept_idle"]
    carol = await manager.submit(ask(user="bob", server="b", fgpu=1, cpu=1), groups=("cs101",))
    await ends.round()
    clock[0] += 599
    await ends.round()
    assert hub.stopped == []
    clock[0] += 1
    await ends.round()
    for task in list(ends._tasks):
        await task
    assert hub.stopped == [("alice", "")]
    code, reason = ends.spawner_claim("idle")  # the service's plan wins over the claim
    ended = await manager.release(session["id"], end_reason=code, reason=reason)
    assert ended["end_reason"] == RECLAIMED
    assert ended["reason"] == (
        "reclaimed for the queue: idle for 20 min while a request waited (group cs101)"
    )
    assert (await manager.get(carol["id"]))["status"] == Status.SCHEDULED


async def test_a_cpu_request_does_not_reclaim_for_a_gpu_request_it_cannot_serve(open_manager):  # noqa: F811
    clock = [0.0]
    policy = {"idle_policy": {"timeout": "10m", "reclaim": "when_waiting"}}
    manager, hub, ends, notes = await keeper_for(open_manager, {"cs101": policy}, clock)
    session = await running_session(manager)  # CPU only
    await manager.submit(ask(user="bob", fgpu=2, cpu=1), groups=("cs101",))
    await manager.submit(ask(user="bob", server="b", fgpu=1, cpu=1), groups=("cs101",))
    clock[0] = datetime.fromisoformat(session["started"]).timestamp() + 601
    await ends.round()
    # The GPU requests wait for GPU slices, which the CPU session does not hold.
    assert (await manager.get(session["id"]))["ends"]["kept_idle"]


async def test_an_always_policy_ends_an_idle_session_at_its_timeout(open_manager):  # noqa: F811
    clock = [0.0]
    policy = {"idle_policy": {"timeout": "10m"}}
    manager, hub, ends, notes = await keeper_for(open_manager, {"cs101": policy}, clock)
    session = await running_session(manager)
    started = datetime.fromisoformat(session["started"]).timestamp()
    clock[0] = started + 600
    await ends.round()
    for task in list(ends._tasks):
        await task
    assert hub.stopped == [("alice", "")]
    ended = await manager.release(session["id"])
    assert (ended["end_reason"], ended["reason"]) == (
        IDLE,
        "idle: no use for 10 min (group cs101)",
    )


async def test_one_waiting_request_reclaims_one_idle_session_the_longest_idle(open_manager):  # noqa: F811
    clock = [0.0]
    policy = {"idle_policy": {"fgpu_timeout": "10m", "reclaim": "when_waiting"}}
    manager, hub, ends, notes = await keeper_for(open_manager, {"cs101": policy}, clock)
    manager.usage_of = lambda session_id: {"cpu_percent": 0.0}
    first, second = [
        await manager.mark_running(
            (await manager.submit(ask(server=name, fgpu=1, cpu=1), groups=("cs101",)))["id"]
        )
        for name in ("a", "b")
    ]
    await manager.submit(ask(user="bob", fgpu=1, cpu=1), groups=("cs101",))
    clock[0] = datetime.fromisoformat(second["started"]).timestamp() + 601
    await ends.round()
    why = [(await manager.get(s["id"]))["ends"] for s in (first, second)]
    # One request, one reclaim: the other idle session is kept.
    assert (why[0]["why"], why[1]["why"], why[1]["kept_idle"]) == (RECLAIMED, None, True)


# --- batch jobs: their time limit alone ------------------------------------------------


async def running_job(manager, time_limit=None, user="alice"):
    from image_catalog.job_options import check_job

    job = check_job({"type": "batch", "command": "python train.py", "time_limit": time_limit})
    record = await manager.submit(ask(user=user, fgpu=0, job=job), groups=("cs101",))
    return await manager.mark_running(record["id"])


async def test_a_job_ends_timeout_at_its_time_limit_and_no_lifetime_or_idle_end_applies(
    open_manager,  # noqa: F811
):
    from queue_service.jobs import JobRules

    clock = [0.0]
    # A lifetime and an idle timeout far shorter than the job's limit: neither touches it.
    manager, hub, ends, notes = await keeper_for(
        open_manager, {"cs101": {"max_session_lifetime": "10m"}}, clock, idle_timeout=60
    )
    ends.job_limit = JobRules(time_limit=3600.0, time_limit_max=7200.0).limit_of
    job = await running_job(manager, time_limit="90m")
    started = datetime.fromisoformat(job["started"]).timestamp()

    clock[0] = started + 5400 - 1
    await ends.round()
    view = await manager.get(job["id"])
    assert view["ends"]["why"] == "timeout"
    assert view["ends"]["text"] == "time limit of 1 h 30 min"
    assert hub.stopped == [] and notes.calls == []  # a job is not warned inside

    clock[0] = started + 5400
    await ends.round()
    for task in list(ends._tasks):
        await task
    assert hub.stopped == [("alice", job["server_name"])]
    ended = await manager.release(job["id"])  # the spawner's release, naming no reason
    assert (ended["end_reason"], ended["status"]) == ("timeout", Status.TERMINATED)
    assert ended["reason"] == "timeout: the job ran for its time limit of 1 h 30 min"


async def test_a_job_without_a_limit_of_its_own_gets_the_sites_held_to_the_maximum(
    open_manager,  # noqa: F811
):
    from queue_service.jobs import JobRules

    clock = [0.0]
    manager, hub, ends, _ = await keeper_for(open_manager, {}, clock)
    ends.job_limit = JobRules(time_limit=7200.0, time_limit_max=1800.0).limit_of
    job = await running_job(manager)
    started = datetime.fromisoformat(job["started"]).timestamp()
    clock[0] = started + 1800
    await ends.round()
    for task in list(ends._tasks):
        await task
    assert hub.stopped == [("alice", job["server_name"])]


async def test_a_job_with_no_time_limit_at_all_does_not_stop_the_rounds(open_manager):  # noqa: F811
    """A site whose default limit is 0 (or a service built without job rules): the job has no
    planned end, and the other sessions' ends go on."""
    from queue_service.jobs import JobRules

    clock = [0.0]
    manager, hub, ends, _ = await keeper_for(
        open_manager, {"cs101": {"max_session_lifetime": "1h"}}, clock
    )
    ends.job_limit = JobRules(time_limit=0.0).limit_of
    job = await running_job(manager)
    session = await running_session(manager, user="bob")
    clock[0] = datetime.fromisoformat(session["started"]).timestamp() + 3600
    await ends.round()
    for task in list(ends._tasks):
        await task
    assert hub.stopped == [("bob", "")]
    assert (await manager.get(job["id"]))["ends"] is None
