"""Swarm mode: a framework image's first session on a node that just joined, against a warm node.

The nodes pull the catalog's images in the background (queue_service/engine/image_prepull.py), so
that a student's first session on a new node does not wait for the image's pull. The benchmark
makes its own Swarm lab (`scripts/swarm-lab`, name `--lab-name`, default `fgpu-labp`, network
10.207), one worker first, and takes it down at the end (`--keep-lab` leaves it up), so that it can
add nodes without touching the tests' lab:

1. **Warm node.** A hub in Swarm mode from the shipped config; node 1 holds the image (pulled
   ahead), and `--rounds` sessions of `--image` (default `pytorch-2.13-cpu`, 1.5 GB) started there
   and stopped: `POST servers` → ready. This is the baseline.
2. **A node that just joined, with the pulls ahead.** A second worker joins
   (`swarm-lab up --nodes 2`); the hub deploys its agent (`node_agent_deploy_interval` 10 s here),
   whose reports get the pull orders; printed: join → the image present there (the API's
   `nodes` field). Node 1 paused, the first session on node 2: spawn → ready; its ratio to the warm
   median (goal ≤ 1.2×).
3. **Before** (`--no-before` skips it): a hub with `SwarmEngine.prepull_images = False`, a third
   worker joins, its agent reports, nodes 1 and 2 paused: the first session there, which pulls
   the image itself; its ratio to the same warm median.

The machine is shared and small: each figure is printed with `uptime`.

    .venv/bin/python -m benchmarks.prepull --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.spawn_time import summary
from tests.harness import TEST_LABEL, QueueUser, running_hub
from tests.swarm_lab import engine_client, parse_exports, swarm_lab, wait_for

LAB_DEFAULTS = {
    "FGPU_SWARM_LAB_NAME": "fgpu-labp",
    "FGPU_SWARM_LAB_NET": "10.207",
    "FGPU_SWARM_LAB_POOL": "10.219.0.0/16",
}
CONFIG = """
c.SwarmEngine.node_agent_deploy_interval = 10
c.SwarmEngine.prepull_names = ["python-3.11", {image!r}]
c.SwarmEngine.prepull_images = {prepull}
c.QueueService.engine_images_interval = 2
c.QueueService.reconcile_interval = 1
"""


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def lab_up(settings: dict[str, str], nodes: int) -> dict[str, str]:
    return parse_exports(swarm_lab("up", "--nodes", str(nodes), lab_env=settings).stdout)


def set_availability(lab_env: dict[str, str], hostname: str, availability: str) -> None:
    manager = engine_client(lab_env)
    node = next(n for n in manager.nodes.list() if n.attrs["Description"]["Hostname"] == hostname)
    node.update({**node.attrs["Spec"], "Availability": availability})


def only_node(lab_env: dict[str, str], admin: QueueUser, hostname: str) -> None:
    """Sessions go to `hostname` alone: every other worker paused (their sessions, none here,
    would go on), once the queue's inventory has left them out."""
    for name in lab_env["FGPU_SWARM_NODES"].split(","):
        set_availability(lab_env, name, "active" if name == hostname else "pause")
    wait_for(
        lambda: [n["name"] for n in admin.call("GET", "resources").json()["nodes"]] == [hostname],
        timeout=60,
        what=f"{hostname} the only node in the queue's inventory",
    )


def timed_spawn(hub, admin: QueueUser, user: str, options: dict, node: str) -> float:
    """`POST servers` → ready, on `node` (checked), then stopped."""
    start = time.perf_counter()
    response = hub.start_server(user, options)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(user, timeout=900)
    elapsed = time.perf_counter() - start
    (record,) = [s for s in admin.sessions() if s["user"] == user and s["status"] == "RUNNING"]
    assert record["grant"]["node"] == node, (record["grant"], node)
    hub.stop_server(user)
    return elapsed


def image_state(admin: QueueUser, image: str, node: str) -> str | None:
    images = admin.call("GET", "images?all=1").json()["images"]
    found = next(i for i in images if i["name"] == image)["nodes"] or {"nodes": []}
    return next((s["state"] for s in found["nodes"] if s["node"] == node), None)


def agent_reports(admin: QueueUser, node: str) -> bool:
    reply = admin.call("GET", "nodes")
    return any(n["node"] == node and not n["stale"] for n in reply.json()["nodes"])


def with_hub(workdir: Path, exports: dict, image: str, prepull: bool):
    config = CONFIG.format(image=image, prepull=prepull)
    return running_hub(workdir, config, env=exports)


