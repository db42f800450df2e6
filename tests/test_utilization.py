"""utilization.py, the pure arithmetic of the cluster's utilization: one sample from nodes, records
and live usage, weighted averages, buckets and the thinning of long series."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from queue_service.core import resource_model, utilization
from queue_service.core.utilization import FIELDS, Sample, as_json, average, buckets, measure, thin

GIB = 1024**3
NODES = [
    resource_model.Node(
        "a", "default", 4.0, 16 * GIB, (resource_model.Gpu("G1"), resource_model.Gpu("G2"))
    ),
    resource_model.Node("b", "default", 2.5, 8 * GIB, ()),
]
T0 = datetime(2026, 11, 24, 6, 0, tzinfo=UTC)


@dataclass
class Record:
    id: str
    status: str
    cpu: float
    mem: int
    fgpu: float


def usage(cpu_percent=None, mem_bytes=0, gpu_util_percent=None) -> dict:
    return {
        "cpu_percent": cpu_percent,
        "mem_bytes": mem_bytes,
        "mem_limit_bytes": 0,
        "gpu_mem_bytes": None,
        "gpu_util_percent": gpu_util_percent,
        "sampled_at": T0.isoformat(),
    }


def sample(at: datetime, seconds: float = 60.0, **figures) -> Sample:
    return Sample(at, seconds, {field: figures.get(field) for field in FIELDS})


def test_capacity_is_the_nodes_and_allocation_the_granted_slots():
    records = [
        Record("r", "RUNNING", 1.5, 2 * GIB, 1.5),
        Record("s", "SCHEDULED", 0.5, GIB, 0.5),
        Record("p", "PENDING", 3.0, 4 * GIB, 2.0),  # waits: holds nothing
    ]
    figures = measure(NODES, records, {"r": usage(50.0, GIB)}, units_per_gpu=5)
    assert figures["cpu_capacity"] == 6.5
    assert figures["mem_capacity"] == 24 * GIB
    assert figures["fgpu_capacity"] == 10.0  # 2 GPUs of 5 units
    assert (figures["cpu_allocated"], figures["mem_allocated"]) == (2.0, 3 * GIB)
    assert figures["fgpu_allocated"] == 2.0


def test_use_sums_the_running_sessions_in_cores_bytes_and_fgpu_units():
    records = [
        Record("a", "RUNNING", 2, GIB, 1),
        Record("b", "RUNNING", 2, GIB, 1),
        Record("s", "SCHEDULED", 2, GIB, 1),  # no container yet: its usage is not counted
    ]
    live = {
        "a": usage(150.0, 300, gpu_util_percent=40.0),
        "b": usage(25.0, 700, gpu_util_percent=10.0),
        "s": usage(100.0, 10_000, gpu_util_percent=100.0),
    }
    figures = measure(NODES, records, live, units_per_gpu=2)
    assert figures["cpu_used"] == pytest.approx(1.75)
    assert figures["mem_used"] == 1000
    assert figures["fgpu_used"] == pytest.approx(1.0)  # 50 % of one GPU is 1 unit of 2


def test_use_nobody_measures_is_unknown_not_zero():
    records = [Record("a", "RUNNING", 1, GIB, 1), Record("b", "RUNNING", 1, GIB, 0)]
    # Simulated GPUs: no session reports GPU use; the first stats round has no CPU % yet.
    live = {"a": usage(None, 100), "b": None}
    figures = measure(NODES, records, live, units_per_gpu=2)
    assert figures["fgpu_used"] is None
    assert figures["cpu_used"] is None
    assert figures["mem_used"] == 100  # what one session reports is known


def test_with_nothing_running_use_is_zero():
    figures = measure(NODES, [Record("p", "PENDING", 1, GIB, 1)], {}, units_per_gpu=2)
    assert [figures[f"{r}_used"] for r in ("cpu", "mem", "fgpu")] == [0.0, 0.0, 0.0]
    assert [figures[f"{r}_allocated"] for r in ("cpu", "mem", "fgpu")] == [0.0, 0.0, 0.0]


def test_an_empty_cluster_measures_zero_capacity():
    figures = measure([], [], {}, units_per_gpu=2)
    assert figures["cpu_capacity"] == figures["fgpu_capacity"] == 0.0


def test_an_average_weighs_each_sample_by_the_time_it_stands_for():
    one = sample(T0, 60, cpu_allocated=1.0, cpu_used=None, fgpu_allocated=2.0)
    two = sample(
        T0 + timedelta(minutes=1), 180, cpu_allocated=3.0, cpu_used=0.5, fgpu_allocated=2.0
    )
    mean = average([one, two], T0)
    assert mean.seconds == 240
    assert mean.get("cpu_allocated") == pytest.approx((60 * 1 + 180 * 3) / 240)
    assert mean.get("cpu_used") == 0.5  # the one that knows it
    assert mean.get("fgpu_allocated") == 2.0  # equal values average exactly to themselves
    assert mean.get("mem_used") is None


def test_buckets_start_on_whole_multiples_of_their_width():
    samples = [
        sample(T0 + timedelta(minutes=m, seconds=7), cpu_allocated=float(m)) for m in range(25)
    ]
    ten = buckets(samples, 600)
    assert [b.at for b in ten] == [T0, T0 + timedelta(minutes=10), T0 + timedelta(minutes=20)]
    assert [b.seconds for b in ten] == [600, 600, 300]
    assert [b.get("cpu_allocated") for b in ten] == [4.5, 14.5, 22.0]
    # The same moment always lands in the same bucket, whichever samples come with it.
    assert buckets(samples[3:5], 600)[0].at == T0


def test_thin_leaves_few_samples_alone_and_bounds_many():
    few = [sample(T0 + timedelta(seconds=s)) for s in range(0, 600, 60)]
    assert thin(few, T0, T0 + timedelta(minutes=10), 720) == (few, None)
    span = timedelta(days=7)
    many = [sample(T0 + timedelta(minutes=m), cpu_capacity=4.0) for m in range(0, 7 * 24 * 60)]
    thinned, width = thin(many, T0 - timedelta(seconds=13), T0 + span, 720)
    assert len(thinned) <= 720
    assert width >= span.total_seconds() / 720
    assert {s.get("cpu_capacity") for s in thinned} == {4.0}
    assert sum(s.seconds for s in thinned) == sum(s.seconds for s in many)


def test_the_api_shape_groups_the_figures_per_resource():
    shown = as_json(sample(T0, 60, cpu_capacity=4.0, cpu_allocated=1.0, mem_used=None))
    assert shown["at"] == "2026-11-24T06:00:00+00:00"
    assert shown["seconds"] == 60
    assert shown["cpu"] == {"capacity": 4.0, "allocated": 1.0, "used": None}
    assert set(shown) == {"at", "seconds", *utilization.RESOURCES}
