"""Swarm mode: spawn time against the single-host spawner in the same run, then a spawn storm.

The benchmark brings up its own Swarm lab (`scripts/swarm-lab`, 3 worker nodes of one simulated GPU
each, under a lab name and network of its own, `--lab-name` and `--lab-net`) and takes it down at
the end; a lab of that name that is up already is reused and left up (`--keep-lab` leaves the
one it made up too). Two real hubs run side by side from the shipped
config: one on this machine's engine (FGPUSpawner), one in Swarm mode on the lab
(FGPUSwarmSpawner, `FGPU_ENGINE=swarm` and the environment the lab prints).

1. Spawn time: `POST /hub/api/users/{name}/servers/` → the hub marks the server ready, then stop;
   spawns alternate between the two hubs so both see the same machine load (spawn_time.py's
   measure). Every lab node has pulled the image before the timing starts.
2. Spawn storm: N sessions (default 60, one per user) posted to the Swarm hub's REST API at once:
   0.5 CPU each, 256M or 512M, every 10th asks for 1 fGPU. Each lab node reports the machine's
   CPUs, so a dozen run and the rest wait PENDING. Measured: time until every request is RUNNING or
   PENDING, and until every granted server is ready. Checked: the waiting ones hold positions
   1..k in the order the queue received them, and none was overtaken by a later request of the
   same shape; no slice is granted twice (per node CPU within the node's, each GPU once; one
   service per grant, on its node); 0 errors (no 4xx/5xx or 429 from the hub, no ERROR record, no
   error line in the hub's log). Then every server is stopped (waiting ones first) and nothing
   may be left: no active server, no active record, no session service on the manager, no
   session container on any node, and every record of the run ended.

The machine is shared and small: each figure is printed with `uptime`.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from benchmarks.spawn_time import FGPU_OPTIONS, IMAGE, summary, time_one_spawn
from tests.harness import TEST_LABEL, QueueUser, running_hub
from tests.swarm_lab import engine_client, parse_exports, swarm_lab, wait_for

LAB_DEFAULTS = {
    "FGPU_SWARM_LAB_NAME": "fgpu-labb",
    "FGPU_SWARM_LAB_NET": "10.209",
    "FGPU_SWARM_LAB_POOL": "10.218.0.0/16",
}
NODES = 3
GPUS = "1x8GiB"
GPU_EVERY = 10
FINAL = {"TERMINATED", "CANCELLED", "ERROR", "PENDING_TIMEOUT"}
HUB_ERROR_LINE = re.compile(r"^\[E .*$", re.MULTILINE)
# JupyterHub's proxy client logs an error when it stops a server that never had a route (one that
# was waiting), then handles it: "Route /user/NAME/ already deleted".
PROXY_404 = re.compile(r"api_request to proxy failed: 404, .*url='[^']*/api/routes(/\S+?)'")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def add_lab_arguments(parser) -> None:
    """The options that name the lab a Swarm benchmark runs on, and whether it stays up."""
    parser.add_argument(
        "--lab-name",
        default=LAB_DEFAULTS["FGPU_SWARM_LAB_NAME"],
        help="the lab to use: one that is up is reused and left up, else made and taken down",
    )
    parser.add_argument("--lab-net", default=LAB_DEFAULTS["FGPU_SWARM_LAB_NET"])
    parser.add_argument("--lab-pool", default=LAB_DEFAULTS["FGPU_SWARM_LAB_POOL"])
    parser.add_argument(
        "--keep-lab", action="store_true", help="leave a lab this run made up at the end"
    )


def lab_settings(args) -> dict[str, str]:
    return {
        "FGPU_SWARM_LAB_NAME": args.lab_name,
        "FGPU_SWARM_LAB_NET": args.lab_net,
        "FGPU_SWARM_LAB_POOL": args.lab_pool,
        "FGPU_PYTHON": sys.executable,
    }


# -- spawn time ------------------------------------------------------------------------------------


def warm_nodes(hub, nodes: int) -> None:
    """One GPU session per node (each node has one GPU, so they land on different nodes): every
    node pulls the session image from the lab's registry before anything is timed."""
    users = [f"warm{n}" for n in range(nodes)]
    for user in users:
        response = hub.start_server(user, {**FGPU_OPTIONS, "fgpu": 1})
        assert response.status_code in (201, 202), response.text
    for user in users:
        hub.wait_ready(user, timeout=600)
    for user in users:
        hub.stop_server(user)


