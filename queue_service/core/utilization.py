"""Cluster utilization arithmetic: one sample of the cluster from its nodes, records and live
usage, and the averages that thin many samples into fewer.

Pure (no I/O, no clock): the store (`utilization_store.py`) reads the inventory, the records and
the stats, passes them in with the moment, and keeps what comes out.

Per resource type (`cpu` in cores, `mem` in bytes, `fgpu` in fGPU units), a sample has:
- `capacity`: what the nodes offer sessions (after the reserve; GPUs × `units_per_gpu`);
- `allocated`: the slots of every session holding a grant (SCHEDULED or RUNNING);
- `used`: what the running sessions really use, from the live stats: CPU % / 100 in cores, memory
  as `docker stats` counts it, and GPU SM % / 100 × `units_per_gpu` in fGPU units. A figure no
  running session reports (GPU use where NVML sees nothing: simulated GPUs, Swarm nodes) is None,
  unknown rather than 0; with no session running, use is 0.

A sample stands for `seconds` of time (the sampling interval, or the span it averages), and
averages weigh samples by it, so a thinned series keeps the time-weighted mean of the original.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from math import ceil

RESOURCES = ("cpu", "mem", "fgpu")
SERIES = ("capacity", "allocated", "used")
#: Every figure of a sample, as the store's columns name them: cpu_capacity, ..., fgpu_used.
FIELDS = tuple(f"{resource}_{series}" for resource in RESOURCES for series in SERIES)
#: The record statuses that hold a grant, and the one whose container runs (models.Status values).
HOLDING = ("SCHEDULED", "RUNNING")
RUNNING = "RUNNING"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Sample:
    """The cluster at `at`, standing for `seconds` of time; `figures` maps each of FIELDS to a
    number (None: unknown)."""

    at: datetime
    seconds: float
    figures: Mapping[str, float | None]

    def get(self, field: str) -> float | None:
        return self.figures.get(field)


def measure(
    nodes: Iterable, records: Iterable, usage: Mapping[str, dict | None], units_per_gpu: int
) -> dict[str, float | None]:
    """The figures of one sample: `nodes` (resource_model.Node: cpu, mem, gpus), the active
    `records` (id, status, cpu, mem, fgpu) and the live `usage` of running sessions by id
    (stats.Usage as a dict, or None while unknown)."""
    nodes, records = list(nodes), list(records)
    held = [r for r in records if r.status in HOLDING]
    running = [usage.get(r.id) for r in records if r.status == RUNNING]
    figures = {
        "cpu_capacity": float(sum(n.cpu for n in nodes)),
        "mem_capacity": float(sum(n.mem for n in nodes)),
        "fgpu_capacity": float(sum(len(n.gpus) for n in nodes) * units_per_gpu),
        "cpu_allocated": float(sum(r.cpu for r in held)),
        "mem_allocated": float(sum(r.mem for r in held)),
        "fgpu_allocated": round(float(sum(r.fgpu for r in held)), 6),
    }
    known = [u for u in running if u]
    ran = bool(running)
    figures["cpu_used"] = _sum_known(ran, [u.get("cpu_percent") for u in known], 1 / 100)
    figures["mem_used"] = _sum_known(ran, [u.get("mem_bytes") for u in known], 1)
    gpu = [u.get("gpu_util_percent") for u in known]
    figures["fgpu_used"] = _sum_known(ran, gpu, units_per_gpu / 100)
    return figures


def _sum_known(any_running: bool, values: list, scale: float) -> float | None:
    """Σ the known values × scale; None when sessions run and none reports the figure."""
    known = [v for v in values if v is not None]
    if not known:
        return None if any_running else 0.0
    return float(sum(known)) * scale


def average(samples: Sequence[Sample], at: datetime) -> Sample:
    """One sample at `at` for all of `samples`: each figure's mean weighted by `seconds` (over the
    samples that know it), standing for their seconds together."""
    seconds = sum(s.seconds for s in samples)
    figures = {}
    for field in FIELDS:
        known = [(s.get(field), s.seconds) for s in samples if s.get(field) is not None]
        weight = sum(w for _, w in known)
        if not known:
            figures[field] = None
        elif weight <= 0:
            figures[field] = sum(v for v, _ in known) / len(known)
        else:
            figures[field] = sum(v * w for v, w in known) / weight
    return Sample(at, seconds, figures)


def bucket_start(moment: datetime, width: float) -> datetime:
    """The start of the `width`-second bucket `moment` falls in (buckets counted from the epoch,
    so the same moment always lands in the same bucket)."""
    offset = (moment - EPOCH).total_seconds()
    return EPOCH + timedelta(seconds=(offset // width) * width)


def buckets(samples: Iterable[Sample], width: float) -> list[Sample]:
    """`samples` averaged per `width`-second bucket, each at its bucket's start, oldest first."""
    grouped: dict[datetime, list[Sample]] = {}
    for sample in samples:
        grouped.setdefault(bucket_start(sample.at, width), []).append(sample)
    return [average(grouped[start], start) for start in sorted(grouped)]


def thin(samples: Sequence[Sample], start: datetime, end: datetime, max_points: int):
    """`samples` (of [start, end]) as at most about `max_points` points: as they are when they
    are few enough, else averaged into equal buckets of whole seconds. Returns (samples, the
    bucket width or None)."""
    if len(samples) <= max_points:
        return list(samples), None
    width = max(1, ceil((end - start).total_seconds() / max_points))
    thinned = buckets(samples, width)
    while len(thinned) > max_points:  # bucket edges off the span's start add one bucket at most
        width *= 2
        thinned = buckets(samples, width)
    return thinned, width


def as_json(sample: Sample) -> dict:
    """A sample as the API shows it: {at, seconds, cpu: {capacity, allocated, used}, mem, fgpu}."""
    return {
        "at": sample.at.astimezone(UTC).isoformat(),
        "seconds": sample.seconds,
        **{
            resource: {series: sample.get(f"{resource}_{series}") for series in SERIES}
            for resource in RESOURCES
        },
    }
