"""Batch jobs' site rules (queue_service/jobs.py): the time limit a job runs under, the longest it
may ask for, and how many one user may have waiting, checked where the queue admits a request,
on a real SQLite database through the project's store and QueueManager. No hub, no Docker."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from image_catalog.job_options import check_job
from queue_service.core import resource_model
from queue_service.core.status import Status
from queue_service.jobs import GroupJobTimes, JobRules, parse_job_time_limit, tightest
from queue_service.queue import QueueManager, Refused
from queue_service.queue_pass import SchedulerSettings
from queue_service.quotas import DEFAULT_USER_QUOTA, QuotaBook
from queue_service.store.db import open_database

MIB = 1024**2
GIB = 1024**3
NODE = resource_model.Node("node-1", "default", cpu=4.0, mem=8 * GIB, gpus=())


# --- the time limit a job runs under ------------------------------------------------------------


@pytest.mark.parametrize(
    "job, seconds",
    [
        ({"command": "x", "time_limit": None}, 3600.0),  # the site's default
        ({"command": "x"}, 3600.0),
        ({"command": "x", "time_limit": 600.0}, 600.0),  # its own, under the maximum
        ({"command": "x", "time_limit": 86400.0}, 86400.0),
        ({"command": "x", "time_limit": 2 * 86400.0}, 86400.0),  # never over the maximum
    ],
)
def test_a_job_runs_under_its_own_limit_or_the_sites_never_over_the_maximum(job, seconds):
    assert JobRules().limit_of(job) == seconds


def test_a_site_default_over_the_maximum_is_held_to_the_maximum():
    rules = JobRules(time_limit=7200.0, time_limit_max=3600.0)
    assert rules.limit_of({"command": "x", "time_limit": None}) == 3600.0


# --- admission, on a real database --------------------------------------------------------------


@pytest.fixture
def open_manager(tmp_path):
    engines = []

    def open_(
        rules: JobRules,
        quota: dict | None = None,
        settings: SchedulerSettings | None = None,
        incremental: bool = True,
    ) -> QueueManager:
        db = open_database(f"sqlite:///{tmp_path / 'queue.sqlite'}")
        engines.append(db.kw["bind"])
        return QueueManager(
            db,
            (NODE,),
            settings or SchedulerSettings(),
            QuotaBook(quota),
            incremental,
            admission_check=lambda db, request, groups: rules.refusal(db, request),
        )

    yield open_
    for engine in engines:
        engine.dispose()


def ask(user="alice", server="s", cpu=4.0, **job) -> dict:
    """A request for the whole node's CPU: the first one runs, the others wait."""
    request = {
        "user": user,
        "server_name": server,
        "image": "python-3.11",
        "cpu": cpu,
        "mem": 512 * MIB,
        "fgpu": 0.0,
    }
    if job:
        request["job"] = check_job({"type": "batch", **job})
    return request


async def test_a_time_limit_over_the_maximum_is_refused_with_both_in_the_message(open_manager):
    manager = open_manager(JobRules(time_limit_max=4 * 3600.0))
    with pytest.raises(
        Refused, match=r"^time_limit 5 h: a job's time limit is from 1 min to 4 h on this hub\.$"
    ):
        await manager.submit(ask(command="x", time_limit="5h"), groups=())
    assert manager.sessions() == []
    # At the maximum exactly: admitted.
    admitted = await manager.submit(ask(command="x", time_limit="4h"), groups=())
    assert admitted["type"] == "batch"
    assert admitted["job"] == {"command": "x", "time_limit": 14400.0}


async def test_a_user_may_have_so_many_jobs_waiting_and_one_more_when_one_starts(open_manager):
    manager = open_manager(JobRules(waiting_per_user=2))
    first = await manager.submit(ask(server="j0", command="sleep 60"), groups=())
    assert first["status"] == "SCHEDULED"  # running jobs do not count: only waiting ones
    for i in (1, 2):
        assert (await manager.submit(ask(server=f"j{i}", command="x"), groups=()))[
            "status"
        ] == "PENDING"
    with pytest.raises(Refused) as refused:
        await manager.submit(ask(server="j3", command="x"), groups=())
    assert str(refused.value) == (
        "You have 2 jobs waiting already, this hub's limit of waiting jobs per user "
        "(jobs_waiting_per_user); submit more once one has started, or cancel one."
    )
    assert refused.value.cause == "quota"
    # Another user's jobs, and this user's interactive sessions, are not held by it.
    assert (await manager.submit(ask(user="bob", server="j", command="x"), groups=()))[
        "status"
    ] == "PENDING"
    assert (await manager.submit(ask(server="notebook"), groups=()))["status"] == "PENDING"
    # One waiting job cancelled: one more may wait.
    waiting = [s for s in manager.sessions() if s["server_name"] == "j1"]
    await manager.release(waiting[0]["id"])
    assert (await manager.submit(ask(server="j4", command="x"), groups=()))["status"] == "PENDING"


