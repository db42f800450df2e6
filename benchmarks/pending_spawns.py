"""Many spawns waiting at once: N PENDING spawns held by one hub and its queue service.

A real hub (the shipped config, SQLite, one simulated GPU of 8 GiB, units_per_gpu 1) whose only GPU
is held by one running session, so that every further request of 1 fGPU waits in the queue. N/2
students, created in one bulk call, each start 2 named servers through the hub's REST API (the
shipped quota lets a student have 2 waiting), `--arrivals` starts a second, each on its own
connection as a browser's (20 by default: 2,000 in 100 s; 0: all at the same instant); no
container starts. The hub's spawn slots are
sized by the shipped config itself, from `FGPU_CLASS_SIZE` = N/2.

Measured: the time until all N are PENDING in the queue (an admin's `GET sessions`), the RSS and
CPU seconds of the hub, its queue service and its proxy (from /proc) when idle and with N waiting,
the CPU each uses per minute while it only holds them, and the hub's own `GET /hub/api/user` p50/p99
(open loop, from each request's due time) while the N are being issued and while they are held.
Then the GPU is released (the first in line must start) and every spawn is cancelled: nothing may
be left, no active record, no server, no container.

Baseline, in the same run: the same figures with 0 waiting, before the spawns are issued, and for
the release, the time the first session (the one holding the GPU) took from its start to ready. The
machine's load average is printed with every figure: on shared cores it moves them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import secrets
import tempfile
import time
from pathlib import Path

import aiohttp
import requests

from benchmarks.p4_api_latency import percentile, poll
from tests.harness import TEST_LABEL, QueueUser, containers_with, running_hub, wait_until

SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "256M", "fgpu": 1}
SERVERS_PER_STUDENT = 2  # the shipped pending quota
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def load() -> str:
    return "load " + " ".join(f"{value:.2f}" for value in os.getloadavg())


# -- processes -----------------------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def hub_processes(hub) -> dict[str, int]:
    """Pids of the hub, its queue service and its proxy (the service and proxy are its children)."""
    pids = {"hub": hub.process.pid}
    for child in children_of(hub.process.pid):
        line = cmdline(child)
        if "queue_service" in line:
            pids["service"] = child
        elif "configurable-http-proxy" in line:
            pids["proxy"] = child
    assert "service" in pids, "no queue service among the hub's children"
    return pids


def usage(pid: int) -> dict:
    """RSS (MiB), CPU seconds (user + system) and open file descriptors of one process."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return {"rss": rss_kib / 1024, "cpu": cpu, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def sample(pids: dict[str, int]) -> dict[str, dict]:
    return {name: usage(pid) for name, pid in pids.items()}


