"""P4: latency of `GET sessions` and `GET resources` under 500 requests/s of polling (goal: p99 < 50 ms).

A real hub (the shipped config, simulated GPUs) with the real queue service behind its proxy, and
sessions present: one student holds 2 running sessions and 1 pending, others wait in line. An
open-loop client sends requests at a fixed rate whatever the answers do, and each latency is
counted from the moment its request was due, so a slow server cannot hide its queueing.

Baseline, in the same run at the same rate: the hub's own `GET /hub/api/user`, which also goes
through the proxy and checks a token. The ratio says what the service adds over the hub itself.
Everything, the client included, shares the machine's cores: the figures are a bound on the
service, not its figure alone.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import tempfile
import time
from pathlib import Path

import aiohttp
import requests

from tests.harness import running_hub

SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "256M", "fgpu": 1}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def poll(url: str, token: str, rate: float, seconds: float) -> dict:
    """Send GET `url` at `rate` per second for `seconds`; latencies in ms from each due time."""
    latencies: list[float] = []
    errors: dict[int | str, int] = {}
    headers = {"Authorization": f"token {token}"}
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as http:

        async def one(due: float) -> None:
            try:
                async with http.get(url) as response:
                    await response.read()
                    if response.status != 200:
                        errors[response.status] = errors.get(response.status, 0) + 1
                        return
            except aiohttp.ClientError as e:
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                return
            latencies.append((time.perf_counter() - due) * 1000)

        start = time.perf_counter()
        tasks = []
        for n in range(int(rate * seconds)):
            due = start + n / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(due)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    return {"latencies": latencies, "errors": errors, "rate": len(tasks) / elapsed}


def populate(hub) -> tuple[str, str]:
    """A student with 2 RUNNING and 1 PENDING session, two more users waiting; their tokens."""
    tokens = {}
    for name in ("p4-student", "p4-other-1", "p4-other-2"):
        hub.create_user(name)
        tokens[name] = hub.user_token(name)
    for name, token in tokens.items():
        url = f"{hub.url}/services/queue/api/sessions"
        response = requests.post(
            url,
            json={**SESSION, "count": 3 if name == "p4-student" else 2},
            headers={"Authorization": f"token {token}"},
            timeout=120,
        )
        assert response.status_code == 201, response.text
        if name == "p4-student":
            hub.wait_ready("p4-student", response.json()["servers"][0]["server_name"])
    return tokens["p4-student"], tokens["p4-other-1"]


def wait_for_two_running(hub, token: str) -> list[dict]:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        sessions = requests.get(
            f"{hub.url}/services/queue/api/sessions",
            headers={"Authorization": f"token {token}"},
            timeout=30,
        ).json()["sessions"]
        if sum(s["status"] == "RUNNING" for s in sessions) == 2:
            return sessions
        time.sleep(0.5)
    raise RuntimeError(f"two sessions did not start: {sessions}")


def report(name: str, result: dict, base: dict | None) -> float:
    lat = result["latencies"]
    p50, p99 = percentile(lat, 0.50), percentile(lat, 0.99)
    line = (
        f"  {name:<28} p50 {p50:6.1f} ms   p99 {p99:6.1f} ms   max {max(lat):6.1f} ms   "
        f"{result['rate']:5.0f} req/s sent, {len(lat)} answered"
    )
    if result["errors"]:
        line += f", errors {result['errors']}"
    if base is not None:
        base_lat = base["latencies"]
        line += (
            f"   ratio to baseline p50 {p50 / percentile(base_lat, 0.5):4.2f}, "
            f"p99 {p99 / percentile(base_lat, 0.99):4.2f}"
        )
    print(line, flush=True)
    return p99


async def measure(hub, student: str, rate: float, seconds: float) -> None:
    api = f"{hub.url}/services/queue/api"
    # Warm caches and connections alike for every target before anything is timed.
    for url in (f"{hub.url}/hub/api/user", f"{api}/sessions", f"{api}/resources"):
        await poll(url, student, 50, 1)
    print(f"P4: {rate:g} requests/s for {seconds:g} s each, open loop, through the hub's proxy")
    base = await poll(f"{hub.url}/hub/api/user", student, rate, seconds)
    report("baseline GET /hub/api/user", base, None)
    worst = 0.0
    for name, url in (("GET sessions", f"{api}/sessions"), ("GET resources", f"{api}/resources")):
        worst = max(worst, report(name, await poll(url, student, rate, seconds), base))
    both = await asyncio.gather(
        poll(f"{api}/sessions", student, rate / 2, seconds),
        poll(f"{api}/resources", student, rate / 2, seconds),
    )
    mixed = {
        "latencies": both[0]["latencies"] + both[1]["latencies"],
        "errors": {**both[0]["errors"], **both[1]["errors"]},
        "rate": both[0]["rate"] + both[1]["rate"],
    }
    worst = max(worst, report("sessions + resources, mixed", mixed, base))
    verdict = "met" if worst < 50 else "NOT met"
    print(f"goal p99 < 50 ms: {verdict} (worst p99 {worst:.1f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    env = {"FGPU_SIMULATED_GPUS": "1x8GiB", "FGPU_UNITS_PER_GPU": "2"}
    workdir = Path(tempfile.mkdtemp(prefix="p4-")) / f"hub-{secrets.token_hex(3)}"
    with running_hub(workdir, env=env) as hub:
        student, _ = populate(hub)
        sessions = wait_for_two_running(hub, student)
        print(f"sessions present: {len(sessions)} of the student's, 4 more pending from others")
        asyncio.run(measure(hub, student, args.rate, args.seconds))


if __name__ == "__main__":
    main()
