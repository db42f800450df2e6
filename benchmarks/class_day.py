"""A class day, training inside open notebooks (today) against batch jobs.

A discrete-event simulation on a simulated clock (nothing sleeps): a class of `--students` on
`--gpus` GPUs, over `--hours`. Every decision of who runs next and where is the project's own
scheduler core (`queue_service.core.scheduler.schedule`, with the shipped `fifo`, `best_fit`,
`max_skips` 10), after the core's admission check (`admission.admission_refusal`, which holds the
shipped per-user quota) and with the core's pending timeout (`pending_timeouts`). A pass runs
after every change of the line or the holdings, as the service does on a request or a release.

Both modes replay the same students with the same plans (same seed): they arrive through the
morning, open a CPU notebook, and for each of their training runs edit, prepare, train and
look at the results; most break for lunch.

- today: to train, a student opens a GPU session (half a GPU) and trains in it. The session is
  held through preparation, the run, the look at its results, and often beyond (students who got
  a GPU keep it), until the student closes it or the idle culler ends it an hour after its last
  activity (a running training is activity). A request that waits an hour ends as
  PENDING_TIMEOUT (the shipped `pending_timeout`) and the student asks again at once.
- batch: the same work happens in the CPU notebook; each run is submitted as a batch job of the
  same size, waits PENDING in the same queue, and gives its slice back the moment it exits.

Figures per mode: fGPU-hours allocated and doing work (training, plus the short GPU bursts of
interactive work in a GPU session), their ratio (the useful share), the wait from "the student
wants to start a training run" to its start (median, p95; a run still waiting at the end counts
with its wait so far, a lower bound), runs finished per hour, and the peak number of GPU requests
waiting. Baseline: today, in the same process. Goal: useful share ×2 or more and p95
wait ×0.5 or less with batch jobs, at equal capacity.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
import statistics
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass

from queue_service.core.admission import admission_refusal
from queue_service.core.pending_timeouts import pending_timeouts
from queue_service.core.resource_model import (
    Allocation,
    Gpu,
    Node,
    Quota,
    Quotas,
    Request,
    SlotLimits,
    Slots,
)
from queue_service.core.scheduler import schedule

GIB = 2**30
MINUTE, HOUR = 60.0, 3600.0

# ---------------------------------------------------------------------------------------------
# The cluster and the queue: the shipped settings unless said otherwise

#: GPUs per node: a common 4-GPU server; `--gpus 16` is 4 nodes.
GPUS_PER_NODE = 4
#: Capacity of a node for sessions (after the reserve): a 4-GPU server has 64-128 cores and
#: 512 GiB-1 TiB. CPU and memory are ample on purpose: the GPUs are what a class runs short of.
NODE_CPU, NODE_MEM = 128.0, 1024 * GIB
#: `FGPU_UNITS_PER_GPU=2`: 1 fGPU is half a GPU (e.g. 40 of an 80 GB card), the slice a class's
#: "GPU" preset gives; any positive number works in the core (the shipped default is 1).
UNITS_PER_GPU = 2
#: The shipped queue: FIFO with bounded backfill, best fit, 10 overtakings at most.
POLICY, PLACEMENT, MAX_SKIPS = "fifo", "best_fit", 10
#: The shipped per-user quota (queue_service/quotas.py DEFAULT_USER_QUOTA, fgpu from
#: FGPU_MAX_PER_SESSION): 3 sessions, 2 waiting, 4 fGPU. Batch jobs count as sessions here.
USER_QUOTA = Quota(max_slots=SlotLimits(fgpu=4), max_sessions=3, max_pending=2)
#: The shipped `pending_timeout`: a session request ends after an hour of waiting, and the
#: student asks again (at the back of the line). Batch jobs wait as long as it takes (the issue:
#: "PENDING until resources free up"); set to HOUR to give jobs the same rule.
SESSION_PENDING_TIMEOUT, JOB_PENDING_TIMEOUT = HOUR, 0.0
#: The shipped idle culler: an hour without activity (FGPU_IDLE_TIMEOUT), rounds every 60 s.
IDLE_TIMEOUT, CULL_EVERY = HOUR, 60.0

# What students ask for. The CPU notebook is the same in both modes; the GPU session of today and
# the batch job ask for the same slice ("the same resources and options as a session").
CPU_NOTEBOOK = Slots(cpu=1, mem=2 * GIB, fgpu=0)
GPU_SLICE = Slots(cpu=4, mem=16 * GIB, fgpu=1)

# ---------------------------------------------------------------------------------------------
# The workload: one class day (times in seconds from the day's start, 9:00)

#: A lab day from 9:00 to 17:00.
HOURS = 8.0
#: Students arrive through the morning, evenly over the first 3 hours (first lectures, then lab).
ARRIVAL_SPREAD = 3 * HOUR
#: Training runs a student launches over the day, and how likely each count is: a few, rarely
#: more than four in a lab day (mean 2.4).
RUNS_PER_STUDENT = {1: 0.20, 2: 0.35, 3: 0.30, 4: 0.15}
#: A training run: lognormal, median 25 min, sigma 0.6 (a quarter of runs under 17 min, one in
#: twenty over 67 min), cut to 3 min..2 h (course exercises are sized to finish in a lab).
TRAIN_MEDIAN, TRAIN_SIGMA, TRAIN_MIN, TRAIN_MAX = 25 * MINUTE, 0.6, 3 * MINUTE, 2 * HOUR
#: Editing code and reading the course before each run (median 25 min).
EDIT_MEDIAN, EDIT_SIGMA = 25 * MINUTE, 0.5
#: Right before a run: loading data and trying the model on a batch or two, with short GPU use
#: (median 8 min). Today this is done in the GPU session; batch mode does it on the CPU notebook
#: with a tiny batch, so its GPU bursts are not GPU work there.
PREP_MEDIAN, PREP_SIGMA = 8 * MINUTE, 0.5
#: Looking at a run's results (curves, metrics) before the next edit (median 10 min).
REVIEW_MEDIAN, REVIEW_SIGMA = 10 * MINUTE, 0.5
#: Writing up after the last run before leaving (median 15 min).
WRAPUP_MEDIAN, WRAPUP_SIGMA = 15 * MINUTE, 0.5
#: Lunch: taken between two runs once 12:00-13:00 is reached (uniform), lognormal median
#: 50 min, sigma 0.3 (about one in four longer than the idle timeout's hour).
LUNCH_FROM, LUNCH_TO, LUNCH_MEDIAN, LUNCH_SIGMA = 3 * HOUR, 4 * HOUR, 50 * MINUTE, 0.3
#: A batch job holds its slice for this long before its training computes: the container's start
#: (3-5 s, benchmarks/spawn_time.py), the kernel's, the framework's imports and loading the data
#: again (the notebook's preparation did it in the student's session). Allocated, not work.
JOB_OVERHEAD = 1 * MINUTE
#: Share of the time a student works in a GPU session that the GPU computes: a cell of about a
#: minute every ten (trying a batch, a plot of activations). Counted as GPU work, today only.
BURST_DUTY = 0.10
#: Today's habits: a student who has a GPU closes it after a run's results with this chance (the
#: rest keep it, since getting one means waiting again), before lunch with this chance, and when
#: leaving with this chance (the rest close the tab, and the culler ends the session an hour on;
#: the last holds for the CPU notebook in both modes).
P_CLOSE_AFTER_RUN, P_CLOSE_BEFORE_LUNCH, P_CLOSE_AT_LEAVE = 0.30, 0.20, 0.50

MODES = ("today", "batch")


# ---------------------------------------------------------------------------------------------
# Plans: what each student will do, drawn once per seed and replayed in both modes


@dataclass(frozen=True)
class Plan:
    student: str
    arrival: float
    lunch_at: float
    lunch: float
    edits: tuple[float, ...]
    preps: tuple[float, ...]
    trains: tuple[float, ...]
    reviews: tuple[float, ...]
    wrapup: float


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


def make_plans(students: int, seed: int, hours: float = HOURS) -> list[Plan]:
    """One plan per student; each student's draws come from its own seeded stream, so that the
    class of N+1 students is the class of N plus one."""
    scale = hours / HOURS  # a shorter day (the quick mode) compresses arrivals and lunch
    plans = []
    for index in range(students):
        rng = random.Random(f"class-day:{seed}:{index}")
        count = rng.choices(list(RUNS_PER_STUDENT), weights=list(RUNS_PER_STUDENT.values()))[0]
        trains = tuple(
            min(TRAIN_MAX, max(TRAIN_MIN, _lognormal(rng, TRAIN_MEDIAN, TRAIN_SIGMA)))
            for _ in range(count)
        )
        plans.append(
            Plan(
                student=f"student-{index:03d}",
                arrival=rng.uniform(0, ARRIVAL_SPREAD * scale),
                lunch_at=rng.uniform(LUNCH_FROM * scale, LUNCH_TO * scale),
                lunch=_lognormal(rng, LUNCH_MEDIAN, LUNCH_SIGMA),
                edits=tuple(_lognormal(rng, EDIT_MEDIAN, EDIT_SIGMA) for _ in range(count)),
                preps=tuple(_lognormal(rng, PREP_MEDIAN, PREP_SIGMA) for _ in range(count)),
                trains=trains,
                reviews=tuple(_lognormal(rng, REVIEW_MEDIAN, REVIEW_SIGMA) for _ in range(count)),
                wrapup=_lognormal(rng, WRAPUP_MEDIAN, WRAPUP_SIGMA),
            )
        )
    return plans


def make_nodes(gpus: int) -> list[Node]:
    nodes, index = [], 0
    while gpus > 0:
        count = min(GPUS_PER_NODE, gpus)
        nodes.append(
            Node(
                name=f"gpu-node-{index}",
                resource_group="default",
                cpu=NODE_CPU,
                mem=NODE_MEM,
                gpus=tuple(Gpu(f"GPU-{index}-{g}", 80 * GIB) for g in range(count)),
            )
        )
        gpus -= count
        index += 1
    return nodes


# ---------------------------------------------------------------------------------------------
# The simulation


@dataclass
class TrainingRun:
    student: str
    index: int
    duration: float
    want: float | None = None  # the student is ready to train (today: asks for the GPU)
    start: float | None = None  # the GPU is theirs (today: the session's grant, or held already)
    start_training: float | None = None  # today: after the preparation in the session
    end: float | None = None


@dataclass
class Held:
    allocation: Allocation
    kind: str  # "notebook", "gpu-session", "job"
    granted: float
    released: float | None = None
    #: When its student stopped working in it (a break, gone home); None while active.
    idle_since: float | None = None


@dataclass
class Waiting:
    request: Request
    kind: str
    enqueued: float
    timeout: float
    student: Student
    process: Generator
    #: When it was first asked for (a request asked again after its timeout keeps it).
    since: float


@dataclass
class Figures:
    mode: str
    capacity_fgpu_hours: float
    allocated: float  # fGPU-hours
    used: float  # fGPU-hours doing work
    used_training: float
    used_bursts: float
    interactive_allocated: float  # fGPU-hours of GPU sessions (today) / 0 (batch)
    jobs_started: int
    runs_planned: int
    runs_wanted: int
    runs_finished: int
    runs_running: int
    runs_waiting: int
    waits: list[float]  # minutes, one per wanted run (a waiting one: its wait so far)
    notebook_waits: list[float]  # minutes, CPU notebooks' queue waits
    peak_gpu_waiting: int
    pending_timeouts: int
    culled: int
    refusals: int
    passes: int
    hours: float

    @property
    def useful_share(self) -> float:
        return self.used / self.allocated if self.allocated else 0.0

    @property
    def runs_per_hour(self) -> float:
        return self.runs_finished / self.hours

    @property
    def median_wait(self) -> float:
        return percentile(self.waits, 50)

    @property
    def p95_wait(self) -> float:
        return percentile(self.waits, 95)


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


# Commands a student's process yields.
@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Ask:
    kind: str
    slots: Slots


class Student:
    def __init__(self, plan: Plan, mode: str, seed: int):
        self.plan, self.mode = plan, mode
        # Habits (closing a session or leaving it) have a stream of their own: the plans stay the
        # same in both modes.
        self.rng = random.Random(f"habits:{seed}:{plan.student}")
        self.notebook: str | None = None
        self.gpu: str | None = None
        self.runs = [TrainingRun(plan.student, i, d) for i, d in enumerate(plan.trains)]


class ClassDay:
    """One mode of one class day. `observer(sim)` is called after every event and its pass."""

    def __init__(
        self,
        plans: list[Plan],
        gpus: int,
        mode: str,
        seed: int,
        hours: float = HOURS,
        observer: Callable[[ClassDay], None] | None = None,
        max_skips: int = MAX_SKIPS,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.mode, self.hours, self.horizon = mode, hours, hours * HOUR
        self.nodes = make_nodes(gpus)
        self.max_skips = max_skips
        self.quotas = Quotas(default_user=USER_QUOTA)
        self.observer = observer
        self.now = 0.0
        self._events: list = []
        self._order = itertools.count()
        self._ids = itertools.count()
        self._seq = itertools.count()
        self.waiting: dict[str, Waiting] = {}
        self.held: dict[str, Held] = {}
        self.history: list[Held] = []
        self.skips: dict[str, int] = {}
        self.jitter = random.Random(f"culler:{seed}:{mode}")
        self.students = [Student(p, mode, seed) for p in plans]
        self.dirty = False
        self.passes = self.refusals = self.timeouts = self.culled = 0
        self.peak_gpu_waiting = 0
        self.bursts: list[tuple[float, float]] = []  # intervals of work in a GPU session
        self.notebook_waits: list[float] = []

    # -- the clock ------------------------------------------------------------------------------

    def at(self, when: float, action: Callable, *args) -> None:
        heapq.heappush(self._events, (when, next(self._order), action, args))

    def run(self) -> Figures:
        for student in self.students:
            process = self.day_of(student)
            self.at(student.plan.arrival, self.step, student, process, None)
        while self._events and self._events[0][0] <= self.horizon:
            when, _, action, args = heapq.heappop(self._events)
            self.now = when
            action(*args)
            self.settle()
            if self.observer:
                self.observer(self)
        self.now = self.horizon
        return self.figures()

    def step(self, student: Student, process: Generator, value) -> None:
        try:
            command = process.send(value)
        except StopIteration:
            return
        if isinstance(command, Sleep):
            self.at(self.now + command.seconds, self.step, student, process, None)
        else:
            self.ask(command.kind, command.slots, student, process)

    # -- the queue, through the core ------------------------------------------------------------

    def ask(
        self,
        kind: str,
        slots: Slots,
        student: Student,
        process: Generator,
        since: float | None = None,
    ) -> None:
        user = student.plan.student
        request = Request(
            id=f"r{next(self._ids)}",
            user=user,
            groups=(),
            slots=slots,
            resource_group=None,
            enqueued_seq=next(self._seq),
        )
        refusal = admission_refusal(
            request,
            self.nodes,
            self.quotas,
            units_per_gpu=UNITS_PER_GPU,
            pending=[w.request for w in self.waiting.values()],
        )
        if refusal is not None:
            # The plans never ask past the quota; a refusal would be a bug of the benchmark.
            self.refusals += 1
            raise RuntimeError(f"{user}: refused: {refusal.message}")
        timeout = JOB_PENDING_TIMEOUT if kind == "job" else SESSION_PENDING_TIMEOUT
        self.waiting[request.id] = Waiting(
            request, kind, self.now, timeout, student, process, self.now if since is None else since
        )
        if timeout:
            # The service's round that ends it, if it still waits then.
            self.at(self.now + timeout + 1.0, self.mark_dirty)
        self.dirty = True

    def mark_dirty(self) -> None:
        self.dirty = True

    def release(self, request_id: str) -> None:
        held = self.held.pop(request_id)
        held.released = self.now
        self.dirty = True

    def settle(self) -> None:
        """Scheduling passes until nothing changes, as the service runs one on every change."""
        while self.dirty:
            self.dirty = False
            self.expire()
            if not self.waiting:
                break
            pending = [
                Request(
                    w.request.id,
                    w.request.user,
                    w.request.groups,
                    w.request.slots,
                    w.request.resource_group,
                    w.request.enqueued_seq,
                    self.skips.get(w.request.id, 0),
                )
                for w in self.waiting.values()
            ]
            outcome = schedule(
                self.nodes,
                [h.allocation for h in self.held.values()],
                pending,
                self.quotas,
                policy=POLICY,
                placement=PLACEMENT,
                units_per_gpu=UNITS_PER_GPU,
                max_skips=self.max_skips,
            )
            self.passes += 1
            if outcome.refused:
                raise RuntimeError(f"the scheduler refused {dict(outcome.refused)}")
            for request_id, waiting in outcome.waiting.items():
                self.skips[request_id] = waiting.skips
            gpu_waiting = sum(1 for w in self.waiting.values() if w.request.slots.fgpu)
            granted = []
            for allocation in outcome.placed:
                waiting = self.waiting.pop(allocation.request_id)
                self.skips.pop(allocation.request_id, None)
                held = Held(allocation, waiting.kind, self.now)
                self.held[allocation.request_id] = held
                self.history.append(held)
                granted.append((waiting, allocation.request_id))
            self.peak_gpu_waiting = max(self.peak_gpu_waiting, gpu_waiting)
            for waiting, request_id in granted:
                if waiting.kind == "notebook":
                    self.notebook_waits.append((self.now - waiting.since) / MINUTE)
                self.step(waiting.student, waiting.process, request_id)

    def expire(self) -> None:
        """The core's pending timeout; the student (or the job's owner) asks again at once."""
        for timeout in {w.timeout for w in self.waiting.values() if w.timeout}:
            enqueued = {i: w.enqueued for i, w in self.waiting.items() if w.timeout == timeout}
            for request_id in pending_timeouts(enqueued, self.now, timeout):
                old = self.waiting.pop(request_id)
                self.skips.pop(request_id, None)
                self.timeouts += 1
                self.ask(old.kind, old.request.slots, old.student, old.process, old.since)
                self.dirty = True

    # -- idle culling ---------------------------------------------------------------------------

    def go_idle(self, student: Student) -> None:
        for request_id in (student.notebook, student.gpu):
            if request_id is not None:
                self.held[request_id].idle_since = self.now
                cull_at = self.now + IDLE_TIMEOUT + self.jitter.uniform(0, CULL_EVERY)
                self.at(cull_at, self.cull, student, request_id, self.now)

    def come_back(self, student: Student) -> None:
        for request_id in (student.notebook, student.gpu):
            if request_id is not None:
                self.held[request_id].idle_since = None

    def cull(self, student: Student, request_id: str, idle_since: float) -> None:
        held = self.held.get(request_id)
        if held is None or held.idle_since != idle_since:
            return
        self.release(request_id)
        self.culled += 1
        if student.gpu == request_id:
            student.gpu = None
        if student.notebook == request_id:
            student.notebook = None

    # -- a student's day ------------------------------------------------------------------------

    def work(self, student: Student, seconds: float):
        """Interactive work; today, the part done in a GPU session uses the GPU in bursts."""
        if student.gpu is not None:
            self.bursts.append((self.now, self.now + seconds))
        return Sleep(seconds)

    def close(self, student: Student, which: str) -> None:
        request_id = getattr(student, which)
        if request_id is not None:
            self.release(request_id)
            setattr(student, which, None)

    def day_of(self, student: Student) -> Generator:
        plan, today = student.plan, self.mode == "today"
        student.notebook = yield Ask("notebook", CPU_NOTEBOOK)
        lunched = False
        for run in student.runs:
            if not lunched and self.now >= plan.lunch_at:
                lunched = True
                if today and student.rng.random() < P_CLOSE_BEFORE_LUNCH:
                    self.close(student, "gpu")
                self.go_idle(student)
                yield Sleep(plan.lunch)
                self.come_back(student)
                if student.notebook is None:  # culled over a long lunch: start it again
                    student.notebook = yield Ask("notebook", CPU_NOTEBOOK)
            yield self.work(student, plan.edits[run.index])
            if today:
                run.want = self.now
                if student.gpu is None:
                    student.gpu = yield Ask("gpu-session", GPU_SLICE)
                run.start = self.now
                yield self.work(student, plan.preps[run.index])
                run.start_training = self.now
                yield Sleep(run.duration)
                run.end = self.now
                yield self.work(student, plan.reviews[run.index])
                if student.rng.random() < P_CLOSE_AFTER_RUN:
                    self.close(student, "gpu")
            else:
                yield Sleep(plan.preps[run.index])
                run.want = self.now
                job = yield Ask("job", GPU_SLICE)
                run.start = self.now
                yield Sleep(JOB_OVERHEAD)
                run.start_training = self.now
                yield Sleep(run.duration)
                self.release(job)
                run.end = self.now
                yield Sleep(plan.reviews[run.index])
        yield self.work(student, plan.wrapup)
        if student.rng.random() >= P_CLOSE_AT_LEAVE:
            self.go_idle(student)  # the tab is closed; the culler ends the sessions
        else:
            self.close(student, "gpu")
            self.close(student, "notebook")

    # -- the figures ----------------------------------------------------------------------------

    def figures(self) -> Figures:
        end = self.horizon

        def hours_of(start: float, stop: float | None) -> float:
            return max(0.0, min(end, end if stop is None else stop) - min(start, end)) / HOUR

        allocated = interactive = 0.0
        for held in self.history:
            fgpu = held.allocation.slots.fgpu
            if fgpu:
                amount = fgpu * hours_of(held.granted, held.released)
                allocated += amount
                if held.kind == "gpu-session":
                    interactive += amount
        runs = [run for s in self.students for run in s.runs]
        used_training = sum(
            GPU_SLICE.fgpu * hours_of(r.start_training, r.end)
            for r in runs
            if r.start_training is not None
        )
        used_bursts = sum(GPU_SLICE.fgpu * BURST_DUTY * hours_of(a, b) for a, b in self.bursts)
        wanted = [r for r in runs if r.want is not None]
        waits = [((end if r.start is None else r.start) - r.want) / MINUTE for r in wanted]
        return Figures(
            mode=self.mode,
            capacity_fgpu_hours=sum(len(n.gpus) for n in self.nodes) * UNITS_PER_GPU * self.hours,
            allocated=allocated,
            used=used_training + used_bursts,
            used_training=used_training,
            used_bursts=used_bursts,
            interactive_allocated=interactive,
            jobs_started=sum(1 for h in self.history if h.kind == "job"),
            runs_planned=len(runs),
            runs_wanted=len(wanted),
            runs_finished=sum(1 for r in wanted if r.end is not None),
            runs_running=sum(1 for r in wanted if r.start is not None and r.end is None),
            runs_waiting=sum(1 for r in wanted if r.start is None),
            waits=waits,
            notebook_waits=list(self.notebook_waits),
            peak_gpu_waiting=self.peak_gpu_waiting,
            pending_timeouts=self.timeouts,
            culled=self.culled,
            refusals=self.refusals,
            passes=self.passes,
            hours=self.hours,
        )


def simulate(
    students: int,
    gpus: int,
    seed: int,
    hours: float = HOURS,
    observer=None,
    max_skips: int = MAX_SKIPS,
) -> dict[str, Figures]:
    """Both modes of one class day: the same plans, the same cluster."""
    plans = make_plans(students, seed, hours)
    return {
        mode: ClassDay(plans, gpus, mode, seed, hours, observer, max_skips).run() for mode in MODES
    }


# ---------------------------------------------------------------------------------------------
# The report


def table(figures: dict[str, Figures]) -> list[str]:
    today, batch = figures["today"], figures["batch"]
    rows = [
        ("fGPU-hours allocated", lambda f: f"{f.allocated:.1f}"),
        ("  of the capacity", lambda f: f"{f.allocated / f.capacity_fgpu_hours:.0%}"),
        ("fGPU-hours doing work", lambda f: f"{f.used:.1f}"),
        ("  training", lambda f: f"{f.used_training:.1f}"),
        ("  GPU bursts of notebooks", lambda f: f"{f.used_bursts:.1f}"),
        ("useful share (work / allocated)", lambda f: f"{f.useful_share:.1%}"),
        ("wait before a run, median (min)", lambda f: f"{f.median_wait:.1f}"),
        ("wait before a run, p95 (min)", lambda f: f"{f.p95_wait:.1f}"),
        ("runs finished per hour", lambda f: f"{f.runs_per_hour:.1f}"),
        (
            "runs finished / wanted / planned",
            lambda f: f"{f.runs_finished} / {f.runs_wanted} / {f.runs_planned}",
        ),
        ("runs running / waiting at the end", lambda f: f"{f.runs_running} / {f.runs_waiting}"),
        ("peak GPU requests waiting", lambda f: f"{f.peak_gpu_waiting}"),
        ("pending timeouts (asked again)", lambda f: f"{f.pending_timeouts}"),
        ("sessions ended by the culler", lambda f: f"{f.culled}"),
        ("CPU notebook wait p95 (min)", lambda f: f"{percentile(f.notebook_waits, 95):.1f}"),
        ("scheduler passes", lambda f: f"{f.passes}"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"  {'':<{width}}  {'today':>14}  {'batch jobs':>14}"]
    for name, cell in rows:
        lines.append(f"  {name:<{width}}  {cell(today):>14}  {cell(batch):>14}")
    return lines


def goals(figures: dict[str, Figures]) -> list[tuple[str, float, bool]]:
    """(what, ratio batch/today, met) for the issue's two goals."""
    today, batch = figures["today"], figures["batch"]
    share = batch.useful_share / today.useful_share if today.useful_share else math.inf
    p95 = batch.p95_wait / today.p95_wait if today.p95_wait else math.inf
    return [
        ("useful share, batch / today (goal ≥ 2)", share, share >= 2),
        ("p95 wait before a run, batch / today (goal ≤ 0.5)", p95, p95 <= 0.5),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hours", type=float, default=HOURS)
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="also run this many seeds from --seed on, and print the spread of the two ratios",
    )
    parser.add_argument(
        "--quick", action="store_true", help="40 students on 4 GPUs for 4 hours (for tests)"
    )
    parser.add_argument(
        "--max-skips",
        type=int,
        default=MAX_SKIPS,
        help="the queue's max_skips (shipped: 10); a large value shows what the skip bound "
        "costs CPU notebooks that wait behind GPU requests",
    )
    args = parser.parse_args()
    if args.quick:
        args.students, args.gpus, args.hours = 40, 4, 4.0
    print(
        f"Class day: {args.students} students, {args.gpus} GPUs in nodes of "
        f"{GPUS_PER_NODE}, units_per_gpu={UNITS_PER_GPU} (a run or GPU session asks "
        f"{GPU_SLICE.fgpu:g} fGPU = {GPU_SLICE.fgpu / UNITS_PER_GPU:g} GPU), {args.hours:g} h, "
        f"seed {args.seed}; {POLICY}/{PLACEMENT}, max_skips {args.max_skips}"
    )
    started = time.process_time()
    figures = simulate(args.students, args.gpus, args.seed, args.hours, None, args.max_skips)
    print("\n".join(table(figures)))
    for what, ratio, met in goals(figures):
        print(f"{what}: {ratio:.2f}  {'PASS' if met else 'MISS'}")
    print(f"(simulated in {time.process_time() - started:.1f} s of CPU)")
    if args.seeds > 1:
        ratios: list[list[float]] = [[], []]
        for seed in range(args.seed, args.seed + args.seeds):
            for i, (_, ratio, _) in enumerate(
                goals(simulate(args.students, args.gpus, seed, args.hours, None, args.max_skips))
            ):
                ratios[i].append(ratio)
        for (what, _, _), values in zip(goals(figures), ratios, strict=True):
            print(
                f"over {args.seeds} seeds, {what.split(' (')[0]}: median "
                f"{statistics.median(values):.2f}, min {min(values):.2f}, max {max(values):.2f}"
            )


if __name__ == "__main__":
    main()
