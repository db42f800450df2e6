"""The reconciler against a real Docker engine: records and the containers that really run.

The containers here are plain `sleep` containers carrying the session label the spawner sets; the
records live in a real SQLite database. The hub's side (stopping through its API) is tested end to
end in test_queue_service.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from datetime import UTC, datetime

import docker
import pytest
from sqlalchemy import update

from fgpu_spawner.container_spec import ContainerContext, session_labels
from fgpu_spawner.grant import Grant
from fgpu_spawner.request import ResourceRequest
from queue_service import reconciler as reconciler_module
from queue_service.core import resource_model
from queue_service.core.status import Status
from queue_service.engine.errors import ENGINE_ERRORS
from queue_service.engine.session_containers import SESSION_LABEL, DockerSessionLister
from queue_service.queue import QueueManager, Refused
from queue_service.queue_pass import SchedulerSettings
from queue_service.quotas import QuotaBook
from queue_service.reconciler import Reconciler
from queue_service.store.db import open_database
from queue_service.store.models import SessionRecord

from .harness import TEST_LABEL, containers_with, remove_containers

pytestmark = pytest.mark.docker
GIB = 1024**3
NODE = resource_model.Node(
    "node-1", "default", cpu=4.0, mem=8 * GIB, gpus=(resource_model.Gpu("GPU-r-0", 8 * GIB, 80),)
)
IMAGE = "fgpu/jupyter-base:py3.11"


@pytest.fixture
def run_id(docker_engine):
    run = secrets.token_hex(6)
    yield run
    remove_containers({TEST_LABEL: run})


@pytest.fixture
def manager(tmp_path):
    db = open_database(f"sqlite:///{tmp_path / 'queue.sqlite'}")
    yield QueueManager(db, [NODE], SchedulerSettings(units_per_gpu=2), QuotaBook())
    db.kw["bind"].dispose()


def on_engine(manager, client, **settings) -> Reconciler:
    """A reconciler of the sessions on one engine (the single-host backend's session lister)."""
    return Reconciler(manager, sessions=DockerSessionLister(client), **settings)


def session_container(docker_engine, run_id: str, session_id: str):
    return docker_engine.containers.run(
        IMAGE,
        ["sleep", "300"],
        detach=True,
        labels={SESSION_LABEL: session_id, TEST_LABEL: run_id},
    )


async def running_session(manager, docker_engine, run_id, server="s1") -> tuple[dict, object]:
    request = {"user": "alice", "server_name": server, "image": "python-3.11"}
    session = await manager.submit({**request, "cpu": 0.5, "mem": GIB, "fgpu": 1}, groups=())
    container = session_container(docker_engine, run_id, session["id"])
    await manager.mark_running(session["id"])
    return session, container


async def test_a_container_of_an_ended_record_is_stopped_and_removed(
    manager, docker_engine, run_id
):
    session, container = await running_session(manager, docker_engine, run_id)
    await manager.release(session["id"])  # the record ends; the container did not hear of it
    assert (await manager.get(session["id"]))["status"] == Status.TERMINATED
    await on_engine(manager, docker_engine).reconcile()
    assert containers_with({SESSION_LABEL: session["id"]}) == []


async def test_a_record_ended_outside_the_service_is_seen_in_the_next_round(
    manager, docker_engine, run_id
):
    """An admin's SQL (or a restored backup) ends a record behind the service's back: the round
    reads the records from the DB, so the container is stopped and the record is no longer
    counted as active."""
    session, container = await running_session(manager, docker_engine, run_id)
    with manager.db.begin() as db:
        db.execute(
            update(SessionRecord)
            .where(SessionRecord.id == session["id"])
            .values(status=Status.TERMINATED)
        )
    await on_engine(manager, docker_engine).reconcile()
    assert [r.id for r in manager.active_records()] == []
    assert (await manager.get(session["id"]))["status"] == Status.TERMINATED
    assert containers_with({SESSION_LABEL: session["id"]}) == []


async def test_the_containers_of_active_and_foreign_sessions_are_left_alone(
    manager, docker_engine, run_id
):
    session, container = await running_session(manager, docker_engine, run_id)
    # Another hub's session on the same engine: its id is no record of this service.
    foreign = session_container(docker_engine, run_id, secrets.token_hex(16))
    await on_engine(manager, docker_engine).reconcile()
    for kept in (container, foreign):
        kept.reload()
        assert kept.status == "running"
    assert (await manager.get(session["id"]))["status"] == Status.RUNNING


async def test_a_paused_container_is_alive(manager, docker_engine, run_id):
    """A container paused by hand (`docker pause`, or a `docker commit` run by hand) is alive: it
    keeps its session and slice."""
    session, container = await running_session(manager, docker_engine, run_id)
    container.pause()
    await on_engine(manager, docker_engine).reconcile()
    assert (await manager.get(session["id"]))["status"] == Status.RUNNING
    container.reload()
    assert container.status == "paused"


@pytest.mark.parametrize("fate", ["died", "removed"])
async def test_a_container_lost_outside_the_hub_frees_its_slice(
    manager, docker_engine, run_id, fate
):
    session, container = await running_session(manager, docker_engine, run_id)
    # 2 fGPU in all: the second 1 fGPU request is granted, the third waits for the lost slice.
    second = await manager.submit(
        {"user": "bob", "server_name": "", "image": "x", "cpu": 0.5, "mem": GIB, "fgpu": 1}, ()
    )
    third = await manager.submit(
        {"user": "carol", "server_name": "", "image": "x", "cpu": 0.5, "mem": GIB, "fgpu": 1}, ()
    )
    assert (second["status"], third["status"]) == (Status.SCHEDULED, Status.PENDING)
    if fate == "died":
        container.kill()
    else:
        container.remove(force=True)
    # The second grant's container is still starting; only the lost one is released.
    await on_engine(manager, docker_engine).reconcile()
    ended = await manager.get(session["id"])
    assert ended["status"] == Status.TERMINATED and ended["reason"] == "the container stopped"
    assert ended["end_reason"] == "lost"
    assert (await manager.get(second["id"]))["status"] == Status.SCHEDULED
    assert (await manager.get(third["id"]))["status"] == Status.SCHEDULED


class EngineThatAnswersLate:
    """The real engine, whose container list reaches the caller only after `meanwhile` has run
    on the event loop: what happens when a session starts while the engine is answering."""

    def __init__(self, engine, meanwhile):
        self.engine, self.meanwhile = engine, meanwhile
        self.loop = asyncio.get_running_loop()

    @property
    def containers(self):
        return self

    def list(self, **kwargs):
        answer = self.engine.containers.list(**kwargs)
        asyncio.run_coroutine_threadsafe(self.meanwhile(), self.loop).result(timeout=60)
        return answer


async def test_a_session_that_starts_while_the_engine_lists_is_not_taken_for_lost(
    manager, docker_engine, run_id
):
    request = {"user": "alice", "server_name": "s1", "image": "python-3.11"}
    session = await manager.submit({**request, "cpu": 0.5, "mem": GIB, "fgpu": 1}, groups=())
    assert session["status"] == Status.SCHEDULED

    async def the_session_starts():
        session_container(docker_engine, run_id, session["id"])
        await manager.mark_running(session["id"])

    await on_engine(manager, EngineThatAnswersLate(docker_engine, the_session_starts)).reconcile()
    assert (await manager.get(session["id"]))["status"] == Status.RUNNING
    assert len(containers_with({SESSION_LABEL: session["id"]})) == 1


# -- nothing leaks, nothing starts by itself ----------------------------------

DEPLOYMENT = "this-hub"


def labelled_container(docker_engine, run_id: str, session_id: str, deployment: str, gpus: dict):
    """A container labelled as the spawner labels a session (container_spec.session_labels)."""
    request = ResourceRequest("python-3.11", IMAGE, cpu=0.5, mem=GIB, fgpu=2.0)
    context = ContainerContext(
        name=f"orphan-{session_id[:8]}",
        user="orphan",
        server_name="lost",
        command=[],
        env={},
        port=8888,
        network="bridge",
        deployment_id=deployment,
    )
    labels = session_labels(request, Grant(session_id, NODE.name, gpus), context)
    return docker_engine.containers.run(
        IMAGE, ["sleep", "300"], detach=True, labels={**labels, TEST_LABEL: run_id}
    )


async def test_a_container_of_this_hub_with_no_record_is_adopted_with_its_slice(
    manager, docker_engine, run_id
):
    """The service's DB was lost: the session keeps running, and its GPU is not granted twice."""
    orphan_id, foreign_id = secrets.token_hex(16), secrets.token_hex(16)
    orphan = labelled_container(docker_engine, run_id, orphan_id, DEPLOYMENT, {"GPU-r-0": 1.0})
    foreign = labelled_container(docker_engine, run_id, foreign_id, "other-hub", {"GPU-r-0": 1.0})
    manager.engine_problem = "not counted yet"  # as the service starts
    await on_engine(manager, docker_engine, deployment_id=DEPLOYMENT).reconcile()
    adopted = await manager.get(orphan_id)
    assert adopted["status"] == Status.RUNNING
    assert adopted["grant"] == {
        "session_id": orphan_id,
        "node": NODE.name,
        "gpus": {"GPU-r-0": 1.0},
    }
    assert (adopted["user"], adopted["server_name"], adopted["fgpu"]) == ("orphan", "lost", 2.0)
    assert manager.engine_problem is None
    # The whole (only) GPU is the orphan's: an fGPU request now waits.
    request = {"user": "bob", "server_name": "", "image": "x", "cpu": 0.5, "mem": GIB, "fgpu": 1}
    assert (await manager.submit(request, ()))["status"] == Status.PENDING
    # Another hub's session on the same engine is neither adopted nor touched.
    with pytest.raises(KeyError):
        (await manager.get(foreign_id))
    for kept in (orphan, foreign):
        kept.reload()
        assert kept.status == "running"


async def test_a_waiting_record_whose_container_runs_takes_its_grant(
    manager, docker_engine, run_id
):
    """A restored backup is older than the engine: a request it has as PENDING was granted and
    started since. Its container runs on, and its slice counts before anything is granted."""
    request = {"user": "orphan", "server_name": "lost", "image": "python-3.11", "cpu": 0.5}
    session = await manager.submit({**request, "mem": GIB, "fgpu": 2}, groups=())
    with manager.db.begin() as db:  # the older copy of the record
        db.execute(
            update(SessionRecord)
            .where(SessionRecord.id == session["id"])
            .values(status=Status.PENDING, node=None, grant_json=None, scheduled_at=None)
        )
    await manager.refresh()
    assert (await manager.get(session["id"]))["status"] == Status.PENDING
    container = labelled_container(
        docker_engine, run_id, session["id"], DEPLOYMENT, {"GPU-r-0": 1.0}
    )
    manager.engine_problem = "not counted yet"  # as the service starts
    await on_engine(manager, docker_engine, deployment_id=DEPLOYMENT).reconcile()
    adopted = await manager.get(session["id"])
    assert adopted["status"] == Status.RUNNING
    assert adopted["grant"]["gpus"] == {"GPU-r-0": 1.0}
    assert "still waiting" in adopted["reason"]
    other = {"user": "bob", "server_name": "", "image": "x", "cpu": 0.5, "mem": GIB, "fgpu": 1}
    assert (await manager.submit(other, ()))["status"] == Status.PENDING
    container.reload()
    assert container.status == "running"


async def test_an_engine_that_does_not_answer_stops_grants_until_it_does(
    manager, docker_engine, tmp_path
):
    away = docker.DockerClient(base_url=f"unix://{tmp_path / 'nothing.sock'}", version="1.41")
    reconciler = on_engine(manager, away)
    with pytest.raises(ENGINE_ERRORS):
        await reconciler.reconcile()
    assert "not answering" in manager.engine_problem
    request = {"user": "bob", "server_name": "", "image": "x", "cpu": 0.5, "mem": GIB, "fgpu": 1}
    with pytest.raises(Refused, match="Docker engine is not answering") as refused:
        await manager.submit(request, ())
    assert refused.value.cause == "unavailable"
    reconciler.sessions = DockerSessionLister(docker_engine)  # the engine is back
    await reconciler.reconcile()
    assert manager.engine_problem is None
    assert (await manager.submit(request, ()))["status"] == Status.SCHEDULED


class HubListing:
    """Stands in for the hub's REST API: which servers the hub has ready
    (HubClient.ready_server_starts), and which others it still starts or stops (in `user_now`)."""

    def __init__(self, servers: set, starting: set = frozenset(), stopping: set = frozenset()):
        self.servers, self.starting, self.stopping = servers, starting, stopping
        # When each ready server was started (ISO text); an hour ago unless set.
        self.started: dict = {}
        self.stopped: list = []

    async def ready_server_starts(self) -> dict:
        an_hour_ago = datetime.fromtimestamp(time.time() - 3600, UTC).isoformat()
        return {key: self.started.get(key, an_hour_ago) for key in self.servers}

    async def stop_server(self, user: str, server_name: str) -> int:
        self.stopped.append((user, server_name))
        self.servers = self.servers - {(user, server_name)}
        return 204

    async def user_now(self, name: str) -> dict:
        known = {(user, server): {} for user, server in self.servers | self.starting}
        known.update({key: {"pending": "stop"} for key in self.stopping})
        return {
            "servers": {server: model for (user, server), model in known.items() if user == name}
        }


async def test_a_running_session_the_hub_no_longer_lists_is_stopped_then_released(
    manager, docker_engine, run_id
):
    """The spawner's stop failed, so it kept the grant; the hub forgot the server regardless."""
    session, container = await running_session(manager, docker_engine, run_id)
    hub = HubListing({("alice", "s1")})
    reconciler = on_engine(manager, docker_engine, hub=hub, unlisted_grace=0)
    await reconciler.reconcile()
    assert (await manager.get(session["id"]))["status"] == Status.RUNNING  # listed: left alone
    hub.servers = set()
    await reconciler.reconcile()
    ended = await manager.get(session["id"])
    assert (ended["status"], ended["reason"]) == (
        Status.TERMINATED,
        "the hub had stopped its server",
    )
    assert ended["end_reason"] == "hub_stopped"
    assert containers_with({SESSION_LABEL: session["id"]}) == []


async def test_a_server_the_hub_lists_with_nothing_behind_it_is_stopped_after_the_grace(
    manager, docker_engine, run_id
):
    """A ghost: listed ready, no live record, no container (a stop the hub refused half-way).
    A server with a session, one with a waiting record, one with only a container, and one the
    hub has just started are left alone."""
    session, _ = await running_session(manager, docker_engine, run_id)
    request = {"user": "carol", "server_name": "w", "image": "python-3.11", "cpu": 0.5}
    waiting = await manager.submit({**request, "mem": GIB, "fgpu": 2}, groups=())
    assert waiting["status"] == Status.PENDING
    docker_engine.containers.run(
        IMAGE,
        ["sleep", "300"],
        detach=True,
        labels={SESSION_LABEL: "no-record", "fgpu.user": "dave", TEST_LABEL: run_id},
    )
    ghost, fresh = ("alice", "ghost"), ("bob", "new")
    hub = HubListing({("alice", "s1"), ("carol", "w"), ("dave", ""), ghost, fresh})
    hub.started[fresh] = datetime.now(UTC).isoformat()
    reconciler = on_engine(manager, docker_engine, hub=hub, ghost_grace=60)
    await reconciler.reconcile()
    assert hub.stopped == [ghost]
    assert (await manager.get(session["id"]))["status"] == Status.RUNNING
    assert (await manager.get(waiting["id"]))["status"] == Status.PENDING


async def test_a_running_session_whose_server_the_hub_still_checks_is_left_alone(
    manager, docker_engine, run_id
):
    """Under load the hub takes a while to find a new server ready: not listed as ready, but
    still the hub's, its container keeps running."""
    session, container = await running_session(manager, docker_engine, run_id)
    hub = HubListing(set(), starting={("alice", "s1")})
    reconciler = on_engine(manager, docker_engine, hub=hub, unlisted_grace=0)
    await reconciler.reconcile()
    assert (await manager.get(session["id"]))["status"] == Status.RUNNING
    assert containers_with({SESSION_LABEL: session["id"]}) != []


async def test_a_container_the_hubs_stop_removed_ends_with_the_stops_reason_not_as_lost(
    manager, docker_engine, run_id
):
    """The spawner removes the container, then releases the grant: a round between the two
    leaves the session to that release while the hub is stopping its server. Once the hub no
    longer stops it (its stop failed after the removal), the session is lost."""
    session, container = await running_session(manager, docker_engine, run_id)
    other, other_container = await running_session(manager, docker_engine, run_id, "s2")
    hub = HubListing(set(), stopping={("alice", "s1"), ("alice", "s2")})
    reconciler = on_engine(manager, docker_engine, hub=hub)
    container.remove(force=True)
    other_container.remove(force=True)
    await reconciler.reconcile()
    assert (await manager.get(session["id"]))["status"] == Status.RUNNING
    await manager.release(session["id"])
    assert (await manager.get(session["id"]))["end_reason"] == "user"
    hub.stopping = set()
    await reconciler.reconcile()
    assert (await manager.get(other["id"]))["end_reason"] == "lost"


class HubReads:
    """Stands in for the hub's REST API: counts the reads of users
    (HubClient.user_with_stopped_servers); the hub lists every server as still spawning."""

    def __init__(self):
        self.reads: list[str] = []

    async def user_with_stopped_servers(self, name: str) -> dict:
        self.reads.append(name)
        return {"servers": {"s1": {"pending": "spawn"}}}


async def test_a_spawn_is_issued_again_only_after_none_was_seen_waiting_for_the_grace(
    manager, monkeypatch
):
    """A cancelled spawn's long-poll ends before its release arrives, and a storm of stops
    delays that release by tens of seconds: counting the grace from the request's creation, the
    reconciler issued the spawn again and undid the cancel (70 times in pending_spawns). The
    grace now counts from when no spawn was first seen waiting."""
    holder = {"user": "bob", "server_name": "s0", "image": "x", "cpu": 0.5, "mem": GIB, "fgpu": 2}
    assert (await manager.submit(holder, ()))["status"] == Status.SCHEDULED
    waiting = await manager.submit({**holder, "user": "alice", "server_name": "s1", "fgpu": 1}, ())
    clock = [time.time() + 3600]  # the request is an hour old: past any grace since creation
    monkeypatch.setattr(reconciler_module.time, "time", lambda: clock[0])
    hub = HubReads()
    reconciler = Reconciler(manager, sessions=None, hub=hub, respawn_grace=60)
    await reconciler.respawn_abandoned()
    assert hub.reads == []  # first seen unwatched now: left be
    clock[0] += 59
    await reconciler.respawn_abandoned()
    assert hub.reads == []
    clock[0] += 2
    await reconciler.respawn_abandoned()
    assert "alice" in hub.reads  # (the holder's grant has no spawn either: asked too)
    assert (await manager.get(waiting["id"]))["status"] == Status.PENDING


async def test_a_spawn_waiting_on_its_long_poll_costs_the_hub_no_read(manager):
    """With 1,000 students waiting, a read of each from the hub every round (5 s) was 200 reads
    a second, and the hub's own API stalled for seconds. A record whose spawn holds a long-poll
    on it is known alive; one with none is still checked with the hub."""
    holder = {"user": "bob", "server_name": "s0", "image": "x", "cpu": 0.5, "mem": GIB, "fgpu": 2}
    assert (await manager.submit(holder, ()))["status"] == Status.SCHEDULED
    waiting = await manager.submit({**holder, "user": "alice", "server_name": "s1", "fgpu": 1}, ())
    assert waiting["status"] == Status.PENDING
    hub = HubReads()
    reconciler = Reconciler(manager, sessions=None, hub=hub, respawn_grace=0)
    poll = asyncio.create_task(manager.wait(waiting["id"], waiting["version"], 30))
    while not manager.awaited(waiting["id"]):
        await asyncio.sleep(0.01)
    await reconciler.respawn_abandoned()
    assert "alice" not in hub.reads
    poll.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await poll
    await reconciler.respawn_abandoned()  # no spawn waits on it now: the hub is asked
    assert "alice" in hub.reads


class HubAfterACrash:
    """Stands in for the hub's REST API after a crash: the servers whose spawn it runs again
    (`pending`, as HubClient.user_with_stopped_servers reads them), the options it kept for
    servers (`saved`: their `user_options`), and the spawns it is asked to issue."""

    def __init__(self, pending: set[tuple[str, str]], saved: dict | None = None):
        self.pending = pending
        self.saved = saved or {}
        self.started: list[tuple[str, str]] = []
        self.options: dict[tuple[str, str], dict] = {}

    async def user_with_stopped_servers(self, name: str) -> dict:
        servers = {
            server: {"pending": None, "user_options": options}
            for (user, server), options in self.saved.items()
            if user == name
        }
        servers.update(
            {server: {"pending": "spawn"} for user, server in self.pending if user == name}
        )
        return {"servers": servers}

    async def start_server(self, user: str, server_name: str, options: dict) -> int:
        self.started.append((user, server_name))
        self.options[(user, server_name)] = options
        return 202


async def issued_now(reconciler: Reconciler, hub: HubAfterACrash) -> list[tuple[str, str]]:
    """The spawns one round issues (their tasks awaited)."""
    before = len(hub.started)
    await reconciler.respawn_abandoned()
    await asyncio.gather(*list(reconciler._tasks))
    return sorted(hub.started[before:])


async def test_after_a_crash_a_lost_spawn_is_issued_again_at_once_and_never_twice(tmp_path):
    """With the whole hub SIGKILLed, every waiting spawn died with it, and with the service
    (which ends with its hub) any release of theirs: the next service issues them again in its
    first round, not after `respawn_grace`, unless the hub says it runs that spawn already; a
    spawn it issued is left alone the round after, whatever the hub says."""
    url = f"sqlite:///{tmp_path / 'queue.sqlite'}"
    crashed = QueueManager(
        open_database(url), [NODE], SchedulerSettings(units_per_gpu=2), QuotaBook()
    )
    holder = {"user": "bob", "server_name": "s0", "image": "x", "cpu": 0.5, "mem": GIB, "fgpu": 2}
    assert (await crashed.submit(holder, ()))["status"] == Status.SCHEDULED
    for user in ("alice", "carol"):
        await crashed.submit({**holder, "user": user, "server_name": "s1", "fgpu": 1}, ())
    db = open_database(url)  # the next service, on the same database
    manager = QueueManager(db, [NODE], SchedulerSettings(units_per_gpu=2), QuotaBook())
    # carol's spawn is running again already (she opened her server's page): not issued twice.
    hub = HubAfterACrash(pending={("carol", "s1")})
    reconciler = Reconciler(manager, sessions=None, hub=hub, respawn_grace=3600)

    assert await issued_now(reconciler, hub) == [("alice", "s1"), ("bob", "s0")]
    # The round after: the spawns it issued are not listed as pending yet, and stay alone.
    assert await issued_now(reconciler, hub) == []
    # carol's spawn asks about its record, then is cancelled: the hub no longer runs it, and its
    # release may be on its way; a spawn of this life still gets the grace.
    await manager.wait(carol_id(manager), "", 0)
    hub.pending = set()
    assert await issued_now(reconciler, hub) == []
    db.kw["bind"].dispose()
    crashed.db.kw["bind"].dispose()


def carol_id(manager: QueueManager) -> str:
    (record,) = [r for r in manager.active_records() if r.user == "carol"]
    return record.id


async def test_a_lost_spawn_issued_again_keeps_the_options_the_hub_saved(manager):
    """The spawn was asked for with storage folders, environment variables and a name of its own
    (the hub keeps them as the server's `user_options`); issued again from the record alone, it
    lost them all. The hub's saved options come back, under the record's own slots and job (a
    request key names the lost start only, and a preset is the record's slots now); a server the
    hub kept no options for is issued from the record, as before."""
    job = {"user": "alice", "server_name": "job-1", "image": "x", "cpu": 0.5, "mem": GIB}
    job = {**job, "fgpu": 1, "job": '{"command":"python train.py","time_limit":null}'}
    first = await manager.submit(job, ())
    plain = await manager.submit({**job, "server_name": "s2", "job": None}, ())
    saved = {
        "image": "x",
        "preset": "small",
        "type": "batch",
        "command": "python train.py",
        "folders": ["data"],
        "env": {"SEED": "7"},
        "request_key": first["id"],
        "mem": "1G",
    }
    hub = HubAfterACrash(pending=set(), saved={("alice", "job-1"): saved})
    reconciler = Reconciler(manager, sessions=None, hub=hub, respawn_grace=0)
    assert await issued_now(reconciler, hub) == [("alice", "job-1"), ("alice", "s2")]
    assert hub.options[("alice", "job-1")] == {
        "image": "x",
        "cpu": 0.5,
        "mem": GIB,
        "fgpu": 1.0,
        "resource_group": None,
        "type": "batch",
        "command": "python train.py",
        "time_limit": None,
        "folders": ["data"],
        "env": {"SEED": "7"},
    }
    assert hub.options[("alice", "s2")] == {
        "image": "x",
        "cpu": 0.5,
        "mem": GIB,
        "fgpu": 1.0,
        "resource_group": None,
    }
    assert plain["status"] in (Status.PENDING, Status.SCHEDULED)