def spawn_times(local_hub, swarm_hub, rounds: int) -> tuple[list[float], list[float]]:
    time_one_spawn(local_hub, "warmup", FGPU_OPTIONS)
    warm_nodes(swarm_hub, NODES)
    local, swarm = [], []
    for round_ in range(rounds):
        local.append(time_one_spawn(local_hub, f"bench{round_}", FGPU_OPTIONS))
        swarm.append(time_one_spawn(swarm_hub, f"bench{round_}", FGPU_OPTIONS))
    return local, swarm


# -- the storm -------------------------------------------------------------------------------------


def storm_options(index: int) -> dict:
    mem = "512M" if index % 2 else "256M"
    fgpu = 1 if index % GPU_EVERY == 0 else 0
    return {"image": "python-3.11", "cpu": 0.5, "mem": mem, "fgpu": fgpu}


def shape(session: dict) -> tuple:
    return (session["cpu"], session["fgpu"])


@dataclass
class Reply:
    user: str
    status: int
    seconds: float
    text: str


async def _send_all(hub, method: str, calls: list[tuple[str, dict | None]], stagger: float):
    """Send every call at once (or `stagger` s apart, in list order); one Reply each."""
    headers = {"Authorization": hub.api.headers["Authorization"]}
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as http:

        async def one(index: int, user: str, body: dict | None) -> Reply:
            await asyncio.sleep(index * stagger)
            start = time.perf_counter()
            url = f"{hub.url}/hub/api/users/{user}/servers/"
            async with http.request(method, url, json=body) as response:
                text = await response.text()
            return Reply(user, response.status, time.perf_counter() - start, text[:300])

        return await asyncio.gather(*(one(i, u, b) for i, (u, b) in enumerate(calls)))


def send_all(hub, method: str, calls, stagger: float = 0.0) -> list[Reply]:
    return asyncio.run(_send_all(hub, method, calls, stagger))


class Background(threading.Thread):
    """`send_all` in a thread, so the caller can watch the queue meanwhile."""

    def __init__(self, *args):
        super().__init__(daemon=True)
        self.args, self.replies = args, None

    def run(self):
        self.replies = send_all(*self.args)


def storm_sessions(admin: QueueUser, users: set[str]) -> list[dict]:
    """The storm's active records, oldest request first (the service's own order)."""
    return [s for s in admin.sessions() if s["user"] in users]


def settled(admin: QueueUser, users: set[str]) -> list[dict] | None:
    sessions = storm_sessions(admin, users)
    if {s["user"] for s in sessions} != users:
        return None
    if all(s["status"] in ("RUNNING", "PENDING") for s in sessions):
        return sessions
    return None


def fifo_problems(sessions: list[dict], submitted: list[str]) -> tuple[list[str], int]:
    """What breaks first-come-first-served among `sessions` (listed in arrival order), and how
    many pairs of waiting requests hold positions against the order they were posted in."""
    problems = []
    waiting = [s for s in sessions if s["status"] == "PENDING"]
    positions = [s["position"] for s in waiting]
    if positions != list(range(1, len(waiting) + 1)):
        problems.append(f"waiting positions in arrival order are {positions}")
    created = [s["created"] for s in sessions]
    if created != sorted(created):
        problems.append("the service lists records out of their arrival order")
    for kind in {shape(s) for s in sessions}:
        same = [s for s in sessions if shape(s) == kind]
        first_waiting = next((i for i, s in enumerate(same) if s["status"] == "PENDING"), None)
        if first_waiting is not None:
            overtaking = [s["user"] for s in same[first_waiting:] if s["status"] != "PENDING"]
            if overtaking:
                problems.append(f"{overtaking} (shape {kind}) overtook an earlier waiting request")
    order = {user: n for n, user in enumerate(submitted)}
    by_position = [order[s["user"]] for s in sorted(waiting, key=lambda s: s["position"])]
    inversions = sum(a > b for i, a in enumerate(by_position) for b in by_position[i + 1 :])
    return problems, inversions