async def test_a_launch_of_several_jobs_counts_each_against_the_limit_all_or_none(open_manager):
    manager = open_manager(JobRules(waiting_per_user=2))
    await manager.submit(ask(server="run", command="sleep 60"), groups=())  # takes the node
    many = [{**ask(server=f"j{i}", command="x"), "id": f"{i:032x}"} for i in range(3)]
    with pytest.raises(Refused, match="You have 2 jobs waiting already"):
        await manager.submit_many(many, groups=())
    assert [s["server_name"] for s in manager.sessions()] == ["run"]
    two = await manager.submit_many(many[:2], groups=())
    assert [s["status"] for s in two] == ["PENDING", "PENDING"]


async def test_zero_jobs_waiting_per_user_is_no_limit(open_manager):
    manager = open_manager(JobRules(waiting_per_user=0))
    for i in range(8):
        await manager.submit(ask(server=f"j{i}", command="x"), groups=())
    waiting = [s for s in manager.sessions() if s["status"] == Status.PENDING]
    assert len(waiting) == 7


async def test_interactive_requests_are_never_refused_by_the_job_rules(open_manager):
    rules = JobRules(time_limit_max=60.0, waiting_per_user=1)
    manager = open_manager(rules)
    for i in range(4):
        await manager.submit(ask(server=f"s{i}"), groups=())
    assert len(manager.sessions()) == 4
    # Directly: a request without a job is let through without a look at the database.
    assert rules.refusal(None, {"user": "alice", "job_json": None}) is None
    assert rules.refusal(None, {"user": "alice"}) is None


@pytest.mark.parametrize(
    ("value", "times"),
    [
        (None, GroupJobTimes()),
        ("2h", GroupJobTimes(7200.0, 7200.0)),
        ({"default": "30m"}, GroupJobTimes(1800.0, None)),
        ({"default": "30m", "max": 7200}, GroupJobTimes(1800.0, 7200.0)),
    ],
)
def test_a_groups_job_time_limit_is_a_duration_or_a_default_and_a_maximum(value, times):
    assert parse_job_time_limit(value, "group g") == times


@pytest.mark.parametrize(
    ("value", "words"),
    [({"default": "1h", "min": "1m"}, "unknown key"), ("soon", "not a duration")],
)
def test_a_malformed_group_job_time_limit_names_its_group(value, words):
    with pytest.raises(ValueError, match=f"group g: job_time_limit .*{words}"):
        parse_job_time_limit(value, "group g")


def test_a_member_of_several_groups_gets_the_tightest_default_and_maximum():
    times = tightest(
        iter([GroupJobTimes(3600.0, None), GroupJobTimes(None, 7200.0), GroupJobTimes(600.0, 9e4)])
    )
    assert times == GroupJobTimes(600.0, 7200.0)
    rules = JobRules(time_limit=1800.0, time_limit_max=86400.0, group_times=lambda user: times)
    assert rules.bounds("ann") == (600.0, 7200.0)
    assert rules.limit_of({"time_limit": None}, "ann") == 600.0
    assert rules.limit_of({"time_limit": 9000.0}, "ann") == 7200.0


# --- jobs waiting: their own limit, not the `pending` quota ---------------------------------------


async def test_waiting_jobs_count_against_their_own_limit_not_the_pending_quota(open_manager):
    manager = open_manager(JobRules(waiting_per_user=3), quota=DEFAULT_USER_QUOTA)
    assert DEFAULT_USER_QUOTA["pending"] == 2
    await manager.submit(ask(server="run"), groups=())  # takes the node: the rest wait
    for i in range(3):
        job = await manager.submit(ask(server=f"j{i}", command="x"), groups=())
        assert job["status"] == "PENDING"
    # A 4th job: the jobs' limit, named.
    with pytest.raises(Refused, match=r"^You have 3 jobs waiting .*\(jobs_waiting_per_user\)"):
        await manager.submit(ask(server="j3", command="x"), groups=())
    # Three jobs wait, and the user may still have 2 sessions waiting, not one more.
    for name in ("s1", "s2"):
        assert (await manager.submit(ask(server=name), groups=()))["status"] == "PENDING"
    with pytest.raises(Refused) as refused:
        await manager.submit(ask(server="s3"), groups=())
    assert refused.value.cause == "quota"
    assert "pending" in str(refused.value) and "2 are waiting" in str(refused.value)
    # The resource indicator's `pending` figure counts the sessions alone.
    limits = (await manager.resources("alice", (), admin=False))["limits"]
    pending = next(row for row in limits if row["kind"] == "pending")
    assert (pending["used"], pending["limit"], pending["reached"]) == (2, 2, True)


# --- start not before ---------------------------------------------------------------------------