def remove_services(lab_env: dict[str, str], run_id: str) -> None:
    manager = engine_client(lab_env)
    for service in manager.services.list(filters={"label": f"{TEST_LABEL}={run_id}"}):
        service.remove()
    for service in manager.services.list(filters={"name": "fgpu-node-agent"}):
        service.remove()


def warm_and_joined(args, settings, workdir: Path) -> tuple[list[float], float, float, str]:
    exports = lab_up(settings, 1)
    lab_env = {**settings, **exports}
    first = exports["FGPU_SWARM_NODES"].split(",")[0]
    options = {"image": args.image, "cpu": 0.5, "mem": "1G"}
    with with_hub(workdir / "prepull", exports, args.image, True) as hub:
        try:
            admin = QueueUser(hub, "admin")
            wait_for(
                lambda: image_state(admin, args.image, first) == "present",
                timeout=900,
                what=f"{args.image} pulled ahead on {first}",
                interval=1.0,
            )
            warm = [timed_spawn(hub, admin, f"warm{n}", options, first) for n in range(args.rounds)]
            print(summary("warm node", warm), f"   [{uptime()}]", flush=True)

            joined_at = time.perf_counter()
            lab_env = {**settings, **lab_up(settings, 2)}
            second = lab_env["FGPU_SWARM_NODES"].split(",")[1]
            wait_for(
                lambda: image_state(admin, args.image, second) == "present",
                timeout=900,
                what=f"{args.image} pulled ahead on {second}",
                interval=1.0,
            )
            ready_after = time.perf_counter() - joined_at
            only_node(lab_env, admin, second)
            first_launch = timed_spawn(hub, admin, "joined", options, second)
        finally:
            remove_services(lab_env, hub.run_id)
    return warm, ready_after, first_launch, second


def before(args, settings, workdir: Path) -> tuple[float, str]:
    """The first session on a node that just joined, with nothing pulled ahead."""
    lab_env = {**settings, **lab_up(settings, 2)}
    options = {"image": args.image, "cpu": 0.5, "mem": "1G"}
    with with_hub(workdir / "before", lab_env, args.image, False) as hub:
        try:
            admin = QueueUser(hub, "admin")
            lab_env = {**settings, **lab_up(settings, 3)}
            third = lab_env["FGPU_SWARM_NODES"].split(",")[2]
            wait_for(lambda: agent_reports(admin, third), timeout=300, what=f"{third}'s agent")
            only_node(lab_env, admin, third)
            return timed_spawn(hub, admin, "before", options, third), third
        finally:
            remove_services(lab_env, hub.run_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="sessions on the warm node")
    parser.add_argument("--image", default="pytorch-2.13-cpu", help="a catalog image's name")
    parser.add_argument("--no-before", action="store_true", help="skip the run without pulls")
    parser.add_argument("--lab-name", default=LAB_DEFAULTS["FGPU_SWARM_LAB_NAME"])
    parser.add_argument("--lab-net", default=LAB_DEFAULTS["FGPU_SWARM_LAB_NET"])
    parser.add_argument("--lab-pool", default=LAB_DEFAULTS["FGPU_SWARM_LAB_POOL"])
    parser.add_argument("--keep-lab", action="store_true", help="leave the lab up at the end")
    args = parser.parse_args()
    settings = {
        "FGPU_SWARM_LAB_NAME": args.lab_name,
        "FGPU_SWARM_LAB_NET": args.lab_net,
        "FGPU_SWARM_LAB_POOL": args.lab_pool,
        "FGPU_PYTHON": sys.executable,
    }
    if swarm_lab("status", lab_env=settings).stdout.strip():
        parser.error(f"the lab {args.lab_name} is up: the benchmark needs a new one (down first)")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            warm, ready_after, first_launch, second = warm_and_joined(args, settings, Path(tmp))
            warm_median = statistics.median(warm)
            print(f"{second} joined → {args.image} present there: {ready_after:.1f} s")
            print(
                f"first session on {second}, pulled ahead: {first_launch:.2f} s, "
                f"ratio to the warm node {first_launch / warm_median:.2f} (goal ≤ 1.2)"
                f"   [{uptime()}]",
                flush=True,
            )
            if not args.no_before:
                cold, third = before(args, settings, Path(tmp))
                print(
                    f"before (nothing pulled ahead), first session on {third}: {cold:.2f} s, "
                    f"ratio to the warm node {cold / warm_median:.2f}   [{uptime()}]"
                )
    finally:
        if not args.keep_lab:
            swarm_lab("down", lab_env=settings)


if __name__ == "__main__":
    main()