def grant_problems(sessions: list[dict], manager, run_id: str) -> list[str]:
    """A slice granted twice, in the records or on the Swarm."""
    problems = []
    granted = [s for s in sessions if s["status"] in ("SCHEDULED", "RUNNING")]
    node_cpu = {
        n.attrs["Description"]["Hostname"]: n.attrs["Description"]["Resources"]["NanoCPUs"] / 1e9
        for n in manager.nodes.list()
    }
    used = defaultdict(float)
    gpus = Counter()
    for session in granted:
        used[session["grant"]["node"]] += session["cpu"]
        gpus.update(session["grant"]["gpus"].keys())
    problems += [f"{node} holds {cpu} CPU" for node, cpu in used.items() if cpu > node_cpu[node]]
    problems += [f"GPU {uuid} granted {n} times" for uuid, n in gpus.items() if n > 1]
    services = manager.services.list(filters={"label": f"{TEST_LABEL}={run_id}"})
    placed = Counter()
    for service in services:
        labels = service.attrs["Spec"]["Labels"]
        placed[labels.get("fgpu.session_id")] += 1
        constraints = service.attrs["Spec"]["TaskTemplate"]["Placement"]["Constraints"]
        record = next((s for s in granted if s["id"] == labels.get("fgpu.session_id")), None)
        if record is None:
            problems.append(f"service {service.name} has no granted record")
        elif constraints != [f"node.hostname=={record['grant']['node']}"]:
            problems.append(f"service {service.name} is not pinned to its grant: {constraints}")
    problems += [f"session {sid} has {n} services" for sid, n in placed.items() if n > 1]
    if len(services) != len(granted):
        problems.append(f"{len(services)} services for {len(granted)} grants")
    return problems


def ready_users(hub) -> set[str]:
    response = hub.request("GET", "users", params={"state": "ready", "limit": 1000})
    assert response.status_code == 200, response.text
    return {user["name"] for user in response.json() if user["servers"].get("", {}).get("ready")}


def record_counts(hub) -> Counter:
    """Every record of the service, by status, read from its database."""
    path = Path(hub.workdir) / "fgpu_queue.sqlite"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return Counter(dict(db.execute("SELECT status, count(*) FROM sessions GROUP BY status")))


def node_session_containers(lab_env: dict[str, str]) -> int:
    """Session containers still on any worker, read through each node's own engine."""
    count = 0
    for line in swarm_lab("status", lab_env=lab_env).stdout.splitlines():
        hostname, url, *_ = line.split()
        engine = engine_client({**lab_env, "DOCKER_HOST": url})
        # The low-level list: the high-level one inspects each container, and a container
        # removed in between would fail the count.
        count += len(engine.api.containers(all=True, filters={"label": "fgpu.session_id"}))
    return count


def leftovers(hub, admin, lab_env, manager, users: set[str]) -> list[str]:
    """What is left of the storm: servers, records, services, node containers, unended records."""
    servers = {user for user, _ in hub.active_servers()} & users
    records = storm_sessions(admin, users)
    services = manager.services.list(filters={"label": f"{TEST_LABEL}={hub.run_id}"})
    containers = node_session_containers(lab_env)
    unended = set(record_counts(hub)) - FINAL
    return (
        [f"the hub lists {len(servers)} servers: {sorted(servers)}"] * bool(servers)
        + [f"{len(records)} active records"] * bool(records)
        + [f"{len(services)} session services on the manager"] * bool(services)
        + [f"{containers} session containers on the nodes"] * bool(containers)
        + [f"records in {sorted(unended)}"] * bool(unended)
    )


