"""P5's ceiling on a small cluster: could another placement rule reach 95% where best fit does not?

P5 (`p5_packing.py`) misses its 95% goal on 8 nodes × 8 GPUs at units_per_gpu 1 and 2. This
benchmark estimates what the best *online* placer could do there, to tell a weak rule from a hard
limit. At each arrival it tries every distinct placement. From each one it plays out the same
`--futures` random continuations, drawn from P5's own distribution (0.1–2 fGPU), with best fit, and
it keeps the placement whose futures hold the most before a request waits. That is Monte-Carlo
one-step lookahead, the usual approximation of the optimal online policy.

It is a reference, not a placement to ship. It needs to know the request distribution, which a real
scheduler does not, and it spends thousands of best-fit passes on each decision. The baseline is
best fit. Its GPU-only model (CPU and memory are plentiful in P5) is first checked against the
scheduler's own best fit, seed by seed, so that the two figures compare like with like.
"""

from __future__ import annotations

import argparse
import random
import statistics

from benchmarks.p1_scheduler_throughput import make_nodes
from benchmarks.p5_packing import PLACERS, fluid_share, measure, parse_size, trace
from queue_service.core.resource_model import QUANTA_PER_GPU, gpu_quanta

#: P5's requests, in tenths of an fGPU unit.
SIZES_IN_TENTHS = range(1, 21)


class Gpus:
    """Free quanta of every GPU, node by node: the part of the cluster that P5 fills."""

    def __init__(self, free: list[list[int]]):
        self.free = free

    @classmethod
    def empty(cls, nodes: int, gpus: int) -> Gpus:
        return cls([[QUANTA_PER_GPU] * gpus for _ in range(nodes)])

    def copy(self) -> Gpus:
        return Gpus([list(node) for node in self.free])

    def placements(self, whole: int, rest: int) -> list[tuple[int, list[int], int | None]]:
        """(node, whole GPUs, GPU for the rest) for every placement that leaves a different
        cluster: GPUs of one node with the same free share are interchangeable."""
        found, seen = [], set()
        for node, free in enumerate(self.free):
            wholes = [gi for gi, q in enumerate(free) if q == QUANTA_PER_GPU]
            if len(wholes) < whole:
                continue
            taken, spare = wholes[:whole], wholes[whole:]
            rest_gpus = (
                [None]
                if rest == 0
                else [
                    gi
                    for gi, q in enumerate(free)
                    if rest <= q and (q < QUANTA_PER_GPU or gi in spare)
                ]
            )
            for gi in rest_gpus:
                key = (tuple(sorted(free)), None if gi is None else free[gi])
                if key not in seen:
                    seen.add(key)
                    found.append((node, taken, gi))
        return found

    def best_fit_key(self, placement, rest: int) -> tuple:
        """The scheduler's best fit: the tightest partly used GPU for a rest, else the node with
        the fewest whole GPUs; lowest node first on ties."""
        node, _, gi = placement
        whole_left = sum(1 for q in self.free[node] if q == QUANTA_PER_GPU)
        if gi is not None and self.free[node][gi] < QUANTA_PER_GPU:
            return (0, self.free[node][gi], node)
        return (1, whole_left, node)

    def take(self, placement, rest: int) -> None:
        node, taken, gi = placement
        for whole_gpu in taken:
            self.free[node][whole_gpu] = 0
        if gi is not None:
            self.free[node][gi] -= rest


def split(fgpu: float, units: float) -> tuple[int, int]:
    return divmod(gpu_quanta(fgpu, units), QUANTA_PER_GPU)


def best_fit_until_wait(gpus: Gpus, sizes, units: float) -> float:
    """fGPU placed by best fit before the first request in `sizes` waits."""
    held = 0.0
    for fgpu in sizes:
        whole, rest = split(fgpu, units)
        options = gpus.placements(whole, rest)
        if not options:
            return held
        gpus.take(min(options, key=lambda p: gpus.best_fit_key(p, rest)), rest)
        held += fgpu
    return held


def random_sizes(seed: float):
    rng = random.Random(seed)
    while True:
        yield rng.choice(SIZES_IN_TENTHS) / 10


def future_hold(gpus: Gpus, option, rest: int, seeds: list[float], units: float) -> float:
    """fGPU that best fit places after `option`, summed over the futures drawn from `seeds`."""
    total = 0.0
    for seed in seeds:
        after = gpus.copy()
        after.take(option, rest)
        total += best_fit_until_wait(after, random_sizes(seed), units)
    return total


def lookahead_share(nodes: int, gpus_per_node: int, seed: int, units: float, futures: int) -> float:
    gpus, held = Gpus.empty(nodes, gpus_per_node), 0.0
    capacity = nodes * gpus_per_node * units
    future_rng = random.Random(f"futures-{seed}")
    for request in trace(seed, int(capacity / 0.1) + 1):
        fgpu = request.slots.fgpu
        whole, rest = split(fgpu, units)
        options = gpus.placements(whole, rest)
        if not options:
            break
        if len(options) > 1:
            # The same futures for every option, so that they differ by the placement alone.
            seeds = [future_rng.random() for _ in range(futures)]
            options = [max(options, key=lambda o: future_hold(gpus, o, rest, seeds, units))]
        gpus.take(options[0], rest)
        held += fgpu
    return held / capacity


def model_share(nodes: int, gpus_per_node: int, seed: int, units: float) -> float:
    sizes = (r.slots.fgpu for r in trace(seed, int(nodes * gpus_per_node * units / 0.1) + 1))
    held = best_fit_until_wait(Gpus.empty(nodes, gpus_per_node), sizes, units)
    return held / (nodes * gpus_per_node * units)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=parse_size, default=(8, 8), help="NODESxGPUS (default 8x8)")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--futures", type=int, default=40, help="continuations per option")
    parser.add_argument("--units-per-gpu", type=float, nargs="+", default=[1, 2])
    args = parser.parse_args()
    node_count, gpus = args.size
    nodes = make_nodes(node_count, gpus)
    print(f"P5 ceiling: {node_count} nodes × {gpus} GPUs, mean over {args.seeds} seeds")
    for units in args.units_per_gpu:
        seeds = range(args.seeds)
        best_fit = [measure(nodes, seed, units, PLACERS["best_fit"]) for seed in seeds]
        model = [model_share(node_count, gpus, seed, units) for seed in seeds]
        assert all(abs(a - b) < 1e-9 for a, b in zip(best_fit, model, strict=True)), (
            "model ≠ scheduler"
        )
        ahead = [lookahead_share(node_count, gpus, s, units, args.futures) for s in seeds]
        fluid = statistics.mean(fluid_share(nodes, seed, units) for seed in seeds)
        base, mean = statistics.mean(best_fit), statistics.mean(ahead)
        print(f"units_per_gpu={units:g}:")
        print(f"  best_fit  {base:6.1%} in use (the scheduler; the model agrees on every seed)")
        print(
            f"  lookahead {mean:6.1%} in use ({args.futures} futures per option, "
            f"min {min(ahead):6.1%}, max {max(ahead):6.1%})   ratio to best_fit {mean / base:5.3f}"
        )
        print(f"  bound     {fluid:6.1%} in use if capacity were one pool (no GPU edges)")


if __name__ == "__main__":
    main()
