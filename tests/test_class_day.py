"""benchmarks/class_day.py: the class-day simulation on the scheduler core. No Docker,
no hub: a small class (the benchmark's --quick case) on a simulated clock."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import pytest

from benchmarks import class_day
from queue_service.core.resource_model import QUANTA_PER_GPU, fraction_quanta

QUICK = {"students": 40, "gpus": 4, "seed": 7, "hours": 4.0}


def quick(seed: int = QUICK["seed"], observer=None):
    return class_day.simulate(QUICK["students"], QUICK["gpus"], seed, QUICK["hours"], observer)


class CapacityCheck:
    """Called after every event and its scheduling pass: nothing is held beyond a node or a GPU."""

    def __init__(self):
        self.events = 0
        self.busiest_gpu = 0

    def __call__(self, sim: class_day.ClassDay) -> None:
        self.events += 1
        nodes = {node.name: node for node in sim.nodes}
        gpu_quanta: dict[str, int] = defaultdict(int)
        cpu: dict[str, float] = defaultdict(float)
        mem: dict[str, int] = defaultdict(int)
        for held in sim.held.values():
            allocation = held.allocation
            cpu[allocation.node] += allocation.slots.cpu
            mem[allocation.node] += allocation.slots.mem
            for uuid, fraction in allocation.gpus.items():
                assert uuid in {gpu.uuid for gpu in nodes[allocation.node].gpus}
                gpu_quanta[uuid] += fraction_quanta(fraction)
            # A grant's GPU share is its fGPU at the cluster's units.
            share = sum(fraction_quanta(f) for f in allocation.gpus.values())
            expected = allocation.slots.fgpu / class_day.UNITS_PER_GPU * QUANTA_PER_GPU
            assert share == round(expected)
        for uuid, quanta in gpu_quanta.items():
            assert quanta <= QUANTA_PER_GPU, (sim.now, uuid, quanta)
            self.busiest_gpu = max(self.busiest_gpu, quanta)
        for name in cpu:
            assert cpu[name] <= nodes[name].cpu + 1e-9, (sim.now, name)
            assert mem[name] <= nodes[name].mem, (sim.now, name)
        # Nothing is both waiting and held, and no request is granted twice.
        assert not set(sim.waiting) & set(sim.held)
        assert len({id(h) for h in sim.history}) == len(sim.history)


@pytest.fixture(scope="module")
def checked():
    check = CapacityCheck()
    figures = quick(observer=check)
    return figures, check


def test_the_same_seed_gives_the_same_figures_and_another_seed_others():
    first, again, other = quick(), quick(), quick(seed=QUICK["seed"] + 1)
    for mode in class_day.MODES:
        assert dataclasses.asdict(first[mode]) == dataclasses.asdict(again[mode])
    assert dataclasses.asdict(first["today"]) != dataclasses.asdict(other["today"])


def test_no_gpu_or_node_is_ever_allocated_beyond_its_capacity(checked):
    figures, check = checked
    assert check.events > 100
    # The class fills the GPUs, so the check was made on full ones.
    assert check.busiest_gpu == QUANTA_PER_GPU
    for f in figures.values():
        assert f.allocated <= f.capacity_fgpu_hours + 1e-9


def test_every_run_asked_for_finishes_runs_or_is_counted_waiting_at_the_end(checked):
    figures, _ = checked
    for f in figures.values():
        assert f.runs_wanted > 0
        assert f.runs_finished + f.runs_running + f.runs_waiting == f.runs_wanted
        assert f.runs_wanted <= f.runs_planned
        assert len(f.waits) == f.runs_wanted
        assert all(wait >= 0 for wait in f.waits)
        assert f.refusals == 0


def test_each_run_is_ordered_in_time_and_waits_only_for_its_gpu():
    plans = class_day.make_plans(QUICK["students"], QUICK["seed"], QUICK["hours"])
    for mode in class_day.MODES:
        sim = class_day.ClassDay(plans, QUICK["gpus"], mode, QUICK["seed"], QUICK["hours"])
        sim.run()
        for student in sim.students:
            for run in student.runs:
                if run.want is None:
                    assert run.start is None
                    continue
                assert run.want >= student.plan.arrival
                if run.start is not None:
                    assert run.start >= run.want
                # None when the day ended before its training began (preparation, a job's start).
                if run.start_training is not None:
                    assert run.start_training >= run.start
                if run.end is not None:
                    assert run.end == pytest.approx(run.start_training + run.duration)


def test_batch_jobs_hold_their_slice_only_while_they_run(checked):
    figures, _ = checked
    batch = figures["batch"]
    assert batch.interactive_allocated == 0
    assert batch.used_bursts == 0
    overhead = batch.jobs_started * class_day.JOB_OVERHEAD / 3600 * class_day.GPU_SLICE.fgpu
    # Allocated = training + each job's start (a job cut by the day's end holds less).
    assert batch.allocated <= batch.used + batch.interactive_allocated + overhead + 1e-9
    assert batch.allocated >= batch.used - 1e-9


def test_the_figures_add_up(checked):
    figures, _ = checked
    for f in figures.values():
        assert f.used == pytest.approx(f.used_training + f.used_bursts)
        assert f.useful_share == pytest.approx(f.used / f.allocated)
        assert 0 < f.useful_share <= 1
        assert f.runs_per_hour * f.hours == pytest.approx(f.runs_finished)
        assert f.median_wait <= f.p95_wait <= max(f.waits)
        # A wait is at most the day: nothing waits from before the start or after the end.
        assert max(f.waits) <= f.hours * 60
        assert f.capacity_fgpu_hours == QUICK["gpus"] * class_day.UNITS_PER_GPU * QUICK["hours"]
    today = figures["today"]
    assert today.used <= today.allocated
    # Today every GPU allocation is a GPU session; all training runs inside one.
    assert today.interactive_allocated == pytest.approx(today.allocated)
    ratios = class_day.goals(figures)
    assert ratios[0][1] == pytest.approx(figures["batch"].useful_share / today.useful_share)
    assert ratios[1][1] == pytest.approx(figures["batch"].p95_wait / today.p95_wait)


def test_percentile_is_the_nearest_rank():
    values = [float(v) for v in range(1, 21)]
    assert class_day.percentile(values, 50) == 10
    assert class_day.percentile(values, 95) == 19
    assert class_day.percentile(values, 100) == 20
    assert class_day.percentile([5.0], 95) == 5
    assert class_day.percentile([], 95) == 0


def test_every_decision_comes_from_the_scheduler_core(monkeypatch):
    calls = []
    real = class_day.schedule

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(class_day, "schedule", spy)
    figures = quick()
    assert len(calls) == sum(f.passes for f in figures.values())
    assert {(c["policy"], c["placement"], c["max_skips"]) for c in calls} == {
        (class_day.POLICY, class_day.PLACEMENT, class_day.MAX_SKIPS)
    }


def one_student(arrival=0.0, lunch_at=math.inf, runs=(600.0,)) -> class_day.Plan:
    count = len(runs)
    return class_day.Plan(
        student="student-000",
        arrival=arrival,
        lunch_at=lunch_at,
        lunch=0.0,
        edits=(60.0,) * count,
        preps=(60.0,) * count,
        trains=tuple(runs),
        reviews=(60.0,) * count,
        wrapup=60.0,
    )


def test_a_gpu_session_left_open_is_culled_an_hour_after_its_last_activity(monkeypatch):
    monkeypatch.setattr(class_day, "P_CLOSE_AFTER_RUN", 0.0)
    monkeypatch.setattr(class_day, "P_CLOSE_AT_LEAVE", 0.0)
    sim = class_day.ClassDay([one_student()], 1, "today", seed=1, hours=3.0)
    figures = sim.run()
    (session,) = [h for h in sim.history if h.kind == "gpu-session"]
    left = 60 + 60 + 600 + 60 + 60  # edit, prep, train, review, wrap-up
    assert session.granted == 60
    assert left + 3600 <= session.released <= left + 3600 + class_day.CULL_EVERY
    assert figures.culled == 2  # the GPU session and the notebook
    # Held from the grant to the cull; work: the run and a tenth of the interactive time in it.
    held = (session.released - 60) / 3600
    assert figures.allocated == pytest.approx(held)
    assert figures.used == pytest.approx(600 / 3600 + class_day.BURST_DUTY * 180 / 3600)


def test_a_batch_job_gives_its_slice_back_when_it_exits():
    sim = class_day.ClassDay([one_student()], 1, "batch", seed=1, hours=3.0)
    figures = sim.run()
    (job,) = [h for h in sim.history if h.kind == "job"]
    assert job.granted == 60 + 60  # after editing and preparing in the notebook
    assert job.released == job.granted + class_day.JOB_OVERHEAD + 600
    assert figures.allocated == pytest.approx((class_day.JOB_OVERHEAD + 600) / 3600)
    assert figures.waits == [0.0]


def test_a_request_that_waits_past_the_pending_timeout_is_asked_again_and_keeps_its_wait():
    # One GPU = two slices; three students want it at once, the third waits for a run of 2 h.
    plans = [
        dataclasses.replace(one_student(runs=(7200.0,)), student=f"student-{i:03d}")
        for i in range(3)
    ]
    sim = class_day.ClassDay(plans, 1, "today", seed=1, hours=4.0)
    figures = sim.run()
    assert figures.pending_timeouts >= 1
    waits = sorted(figures.waits)
    assert waits[:2] == [0.0, 0.0]
    # The third got a slice only once a run of 2 h and its review ended, past the hour.
    assert waits[2] > 60
    assert figures.runs_wanted == 3
