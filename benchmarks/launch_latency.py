"""Launch latency: how long `POST sessions` with `count` N takes to answer (goal: under 1 s at 20).

A real hub (the shipped config, simulated GPUs) with the real queue service behind its proxy. One
student launches N sessions of 0.5 CPU each; on 2 cores a few run and the rest wait in line, as in a
class at a deadline. The launch records every session (PENDING or SCHEDULED), waits for the first
server's spawn to claim its record, and answers; the other servers come up behind it.

Baseline, in the same run: the way the service launched before, one hub start after the other, each
awaited until the hub answers (it waits up to its slow-spawn timeout, 10 s, for each). Each round is
torn down (every server stopped) before the next.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import requests

from tests.harness import running_hub

SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "256M"}
# Room for the largest launch: the shipped per-user limits (3 running, 2 waiting) refuse 20 at once.
UNLIMITED = '{"sessions": null, "pending": null, "fgpu": null}'


def launch(hub, token: str, count: int) -> float:
    """Seconds until `POST sessions` answers."""
    start = time.perf_counter()
    response = requests.post(
        f"{hub.url}/services/queue/api/sessions",
        json={**SESSION, "count": count},
        headers={"Authorization": f"token {token}"},
        timeout=600,
    )
    elapsed = time.perf_counter() - start
    assert response.status_code == 201, response.text
    return elapsed


def sequential(hub, user: str, count: int, round_: int) -> float:
    """Seconds for `count` hub starts, one after another (the former launch)."""
    start = time.perf_counter()
    for n in range(count):
        response = hub.request("POST", f"users/{user}/servers/b{round_}-{n}", json=SESSION)
        assert response.status_code in (201, 202), response.text
    return time.perf_counter() - start


def tear_down(hub, attempts: int = 5) -> None:
    """Stop every server. A stop that interrupts a spawn still starting can answer 500 from the
    hub (JupyterHub's own race, not the launch's); it is tried again."""
    for _ in range(attempts):
        try:
            hub.stop_servers(hub.active_servers())
            return
        except AssertionError as e:
            print(f"  (tear-down: {e}; trying again)")
            time.sleep(1)
    hub.stop_servers(hub.active_servers())


def measure(hub, token: str, user: str, count: int, rounds: int, baseline: bool) -> dict:
    ours, theirs = [], []
    for round_ in range(rounds):
        ours.append(launch(hub, token, count))
        tear_down(hub)
        if baseline:
            theirs.append(sequential(hub, user, count, round_))
            tear_down(hub)
    return {"ours": ours, "baseline": theirs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-counts", default="1,5", help="counts also run the old way")
    args = parser.parse_args()
    baseline_counts = {int(n) for n in args.baseline_counts.split(",") if n}
    env = {"FGPU_SIMULATED_GPUS": "1x8GiB", "FGPU_UNITS_PER_GPU": "2", "FGPU_USER_QUOTA": UNLIMITED}
    with (
        tempfile.TemporaryDirectory() as workdir,
        running_hub(Path(workdir), env=env) as hub,
    ):
        user = "launch-bench"
        hub.create_user(user)
        token = hub.user_token(user)
        print(f"{'count':>5} {'POST sessions (s)':>22} {'one by one (s)':>18} {'ratio':>7}")
        for count in (1, 5, 20):
            result = measure(
                hub, token, user, count, args.rounds, baseline=count in baseline_counts
            )
            ours = statistics.median(result["ours"])
            line = f"{count:>5} {ours:>22.3f}"
            if result["baseline"]:
                theirs = statistics.median(result["baseline"])
                line += f" {theirs:>18.3f} {theirs / ours:>6.1f}x"
            print(line + f"   (median of {args.rounds}; max {max(result['ours']):.3f} s)")


if __name__ == "__main__":
    main()
