"""Reclaim → grant: how soon an idle GPU session reclaimed for the queue gives its slice to the
request waiting for it.

A real hub (the shipped config, one simulated GPU of 1 fGPU) with the real queue service. The
holder's group has the GPU-aware idle policy `{"fgpu_timeout": "3s", "cpu_percent": 50, "reclaim":
"when_waiting"}`: its session, idle past 3 s, is kept while nobody waits. Each round a second
student asks for the GPU and waits; the service warns the holder, and at the planned end
(`ends.at`, `FGPU_END_WARNING` = 2 s later) stops its server through the hub. Figures, from the
service's own records (its DB) and the hub's server model:
  - planned end → the holder's record ended (the service's round, the hub's stop, the container's
    removal);
  - the holder's record ended → the waiter's grant (the release's scheduling pass);
  - planned end → grant, and grant → the waiter's server ready.

Baseline, in the same run and the same rounds' shape: the holder ends the session itself
(`DELETE sessions/{id}` through the queue API) while the other waits: the request → grant.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

from tests.harness import QueueUser, running_hub, wait_until

SESSION = {"image": "python-3.11", "cpu": 0.5, "mem": "512M", "fgpu": 1}
POLICY = {"fgpu_timeout": "3s", "cpu_percent": 50, "reclaim": "when_waiting"}
WARNING_LEAD = 2
EXTRA_CONFIG = """
c.Spawner.environment = {"JUPYTERHUB_ACTIVITY_INTERVAL": "0"}
c.QueueService.ends_interval = 0.5
"""


def holding(hub, holder: QueueUser) -> dict:
    response = hub.start_server(holder.name, SESSION)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(holder.name)
    (session,) = holder.wait_for(lambda s: [x["status"] for x in s] == ["RUNNING"])
    return session


def waiting_for_it(waiter: QueueUser) -> dict:
    """The waiter's request, launched through the queue API (which answers at once: a hub start
    would block for its slow-spawn timeout, longer than the reclaim takes)."""
    response = waiter.call("POST", "sessions", json={**SESSION, "count": 1})
    assert response.status_code == 201, response.text
    (pending,) = waiter.wait_for(lambda s: [x["status"] for x in s] == ["PENDING"])
    return pending


def granted(hub, holder_session: dict, pending: dict, waiter: QueueUser) -> dict[str, float]:
    """Wait for the waiter's server; its grant and ready times, and the holder's end."""
    wait_until(
        lambda: hub.stored_times(pending["id"])["scheduled_at"], 60, "the grant", interval=0.05
    )
    hub.wait_ready(waiter.name, pending["server_name"], timeout=120)
    ready = time.time()
    ended = hub.stored_times(holder_session["id"])["ended"]
    return {
        "ended": ended,
        "grant": hub.stored_times(pending["id"])["scheduled_at"],
        "ready": ready,
    }


def reclaim_round(hub, holder: QueueUser, waiter: QueueUser) -> dict[str, float]:
    session = holding(hub, holder)
    wait_until(lambda: (holder.sessions()[0]["ends"] or {}).get("kept_idle"), 30, "kept while idle")
    pending = waiting_for_it(waiter)
    ends = wait_until(
        lambda: (e := holder.sessions()[0]["ends"]) and e["why"] == "reclaimed" and e,
        30,
        "the reclaim announced",
    )
    planned = datetime.fromisoformat(ends["at"]).timestamp()
    times = granted(hub, session, pending, waiter)
    hub.stop_server(waiter.name, pending["server_name"])
    return {
        "planned → ended": times["ended"] - planned,
        "ended → grant": times["grant"] - times["ended"],
        "planned → grant": times["grant"] - planned,
        "grant → ready": times["ready"] - times["grant"],
    }


def owner_stop_round(hub, holder: QueueUser, waiter: QueueUser) -> dict[str, float]:
    session = holding(hub, holder)
    pending = waiting_for_it(waiter)
    asked = time.time()
    response = holder.call("DELETE", f"sessions/{session['id']}")
    assert response.status_code in (200, 202), response.text
    times = granted(hub, session, pending, waiter)
    hub.stop_server(waiter.name, pending["server_name"])
    return {
        "asked → ended": times["ended"] - asked,
        "ended → grant": times["grant"] - times["ended"],
        "asked → grant": times["grant"] - asked,
        "grant → ready": times["ready"] - times["grant"],
    }


def summary(rounds: list[dict[str, float]]) -> dict[str, tuple[float, float]]:
    return {
        key: (statistics.median(r[key] for r in rounds), max(r[key] for r in rounds))
        for key in rounds[0]
    }


def print_figures(title: str, figures: dict[str, tuple[float, float]]) -> None:
    print(title)
    for key, (median, worst) in figures.items():
        print(f"  {key:<18} median {median * 1000:8.1f} ms   max {worst * 1000:8.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    env = {
        "FGPU_SIMULATED_GPUS": "1x8GiB",
        "FGPU_UNITS_PER_GPU": "1",
        "FGPU_IDLE_TIMEOUT": "off",
        "FGPU_END_WARNING": str(WARNING_LEAD),
    }
    with (
        tempfile.TemporaryDirectory() as workdir,
        running_hub(Path(workdir), env=env, extra_config=EXTRA_CONFIG) as hub,
    ):
        suffix = secrets.token_hex(3)
        idle = QueueUser(hub, f"idle-holder-{suffix}")
        owner = QueueUser(hub, f"owner-{suffix}")
        waiter = QueueUser(hub, f"waiter-{suffix}")
        hub.join_group(idle.name, {"idle_policy": POLICY})
        reclaims, stops = [], []
        for n in range(args.rounds):
            reclaims.append(reclaim_round(hub, idle, waiter))
            stops.append(owner_stop_round(hub, owner, waiter))
            print(f"round {n + 1}: {reclaims[-1]} | baseline {stops[-1]}", flush=True)
    ours, theirs = summary(reclaims), summary(stops)
    print_figures(f"Reclaimed for the queue ({args.rounds} rounds):", ours)
    print_figures("Baseline, the holder stops it itself:", theirs)
    ratio = ours["planned → grant"][0] / theirs["asked → grant"][0]
    print(f"planned end → grant / owner's stop → grant (medians): {ratio:.2f}x")


if __name__ == "__main__":
    main()