def cpu_per_minute(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """CPU seconds each process uses per minute of wall time, over `seconds` of doing nothing."""
    before, start = sample(pids), time.monotonic()
    time.sleep(seconds)
    after, elapsed = sample(pids), time.monotonic() - start
    return {name: (after[name]["cpu"] - before[name]["cpu"]) * 60 / elapsed for name in pids}


def print_usage(label: str, figures: dict[str, dict], idle: dict[str, dict] | None = None) -> None:
    for name, figure in figures.items():
        line = (
            f"  {label:<22} {name:<8} RSS {figure['rss']:7.1f} MiB   CPU {figure['cpu']:7.1f} s"
            f"   fds {figure['fds']:5d}"
        )
        if idle is not None:
            line += (
                f"   (+{figure['rss'] - idle[name]['rss']:.1f} MiB,"
                f" +{figure['cpu'] - idle[name]['cpu']:.1f} s CPU since idle)"
            )
        print(line, flush=True)


# -- the hub's own API ---------------------------------------------------------------------------


async def latency_while(url: str, token: str, rate: float, busy: asyncio.Future) -> dict:
    """p4's open-loop poll, in 5 s rounds until `busy` is done; every round's latencies together."""
    latencies, errors = [], {}
    while not busy.done():
        result = await poll(url, token, rate, 5)
        latencies += result["latencies"]
        for key, count in result["errors"].items():
            errors[key] = errors.get(key, 0) + count
    return {"latencies": latencies, "errors": errors}


def print_latency(label: str, result: dict, base: dict | None = None) -> None:
    lat = result["latencies"]
    p50, p99 = percentile(lat, 0.5), percentile(lat, 0.99)
    line = (
        f"  hub GET /hub/api/user, {label:<14} p50 {p50:7.1f} ms  p99 {p99:7.1f} ms"
        f"  max {max(lat):7.1f} ms  ({len(lat)} answered"
    )
    line += f", errors {result['errors']})" if result["errors"] else ")"
    if base is not None:
        line += (
            f"  ×{p50 / percentile(base['latencies'], 0.5):.2f} p50,"
            f" ×{p99 / percentile(base['latencies'], 0.99):.2f} p99 of idle"
        )
    print(line + f"  [{load()}]", flush=True)


# -- the crowd -----------------------------------------------------------------------------------


def crowd(count: int) -> list[tuple[str, str]]:
    students = (count + SERVERS_PER_STUDENT - 1) // SERVERS_PER_STUDENT
    names = [f"crowd-{n:05d}" for n in range(students)]
    return [(name, f"s{k}") for name in names for k in range(SERVERS_PER_STUDENT)][:count]


def create_users(hub, names: list[str], batch: int = 500) -> None:
    for start in range(0, len(names), batch):
        response = hub.request("POST", "users", json={"usernames": names[start : start + batch]})
        assert response.status_code == 201, response.text


async def each(
    hub, method: str, servers, concurrency: int, body: dict | None = None, arrivals: float = 0
) -> dict:
    """`method` on every (user, server) through the hub's REST API, `concurrency` at a time, the
    i-th no sooner than i / `arrivals` s from the start (0: all at once): answer counts by
    status, and answer times in s."""
    statuses: dict = {}
    times: list[float] = []
    concurrency = concurrency or len(servers)  # 0: all at once
    gate = asyncio.Semaphore(concurrency)
    # A token the hub made (an admin's), as students' own are: the harness's token comes from the
    # config, and JupyterHub hashes those 16,384 times at each request (a tenth of its CPU here).
    headers = {"Authorization": f"token {hub.user_token('admin')}"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout) as http:

        async def one(index: int, user: str, server: str) -> None:
            if arrivals:
                await asyncio.sleep(index / arrivals)
            async with gate:
                start = time.perf_counter()
                url = f"{hub.url}/hub/api/users/{user}/servers/{server}"
                try:
                    async with http.request(method, url, json=body) as response:
                        await response.read()
                        key = response.status
                except aiohttp.ClientError as e:
                    key = type(e).__name__
                statuses[key] = statuses.get(key, 0) + 1
                times.append(time.perf_counter() - start)

        await asyncio.gather(*(one(i, user, server) for i, (user, server) in enumerate(servers)))
    return {"statuses": statuses, "times": times}


def count_pending(admin: QueueUser, crowd_users: set[str]) -> int:
    """How many of the crowd's requests wait; 0 while the service cannot answer (its check of
    the admin's token waits on a busy hub, and the proxy may drop the connection)."""
    try:
        response = admin.call("GET", "sessions")
    except requests.ConnectionError:  # the proxy gave up on a service that waits on the hub
        return 0
    if response.status_code != 200:
        return 0
    sessions = response.json()["sessions"]
    return sum(s["status"] == "PENDING" and s["user"] in crowd_users for s in sessions)


async def wait_all_pending(admin, users: set[str], count: int, spawning) -> dict:
    """Once `count` of `users`' requests wait PENDING, or every answer is in and the count has
    stayed the same for 30 s (some spawns failed): how many wait, and since when (s)."""
    loop, start = asyncio.get_running_loop(), time.perf_counter()
    reached, since = -1, 0.0
    while True:
        pending = await loop.run_in_executor(None, count_pending, admin, users)
        if pending != reached:
            reached, since = pending, time.perf_counter() - start
        if pending >= count or (spawning.done() and time.perf_counter() - start - since > 30):
            return {"pending": reached, "after": since}
        await asyncio.sleep(0.5)


async def issue(hub, servers, args, admin, token: str) -> dict:
    """Start every server, measuring the hub's API meanwhile; time until all wait PENDING."""
    start, rate = time.perf_counter(), args.rate
    spawning = asyncio.ensure_future(
        each(hub, "POST", servers, args.concurrency, SESSION, args.arrivals)
    )
    users = {user for user, _ in servers}
    waiting = asyncio.ensure_future(wait_all_pending(admin, users, len(servers), spawning))
    latency = asyncio.ensure_future(latency_while(f"{hub.url}/hub/api/user", token, rate, waiting))
    reached = await waiting
    answers = await spawning
    return {
        **reached,
        "answers": answers,
        "answered_in": time.perf_counter() - start,
        "latency": await latency,
    }


def no_sessions(admin: QueueUser) -> bool:
    response = admin.call("GET", "sessions")
    return response.status_code == 200 and response.json()["sessions"] == []


def failed_spawns(hub) -> dict[str, int]:
    """The hub's reasons for spawns of the crowd it did not start, counted."""
    reasons: dict[str, int] = {}
    for line in hub.log_text().splitlines():
        if "Not starting crowd-" in line:
            reason = line.split(": ", 1)[-1][:120]
            reasons[reason] = reasons.get(reason, 0) + 1
    return reasons


def hub_active_count(hub) -> int:
    count, offset = 0, 0
    while True:
        response = hub.request(
            "GET", "users", params={"state": "active", "limit": 200, "offset": offset}
        )
        assert response.status_code == 200, response.text
        page = response.json()
        count += sum(len(user["servers"]) for user in page)
        if len(page) < 200:
            return count
        offset += 200


# -- the run -------------------------------------------------------------------------------------


def run(args) -> None:
    students = (args.count + SERVERS_PER_STUDENT - 1) // SERVERS_PER_STUDENT
    env = {
        "FGPU_SIMULATED_GPUS": "1x8GiB",
        "FGPU_UNITS_PER_GPU": "1",
        "FGPU_CLASS_SIZE": str(students),
    }
    workdir = Path(tempfile.mkdtemp(prefix="pending-")) / f"hub-{secrets.token_hex(3)}"
    # Where the hub's event loop is, every few seconds, for finding what stalls it.
    stacks = (
        "import faulthandler\n"
        f"faulthandler.dump_traceback_later({args.stacks}, repeat=True,"
        " file=open('stacks.txt', 'w'))\n"
        if args.stacks
        else ""
    )
    with running_hub(workdir, env=env, extra_config=stacks) as hub:
        pids = hub_processes(hub)
        admin = QueueUser(hub, "admin")
        holder = QueueUser(hub, "gpu-holder")
        token = holder.http.headers["Authorization"].split()[1]
        # Baseline of the release's figure: a session alone, nothing waiting, from its start.
        start = time.perf_counter()
        response = hub.start_server("gpu-holder", SESSION, server="gpu")
        assert response.status_code in (201, 202), response.text
        hub.wait_ready("gpu-holder", "gpu", timeout=180)
        alone = time.perf_counter() - start
        servers = crowd(args.count)
        create_users(hub, sorted({user for user, _ in servers}))
        print(f"pending spawns: {args.count} ({students} students × {SERVERS_PER_STUDENT})")
        print(f"  [{load()}] at start, `uptime`: {os.popen('uptime').read().strip()}")

        # Baseline: nothing waiting.
        asyncio.run(poll(f"{hub.url}/hub/api/user", token, 20, 1))  # warm up
        idle = sample(pids)
        print_usage("idle", idle)
        idle_rate = cpu_per_minute(pids, args.hold)
        print(
            "  idle CPU per minute:  "
            + ", ".join(f"{n} {s:.2f} s" for n, s in idle_rate.items())
            + f"  [{load()}]"
        )
        base = asyncio.run(poll(f"{hub.url}/hub/api/user", token, args.rate, args.seconds))
        print_latency("0 waiting", base)

        # The crowd.
        issued = asyncio.run(issue(hub, servers, args, admin, token))
        answers = issued["answers"]
        print(
            f"  {issued['pending']} of {args.count} PENDING after {issued['after']:.1f} s"
            f"  [{load()}]"
        )
        print(
            f"  answers {answers['statuses']} in {issued['answered_in']:.1f} s"
            f" (each: p50 {percentile(answers['times'], 0.5):.1f} s,"
            f" max {max(answers['times']):.1f} s; {args.concurrency or 'all'} at a time,"
            f" {f'{args.arrivals:g} a second' if args.arrivals else 'all at once'})"
        )
        for reason, count in failed_spawns(hub).items():
            print(f"  FAILED {count}: {reason}")
        print_latency("while issued", issued["latency"], base)
        waiting = issued["pending"]

        held = sample(pids)
        print_usage(f"{waiting} waiting", held, idle)
        held_rate = cpu_per_minute(pids, args.hold)
        print(
            "  holding CPU per minute: "
            + ", ".join(
                f"{n} {s:.2f} s (×{s / max(idle_rate[n], 0.01):.1f} idle)"
                for n, s in held_rate.items()
            )
            + f"  [{load()}]"
        )
        holding = asyncio.run(poll(f"{hub.url}/hub/api/user", token, args.rate, args.seconds))
        print_latency(f"{waiting} waiting", holding, base)

        # Release the GPU: the first in line starts.
        (head,) = [s for s in admin.sessions() if s["position"] == 1]
        first = (head["user"], head["server_name"])
        start = time.perf_counter()
        hub.stop_server("gpu-holder", "gpu")
        wait_until(
            lambda: (hub.server_model(*first) or {}).get("ready"),
            180,
            f"{first}, first in line, ready after the GPU was released",
        )
        released = time.perf_counter() - start
        print(
            f"  GPU released → first in line {first} ready in {released:.1f} s"
            f" (a session alone, nothing waiting: {alone:.1f} s; ×{released / alone:.2f})"
        )

        # Cancel every spawn: nothing may be left.
        start = time.perf_counter()
        cancelled = asyncio.run(each(hub, "DELETE", servers, args.concurrency))
        print(f"  cancel answers {cancelled['statuses']}")
        # A stop that interrupts a spawn still starting may answer 500 (JupyterHub's race, as in
        # launch_latency.py): those still active are stopped again.
        for _ in range(3):
            left = sorted(hub.active_servers() - {("gpu-holder", "gpu")})
            if not left:
                break
            again = asyncio.run(each(hub, "DELETE", left, args.concurrency))
            print(f"  cancelled again {len(left)}: {again['statuses']}")
        wait_until(lambda: no_sessions(admin), 900, "no active record in the queue")
        print(
            f"  no active record in the queue {time.perf_counter() - start:.1f} s after the cancel"
        )
        left = containers_with({TEST_LABEL: hub.run_id})
        assert not left, f"containers left: {[c.name for c in left]}"
        # JupyterHub 6.1 may keep listing a server whose pending spawn a stop interrupted (the
        # 500 above): counted, not waited for.
        print(
            f"  no container left; servers the hub still lists as active: {hub_active_count(hub)}"
            f"  [{load()}]"
        )
        print_usage("after cancel", sample(pids), idle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000, help="spawns left PENDING")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=0,
        help="REST calls in flight; 0 (the default): every one at once, as a class whose browsers"
        " each hold their own request (the hub answers a start that waits after its"
        " slow_spawn_timeout, 10 s, so 50 at a time takes count/50 × 10 s by itself)",
    )
    parser.add_argument(
        "--arrivals",
        type=float,
        default=20,
        help="starts a second, each on its own connection (20: a class of 2,000 in 100 s);"
        " 0: every one at the same instant",
    )
    parser.add_argument("--rate", type=float, default=20, help="GET /hub/api/user per second")
    parser.add_argument("--seconds", type=float, default=15, help="of each latency measurement")
    parser.add_argument("--hold", type=float, default=60, help="s of CPU measurement, idle/held")
    parser.add_argument("--stacks", type=float, default=0, help="dump the hub's stacks every s")
    args = parser.parse_args()
    # Every request at once holds a connection each: the usual soft limit of 1,024 is too few.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * args.count + 1024
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    run(args)


if __name__ == "__main__":
    main()
