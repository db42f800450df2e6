"""Many stops of spawns waiting in the queue, all at once: a real hub, the real service, simulated
GPUs, and the hub's REST API as `benchmarks/pending_spawns.py` drives it (a smaller crowd).

JupyterHub interrupts a pending spawn by cancelling it, waits one second, and answers 500 if the
spawn has not ended by then. Under a storm of stops the hub's loop runs late, the spawn's end lags
the second, and the server the hub kept was left listed as running with no container and no queue
record behind it: a ghost its student could not start again (2,000 waiting spawns: 129 of 2,000
stops answered 500). A crowd that size takes minutes to gather; here a smaller one waits, and the
hub's loop is held busy while the stops come, as a large crowd holds it (`BUSY_LOOP`).
"""

from __future__ import annotations

import asyncio
import secrets

import pytest

from benchmarks.pending_spawns import SESSION, create_users, each, no_sessions
from tests.harness import TEST_LABEL, QueueUser, containers_with, running_hub, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.hub]

#: Hub config: while a file `busy` is in the hub's folder, every turn of its event loop takes
#: 0.25 s more, as the work of thousands of waiting spawns and their stops makes it take.
BUSY_LOOP = """
import asyncio as _asyncio, os as _os, time as _time

def _hold(loop):
    if _os.path.exists("busy"):
        _time.sleep(0.25)
        loop.call_soon(_hold, loop)
    else:
        loop.call_later(0.05, _hold, loop)

_holding = []

def _start_holding(spawner):
    if not _holding:
        _holding.append(True)
        loop = _asyncio.get_running_loop()
        loop.call_later(0.05, _hold, loop)

c.FGPUSpawner.pre_spawn_hook = _start_holding
"""

#: Waiting spawns.
COUNT = 40
#: Starts in flight at once, as the benchmark sends them.
CONCURRENCY = 50


def _hub(tmp_path_factory, extra_config: str):
    """One simulated GPU, held by one session, so that every further request of 1 fGPU waits;
    spawn slots sized by the shipped config for the crowd (2 waiting per student)."""
    env = {
        "FGPU_SIMULATED_GPUS": "1x8GiB",
        "FGPU_UNITS_PER_GPU": "1",
        "FGPU_CLASS_SIZE": str(COUNT // 2),
    }
    workdir = tmp_path_factory.mktemp("pending-stops") / f"hub-{secrets.token_hex(3)}"
    return running_hub(workdir, env=env, extra_config=extra_config)


def _stop_a_waiting_crowd(hub) -> tuple[str, list[tuple[str, str]], dict]:
    """A holder of the GPU, COUNT spawns waiting behind it, then every one stopped at once while
    the hub's loop is busy: the holder, the crowd's servers, and the stops' answers."""
    # Names of this test's own: container names are the engine's, shared with other hubs.
    tag = secrets.token_hex(3)
    holder = f"holder-{tag}"
    assert hub.start_server(holder, SESSION, server="gpu").status_code in (201, 202)
    hub.wait_ready(holder, "gpu", timeout=180)
    servers = [(f"crowd-{tag}-{n}", f"s{k}") for n in range(COUNT // 2) for k in range(2)]
    create_users(hub, sorted({user for user, _ in servers}))
    started = asyncio.run(each(hub, "POST", servers, CONCURRENCY, SESSION))
    assert started["statuses"] == {202: COUNT}, started["statuses"]
    admin = QueueUser(hub, "admin")
    wait_until(
        lambda: sum(s["status"] == "PENDING" for s in admin.sessions()) == COUNT,
        300,
        f"all {COUNT} requests waiting in the queue",
        interval=1,
    )
    (hub.workdir / "busy").touch()
    try:
        stopped = asyncio.run(each(hub, "DELETE", servers, COUNT))
    finally:
        (hub.workdir / "busy").unlink()
    return holder, servers, stopped["statuses"]


def _nothing_left(hub, holder: str, servers) -> None:
    """The hub lists none of the crowd, the queue holds no record, no container is left, and a
    student can start the same server again."""
    wait_until(
        lambda: hub.active_servers() == {(holder, "gpu")},
        120,
        "the hub listing none of the stopped servers",
        interval=1,
    )
    hub.stop_server(holder, "gpu")
    admin = QueueUser(hub, "admin")
    wait_until(lambda: no_sessions(admin), 120, "no active record in the queue", interval=1)
    assert containers_with({TEST_LABEL: hub.run_id}) == []
    user, server = servers[0]
    again = hub.start_server(user, {**SESSION, "fgpu": 0}, server=server)
    assert again.status_code in (201, 202), again.text


def test_stopping_every_waiting_spawn_at_once_answers_no_500_and_leaves_no_ghost(
    tmp_path_factory, docker_engine
):
    with _hub(tmp_path_factory, BUSY_LOOP) as hub:
        holder, servers, statuses = _stop_a_waiting_crowd(hub)
        assert set(statuses) <= {202, 204}, statuses
        _nothing_left(hub, holder, servers)
