"""Spawn time: FGPUSpawner against a plain DockerSpawner on the same image, in the same run.

Two real hubs run side by side; spawns alternate between them so that both see the same machine
load. Time is measured from `POST /hub/api/users/{name}/servers/` to the hub marking the server
ready, as a student waiting on the spawn page would experience it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tests.harness import running_hub

IMAGE = "fgpu/jupyter-base:py3.11"
PLAIN_DOCKERSPAWNER = f"""
c.JupyterHub.spawner_class = "docker"
c.DockerSpawner.image = {IMAGE!r}
c.DockerSpawner.remove = True
c.DockerSpawner.use_internal_ip = True
c.DockerSpawner.cpu_limit = 1.0
c.DockerSpawner.mem_limit = "1G"
"""
FGPU_OPTIONS = {"image": "python-3.11", "cpu": 1, "mem": "1G"}


def time_one_spawn(hub, user: str, options: dict) -> float:
    start = time.perf_counter()
    response = hub.start_server(user, options)
    assert response.status_code in (201, 202), response.text
    hub.wait_ready(user)
    elapsed = time.perf_counter() - start
    hub.stop_server(user)
    return elapsed


def summary(name: str, times: list[float]) -> str:
    return (
        f"{name:<14} median {statistics.median(times):6.2f} s   mean {statistics.mean(times):6.2f} s"
        f"   min {min(times):6.2f} s   max {max(times):6.2f} s   (n={len(times)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="spawns per spawner")
    args = parser.parse_args()
    fgpu_times, plain_times = [], []
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_hub(Path(tmp) / "fgpu") as fgpu_hub,
        running_hub(Path(tmp) / "plain", extra_config=PLAIN_DOCKERSPAWNER) as plain_hub,
    ):
        # One untimed spawn each, so that neither pays for first-use caches in the timing.
        time_one_spawn(fgpu_hub, "warmup", FGPU_OPTIONS)
        time_one_spawn(plain_hub, "warmup", {})
        for round_ in range(args.rounds):
            fgpu_times.append(time_one_spawn(fgpu_hub, f"bench{round_}", FGPU_OPTIONS))
            plain_times.append(time_one_spawn(plain_hub, f"bench{round_}", {}))
    print(f"spawn → ready on {IMAGE}, cpu=1, mem=1G")
    print(summary("FGPUSpawner", fgpu_times))
    print(summary("DockerSpawner", plain_times))
    ratio = statistics.median(fgpu_times) / statistics.median(plain_times)
    print(f"ratio (FGPUSpawner / DockerSpawner, medians): {ratio:.2f}")


if __name__ == "__main__":
    main()