def _in(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


async def _until(condition, timeout=10.0):
    for _ in range(int(timeout / 0.1)):
        if condition():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("timed out")


def _view(manager, server):
    return next(s for s in manager.sessions() if s["server_name"] == server)


@pytest.mark.parametrize(
    ("incremental", "policy"), [(True, "fifo"), (False, "fifo"), (True, "drf")]
)
async def test_a_deferred_job_waits_out_of_line_then_joins_it_at_the_end(
    open_manager, incremental, policy
):
    """The same with the incremental pass, the reference pass over everything, and DRF."""
    settings = SchedulerSettings(policy=policy)
    manager = open_manager(JobRules(), settings=settings, incremental=incremental)
    job = await manager.submit(ask(server="later", cpu=2.0, command="x", start_after=_in(2)), ())
    assert job["status"] == "PENDING"
    assert job["position"] is None
    assert job["reason"].startswith("Waits until ") and job["reason"].endswith(" UTC, as asked")
    assert job["start_after"] == job["job"]["start_after"]
    # It holds nothing: a later session takes the whole node at once; one more waits 1st in line.
    assert (await manager.submit(ask(server="a"), ()))["status"] == "SCHEDULED"
    b = await manager.submit(ask(server="b"), ())
    assert (b["status"], b["position"]) == ("PENDING", 1)
    assert _view(manager, "later")["position"] is None
    # Its time comes: it joins the line by itself (the manager's timer), behind `b`, which asked
    # before that time.
    await _until(lambda: _view(manager, "later")["position"] is not None)
    assert _view(manager, "later")["position"] == 2
    assert _view(manager, "b")["position"] == 1
    await manager.release(_view(manager, "a")["id"])
    assert _view(manager, "b")["status"] == "SCHEDULED"
    assert _view(manager, "later")["position"] == 1
    await manager.release(_view(manager, "b")["id"])
    later = _view(manager, "later")
    assert (later["status"], later["position"]) == ("SCHEDULED", None)


async def test_a_deferred_job_on_a_free_node_starts_at_its_time_not_before(open_manager):
    manager = open_manager(JobRules())
    job = await manager.submit(ask(server="later", command="x", start_after=_in(1.5)), ())
    assert job["status"] == "PENDING"
    await manager.schedule()  # a pass (the reconciler's) before its time places nothing
    assert _view(manager, "later")["status"] == "PENDING"
    await _until(lambda: _view(manager, "later")["status"] == "SCHEDULED")


async def test_a_deferred_jobs_pending_timeout_counts_from_its_start_after(open_manager):
    settings = SchedulerSettings(job_pending_timeout=2.0)
    manager = open_manager(JobRules(), settings=settings)
    await manager.submit(ask(server="run"), ())  # the node is taken: the job will wait
    await manager.submit(ask(server="later", command="x", start_after=_in(2.5)), ())
    await asyncio.sleep(3.5)  # over 2 s since its submission, 1 s since its start_after
    await manager.schedule()
    assert _view(manager, "later")["status"] == "PENDING"
    assert _view(manager, "later")["position"] == 1
    await asyncio.sleep(1.8)  # over 2 s since its start_after
    await manager.schedule()
    assert "later" not in [s["server_name"] for s in manager.sessions()]
    ended = [s for s in await manager.history("alice") if s["server_name"] == "later"]
    assert ended[0]["status"] == "PENDING_TIMEOUT"


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (-120, r"^start_after .* is 2 min( 1 s)? in the past; leave it out"),
        (
            8 * 86400,
            r"^start_after .* is 19[12] h.* ahead; a job may be deferred by at most 7 days",
        ),
    ],
)
async def test_a_start_after_too_far_back_or_ahead_is_refused_and_nothing_queued(
    open_manager, seconds, words
):
    manager = open_manager(JobRules())
    with pytest.raises(Refused, match=words) as refused:
        await manager.submit(ask(server="j", command="x", start_after=_in(seconds)), ())
    assert refused.value.cause == "invalid"
    assert manager.sessions() == []


async def test_a_start_after_within_the_last_minute_or_at_the_maximum_is_taken(open_manager):
    manager = open_manager(JobRules(start_after_max=3600.0))
    now = await manager.submit(ask(server="a", cpu=1.0, command="x", start_after=_in(-30)), ())
    assert now["status"] == "SCHEDULED"  # its time has come: it joins the line at once
    later = await manager.submit(ask(server="b", cpu=1.0, command="x", start_after=_in(3590)), ())
    assert (later["status"], later["position"]) == ("PENDING", None)
    with pytest.raises(Refused, match="deferred by at most 1 h"):
        await manager.submit(ask(server="c", command="x", start_after=_in(3700)), ())


async def test_a_deferred_job_of_a_launch_of_several_is_not_placed_either(open_manager):
    manager = open_manager(JobRules())
    later = _in(60)
    many = [
        {**ask(server=f"j{i}", cpu=1.0, command="x", start_after=later), "id": f"{i:032x}"}
        for i in range(2)
    ]
    jobs = await manager.submit_many(many, groups=())
    assert [(j["status"], j["position"]) for j in jobs] == [("PENDING", None)] * 2
    assert all(j["reason"].startswith("Waits until ") for j in jobs)
    now = await manager.submit(ask(server="now", cpu=1.0), ())
    assert now["status"] == "SCHEDULED"