def wait_until_nothing_left(hub, admin, lab_env, manager, users, timeout: float = 300):
    """[] once nothing is left, else what still is after `timeout`."""
    deadline = time.monotonic() + timeout
    while left := leftovers(hub, admin, lab_env, manager, users):
        if time.monotonic() > deadline:
            return [f"left after {timeout:g} s: {what}" for what in left]
        time.sleep(0.5)
    return []


def hub_log_errors(text: str) -> tuple[list[str], int]:
    """Error lines of the hub's log, less JupyterHub's own about a route that a stopped waiting
    server never had (their number is returned beside)."""
    lines = HUB_ERROR_LINE.findall(text)

    def handled(line: str) -> bool:
        route = PROXY_404.search(line)
        return bool(route) and f"Route {route[1]}/ already deleted" in text

    errors = [line for line in lines if not handled(line)]
    return errors, len(lines) - len(errors)


def spread(sessions: list[dict]) -> dict[str, str]:
    """Per node: granted sessions (of which GPU ones)."""
    granted = [s for s in sessions if s["status"] == "RUNNING"]
    nodes = sorted({s["grant"]["node"] for s in granted})
    return {
        node: f"{sum(s['grant']['node'] == node for s in granted)} "
        f"({sum(s['grant']['node'] == node and s['fgpu'] > 0 for s in granted)} GPU)"
        for node in nodes
    }


def storm(hub, lab_env: dict[str, str], count: int, stagger: float, together: bool) -> dict:
    users = [f"storm{n:02d}" for n in range(count)]
    everyone = set(users)
    for user in users:
        hub.create_user(user)
    admin = QueueUser(hub, "admin")
    manager = engine_client(lab_env)
    log_start = len(hub.log_text())
    figures = {"count": count, "stagger": stagger, "together": together, "load": [uptime()]}

    start = time.perf_counter()
    posting = Background(hub, "POST", [(u, storm_options(n)) for n, u in enumerate(users)], stagger)
    posting.start()
    sessions = wait_for(lambda: settled(admin, everyone), 900, "every request RUNNING or PENDING")
    figures["settled"] = time.perf_counter() - start
    running = {s["user"] for s in sessions if s["status"] == "RUNNING"}
    problems, figures["inversions"] = fifo_problems(sessions, users)
    problems += grant_problems(sessions, manager, hub.run_id)
    wait_for(lambda: running <= ready_users(hub), 600, "every granted server ready")
    figures["ready"] = time.perf_counter() - start
    posting.join(900)
    figures["load"].append(uptime())
    sessions = storm_sessions(admin, everyone)
    problems += grant_problems(sessions, manager, hub.run_id)
    figures.update(running=len(running), pending=count - len(running), spread=spread(sessions))

    # Waiting ones first, so that no stop of a running one hands its slice to a waiting one;
    # or all at once, so that slices are handed on while the servers that get them are stopped.
    waiting = [] if together else [s["user"] for s in sessions if s["status"] == "PENDING"]
    stop_start = time.perf_counter()
    stops = send_all(hub, "DELETE", [(u, None) for u in waiting])
    stops += send_all(hub, "DELETE", [(u, None) for u in users if u not in waiting])
    left = wait_until_nothing_left(hub, admin, lab_env, manager, everyone)
    figures.update(stopped=time.perf_counter() - stop_start, left=left)

    records = record_counts(hub)
    log_errors, figures["never_routed"] = hub_log_errors(hub.log_text()[log_start:])
    figures.update(
        posts=Counter(r.status for r in posting.replies),
        post_max=max(r.seconds for r in posting.replies),
        stops=Counter(r.status for r in stops),
        records=records,
        errors=(
            [f"POST {r.user}: {r.status} {r.text}" for r in posting.replies if r.status >= 300]
            + [f"DELETE {r.user}: {r.status} {r.text}" for r in stops if r.status >= 300]
            + [f"{records['ERROR']} records ended in ERROR"] * bool(records["ERROR"])
            + [f"hub log: {line[:200]}" for line in log_errors]
            + problems
            + left
        ),
    )
    return figures


