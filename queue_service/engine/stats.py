"""Live usage of running sessions: a bounded sampler of `docker stats`, and NVML per process.

Every `interval` seconds the sampler asks the engine once for the session containers and once per
running session for its stats (one-shot, so no call waits for a second engine sample). Pages and
`/metrics` read what the last round kept: a page poll never reaches the engine, so 200 open
sessions pages cost the engine nothing extra. With nothing running, no engine call is made.

CPU % is computed between two of our own samples (Docker's formula: the container's CPU time over
the host's, times the host's CPUs), so it is the average over the interval, not an instant.
Memory follows `docker stats`: usage less the inactive page cache.

On GPU hosts NVML's running compute processes (host PIDs) are joined to containers through
/proc/<pid>/cgroup; with no NVML (no GPU, or a simulated one), the GPU fields are None.

Everything above `StatsSampler` is pure, so the arithmetic is tested without an engine or a GPU.
"""

from __future__ import annotations

import asyncio
import importlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from queue_service.engine.container_calls import (
    ContainerCalls,
    ContainerUnresponsive,
    timed_out,
)
from queue_service.engine.session_containers import running_session_containers

#: How many stats calls may be in flight at once: the engine answers each in a few ms.
MAX_CONCURRENT_CALLS = 4

# A docker container id in a cgroup path: ".../docker/<id>" (cgroup v1, cgroupfs driver) or
# ".../docker-<id>.scope" (systemd driver).
_CGROUP_ID_RE = re.compile(r"docker[-/]([0-9a-f]{64})(?:\.scope)?")


@dataclass(frozen=True)
class Usage:
    """A session's usage in its last sample. GPU fields are None where NVML cannot see them."""

    cpu_percent: float | None
    mem_bytes: int
    mem_limit_bytes: int
    gpu_mem_bytes: int | None
    gpu_util_percent: float | None
    sampled_at: str


@dataclass(frozen=True)
class GpuUse:
    mem_bytes: int
    util_percent: float


# -- docker stats -------------------------------------------------------------------------------


