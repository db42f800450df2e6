"""Swarm mode, `overlay` with an overlay per session: spawn and stop time against `host_port`.

Two real hubs from the shipped config on one 3-node lab (`scripts/swarm-lab`, under a name and
network of its own; a lab that is up already is reused and left up): one with the default
`host_port` endpoint beside the Swarm, one with `FGPU_SWARM_ENDPOINT=overlay` and
`FGPU_SWARM_NETWORK_PER_SESSION=1`, whose process runs in the network of a container on the
manager (`tests/swarm_lab.py::hub_container`). What the second pays on top: making the session's
overlay, joining the hub's container to it, the task's attachment to it on its node; and at
stop, leaving it and removing it. Spawns alternate between the two hubs so both see the same
machine load. `--held N` then keeps N sessions running on the overlay hub and times one more
spawn and stop, as the hub's container is on N + 1 overlays.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.spawn_time import FGPU_OPTIONS, IMAGE, summary
from benchmarks.swarm_spawn import (
    NODES,
    add_lab_arguments,
    lab,
    lab_settings,
    remove_services,
    uptime,
    warm_nodes,
)
from tests.harness import TEST_LABEL, running_hub
from tests.swarm_lab import hub_container

OPTIONS = {**FGPU_OPTIONS, "cpu": 0.5, "mem": "256M"}


def spawn_and_stop(hub, user: str) -> tuple[float, float]:
    """Seconds from `POST servers` to ready, and from `DELETE` to the server gone."""
    start = time.perf_counter()
    response = hub.start_server(user, OPTIONS)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(user, timeout=300)
    ready = time.perf_counter()
    hub.stop_server(user, timeout=120)
    assert hub.server_model(user) is None, f"{user}'s server still there"
    return ready - start, time.perf_counter() - ready


def rounds(host_port_hub, overlay_hub, count: int) -> dict[str, list[tuple[float, float]]]:
    times = {"host_port": [], "overlay": []}
    for round_ in range(count):
        times["host_port"].append(spawn_and_stop(host_port_hub, f"bench{round_}"))
        times["overlay"].append(spawn_and_stop(overlay_hub, f"bench{round_}"))
    return times


def with_held(overlay_hub, held: int) -> tuple[float, float]:
    """One more spawn and stop while `held` sessions keep their overlays."""
    users = [f"held{n}" for n in range(held)]
    for user in users:
        response = overlay_hub.start_server(user, OPTIONS)
        assert response.status_code in (201, 202), response.text
    for user in users:
        overlay_hub.wait_ready(user, timeout=300)
    try:
        return spawn_and_stop(overlay_hub, "extra")
    finally:
        overlay_hub.stop_servers({(user, "") for user in users})


def print_times(times: dict[str, list[tuple[float, float]]]) -> None:
    print(f"spawn → ready, then stop, on {IMAGE}, cpu=0.5, mem=256M   [{uptime()}]")
    for name, pairs in times.items():
        print(summary(f"{name} spawn", [spawn for spawn, _ in pairs]))
        print(summary(f"{name} stop", [stop for _, stop in pairs]))
    for what, index in (("spawn", 0), ("stop", 1)):
        ratio = statistics.median(t[index] for t in times["overlay"]) / statistics.median(
            t[index] for t in times["host_port"]
        )
        print(f"ratio ({what}, overlay per session / host_port, medians): {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="spawns per hub")
    parser.add_argument("--held", type=int, default=0, help="sessions held for the last spawn")
    add_lab_arguments(parser)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    settings = lab_settings(args)
    exports, take_down = lab(settings, args.keep_lab)
    lab_env = {**settings, **exports}
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            hub_container(lab_env, labels={TEST_LABEL: "bench"}) as anchor,
            running_hub(Path(tmp) / "host-port", env=exports) as host_port_hub,
            running_hub(
                Path(tmp) / "overlay",
                env={**exports, **anchor.env()},
                launcher=anchor.launcher,
                url=anchor.url,
            ) as overlay_hub,
        ):
            try:
                warm_nodes(host_port_hub, NODES)  # every node pulls the image, untimed
                print_times(rounds(host_port_hub, overlay_hub, args.rounds))
                if args.held:
                    spawn, stop = with_held(overlay_hub, args.held)
                    print(f"with {args.held} held: overlay spawn {spawn:.2f} s, stop {stop:.2f} s")
            finally:
                remove_services(lab_env, host_port_hub.run_id)
                remove_services(lab_env, overlay_hub.run_id)
    finally:
        take_down()


if __name__ == "__main__":
    main()