def print_storm(figures: dict, single: float) -> None:
    print(
        f"\nstorm: {figures['count']} sessions posted at once over {NODES} nodes "
        f"({figures['running']} run, {figures['pending']} wait)   [{figures['load'][0]}]"
    )
    print(f"  every request RUNNING or PENDING after {figures['settled']:6.2f} s")
    print(f"  every granted server ready after       {figures['ready']:6.2f} s")
    order = "all at once" if figures["together"] else "waiting ones first"
    outcome = "something left" if figures["left"] else "nothing left"
    print(f"  all stopped ({order}), {outcome} after {figures['stopped']:6.2f} s")
    print(f"  ratio (all RUNNING or PENDING / one Swarm spawn): {figures['settled'] / single:.2f}")
    print(f"  ratio (all granted ready / one Swarm spawn): {figures['ready'] / single:.2f}")
    print(f"  granted per node: {figures['spread']}")
    print(f"  POSTs {dict(figures['posts'])}, slowest answered in {figures['post_max']:.2f} s")
    print(f"  DELETEs {dict(figures['stops'])}; records {dict(figures['records'])}")
    if figures["stagger"]:
        print(
            f"  posted {figures['stagger']:g} s apart: {figures['inversions']} pairs of waiting "
            "requests hold positions against the posting order"
        )
    print(
        f"  hub log: {figures['never_routed']} proxy 404s on stopping a waiting server "
        "(JupyterHub's own, handled: 'Route ... already deleted')"
    )
    print(f"  after: [{figures['load'][1]}]")
    print(f"  errors: {len(figures['errors'])}")
    for error in figures["errors"]:
        print(f"    {error}")


# -- the run ---------------------------------------------------------------------------------------


def lab(settings: dict[str, str], keep: bool):
    """The lab's exports, and what to do at the end: `down` a lab this run brought up, unless
    kept; a lab that was up already is reused and left up."""
    was_up = bool(swarm_lab("status", lab_env=settings).stdout.strip())
    up = swarm_lab("up", "--nodes", str(NODES), "--gpus", GPUS, lab_env=settings)
    exports = parse_exports(up.stdout)
    if keep or was_up:
        return exports, lambda: None
    return exports, lambda: swarm_lab("down", lab_env=settings)


def remove_services(lab_env: dict[str, str], run_id: str) -> None:
    for service in engine_client(lab_env).services.list(
        filters={"label": f"{TEST_LABEL}={run_id}"}
    ):
        service.remove()


def print_spawn_times(local: list[float], swarm: list[float], load: str) -> None:
    print(f"spawn → ready on {IMAGE}, cpu=1, mem=1G   [{load}]")
    print(summary("single host", local))
    print(summary("Swarm", swarm))
    ratio = statistics.median(swarm) / statistics.median(local)
    print(f"ratio (Swarm / single host, medians): {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="spawns per hub")
    parser.add_argument("--storm", type=int, default=60, help="sessions in the storm (0: none)")
    parser.add_argument(
        "--stagger", type=float, default=0.0, help="seconds between the storm's POSTs"
    )
    add_lab_arguments(parser)
    parser.add_argument(
        "--stop-together",
        action="store_true",
        help="stop the storm's servers all at once, waiting and running alike",
    )
    parser.add_argument("--workdir", help="the hubs' state and logs (default: a temporary one)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1: the storm's ratio needs a spawn time")
    settings = lab_settings(args)
    exports, take_down = lab(settings, args.keep_lab)
    lab_env = {**settings, **exports}
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            running_hub(Path(args.workdir or tmp) / "local") as local_hub,
            running_hub(Path(args.workdir or tmp) / "swarm", env=exports) as swarm_hub,
        ):
            try:
                local, swarm = spawn_times(local_hub, swarm_hub, args.rounds)
                print_spawn_times(local, swarm, uptime())
                if args.storm:
                    result = storm(swarm_hub, lab_env, args.storm, args.stagger, args.stop_together)
                    print_storm(result, statistics.median(swarm))
            finally:
                remove_services(lab_env, swarm_hub.run_id)
    finally:
        take_down()


if __name__ == "__main__":
    main()