def cpu_times(stats: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(container CPU ns, host CPU ns, online CPUs) of one one-shot stats answer, or None."""
    cpu = stats.get("cpu_stats") or {}
    total = (cpu.get("cpu_usage") or {}).get("total_usage")
    system = cpu.get("system_cpu_usage")
    if total is None or system is None:
        return None
    online = cpu.get("online_cpus") or len((cpu.get("cpu_usage") or {}).get("percpu_usage") or [1])
    return int(total), int(system), int(online)


def cpu_percent(previous: tuple[int, int, int] | None, current: tuple[int, int, int] | None):
    """Docker's CPU % between two samples: 100 % is one core busy, N × 100 % all N cores."""
    if previous is None or current is None:
        return None
    container_delta = current[0] - previous[0]
    system_delta = current[1] - previous[1]
    if system_delta <= 0 or container_delta < 0:
        return None
    return round(container_delta / system_delta * current[2] * 100.0, 2)


def memory(stats: Mapping[str, Any]) -> tuple[int, int]:
    """(used bytes, limit bytes) as `docker stats` shows them: usage less inactive page cache."""
    mem = stats.get("memory_stats") or {}
    usage = int(mem.get("usage") or 0)
    detail = mem.get("stats") or {}
    # cgroup v1 reports total_inactive_file, v2 inactive_file; older engines only cache.
    for key in ("total_inactive_file", "inactive_file", "cache"):
        if key in detail:
            usage -= int(detail[key])
            break
    return max(0, usage), int(mem.get("limit") or 0)


# -- NVML per process ---------------------------------------------------------------------------


def container_id_of_cgroup(text: str) -> str | None:
    """The docker container id in a /proc/<pid>/cgroup file's text, or None (not in a container)."""
    match = _CGROUP_ID_RE.search(text)
    return match.group(1) if match else None


def gpu_use_by_container(
    processes: Iterable[tuple[int, int]],
    utilisation: Iterable[tuple[int, float]],
    container_of_pid: Mapping[int, str],
) -> dict[str, GpuUse]:
    """Sum NVML's per-process figures by container: (pid, used bytes) and (pid, SM %), any GPU.

    A process on two GPUs counts on both; utilisation is capped at 100 % per container per GPU
    sampled, so a summed figure can exceed 100 only for a multi-GPU session.
    """
    mem: dict[str, int] = {}
    util: dict[str, float] = {}
    for pid, used in processes:
        container = container_of_pid.get(pid)
        if container:
            mem[container] = mem.get(container, 0) + int(used or 0)
    for pid, sm in utilisation:
        container = container_of_pid.get(pid)
        if container:
            util[container] = util.get(container, 0.0) + float(sm)
            mem.setdefault(container, 0)
    return {c: GpuUse(mem[c], round(util.get(c, 0.0), 2)) for c in mem}


def read_nvml_processes(nvml: Any = None) -> tuple[list, list] | None:
    """(processes, utilisation) from every GPU, as (pid, bytes) and (pid, SM %); None without NVML."""
    try:
        nvml = nvml if nvml is not None else importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception:  # no library, no driver, no GPU: no GPU figures, not an error
        return None
    processes, utilisation = [], []
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                processes.append((proc.pid, proc.usedGpuMemory or 0))
            try:
                samples = nvml.nvmlDeviceGetProcessUtilization(handle, 0)
            except nvml.NVMLError:  # no samples yet, or not supported on this GPU
                samples = []
            utilisation.extend(latest_per_pid((s.pid, s.timeStamp, s.smUtil) for s in samples))
    finally:
        nvml.nvmlShutdown()
    return processes, utilisation


def latest_per_pid(samples: Iterable[tuple[int, int, float]]) -> list[tuple[int, float]]:
    """NVML keeps a buffer of (pid, timestamp, SM %) samples; only each process's newest counts."""
    newest: dict[int, tuple[int, float]] = {}
    for pid, stamp, sm in samples:
        if pid not in newest or stamp > newest[pid][0]:
            newest[pid] = (stamp, sm)
    return [(pid, sm) for pid, (_, sm) in newest.items()]


def containers_of_pids(pids: Iterable[int], proc: Path = Path("/proc")) -> dict[int, str]:
    found = {}
    for pid in set(pids):
        try:
            container = container_id_of_cgroup((proc / str(pid) / "cgroup").read_text())
        except OSError:
            continue
        if container:
            found[pid] = container
    return found


# -- the sampler --------------------------------------------------------------------------------


class StatsSampler:
    """Keeps the last usage of every running session; `run()` refreshes it on a fixed interval.

    `running_ids` tells which session ids this service has RUNNING (a DB read); containers of
    other hubs sharing the engine are never sampled. Each stats call goes through `calls`
    (container_calls.py): a container that does not answer keeps its last usage unknown, and
    never holds up the round for the others.
    """

    def __init__(
        self,
        docker_client,
        running_ids: Callable[[], set[str]],
        interval: float = 5.0,
        read_gpus: bool = True,
        nvml: Any = None,
        log=None,
        calls: ContainerCalls | None = None,
    ):
        self.docker = docker_client
        self.calls = calls or ContainerCalls(log=log)
        self.running_ids = running_ids
        self.interval = interval
        # False on hosts with simulated GPUs: NVML has nothing to say there.
        self.read_gpus = read_gpus
        self.nvml = nvml
        self.log = log
        self.engine_calls = 0
        self._usage: dict[str, dict] = {}
        self._cpu: dict[str, tuple[int, int, int]] = {}

    def usage(self, session_id: str) -> dict | None:
        return self._usage.get(session_id)

    async def sample(self) -> None:
        """One round: list session containers, then one stats call for each running session."""
        wanted = self.running_ids()
        if not wanted:
            self._usage, self._cpu = {}, {}
            return
        loop = asyncio.get_running_loop()
        containers = await loop.run_in_executor(None, self._list)
        mine = {sid: c.id for sid, c in containers.items() if sid in wanted}
        limit = asyncio.Semaphore(MAX_CONCURRENT_CALLS)

        async def one(session_id: str, container_id: str):
            async with limit:
                try:
                    return await self.calls.call(
                        container_id, session_id, "stats", self._stats, container_id
                    )
                except ContainerUnresponsive:
                    return None

        answers = await asyncio.gather(*(one(sid, cid) for sid, cid in mine.items()))
        gpu = await loop.run_in_executor(None, self._gpu_use)
        now = datetime.now(UTC).isoformat()
        usage, cpu = {}, {}
        for (session_id, container_id), stats in zip(mine.items(), answers, strict=True):
            if stats is None:
                continue
            cpu[session_id] = cpu_times(stats)
            used, limit_bytes = memory(stats)
            on_gpu = gpu.get(container_id) if gpu is not None else None
            if gpu is not None and on_gpu is None:
                on_gpu = GpuUse(0, 0.0)  # NVML sees the GPUs, and this session uses none now
            usage[session_id] = asdict(
                Usage(
                    cpu_percent=cpu_percent(self._cpu.get(session_id), cpu[session_id]),
                    mem_bytes=used,
                    mem_limit_bytes=limit_bytes,
                    gpu_mem_bytes=on_gpu.mem_bytes if on_gpu else None,
                    gpu_util_percent=on_gpu.util_percent if on_gpu else None,
                    sampled_at=now,
                )
            )
        self._usage, self._cpu = usage, cpu

    def _list(self) -> dict:
        self.engine_calls += 1
        return running_session_containers(self.docker)

    def _stats(self, container_id: str) -> dict | None:
        self.engine_calls += 1
        try:
            return self.docker.api.stats(container_id, stream=False, one_shot=True)
        except Exception as e:  # it stopped between the list and now; the next round knows
            if timed_out(e):
                raise  # the engine is stuck on it: container_calls keeps it marked
            self._say("no stats for %s: %s", container_id[:12], e)
            return None

    def _gpu_use(self) -> dict[str, GpuUse] | None:
        found = read_nvml_processes(self.nvml) if self.read_gpus else None
        if found is None:
            self.read_gpus = False  # no NVML now means none later: stop asking
            return None
        processes, utilisation = found
        pids = [pid for pid, _ in processes] + [pid for pid, _ in utilisation]
        return gpu_use_by_container(processes, utilisation, containers_of_pids(pids))

    async def run(self) -> None:
        while True:
            try:
                await self.sample()
            except Exception as e:  # the engine may be restarting; the next round tries again
                self._say("sampling failed: %s", e)
            await asyncio.sleep(self.interval)

    def _say(self, message: str, *args) -> None:
        if self.log:
            self.log.warning("stats: " + message, *args)
