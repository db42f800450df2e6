"""P5: how full the GPUs are when the first request has to wait, best fit beside first fit.

A seeded random trace of requests from 0.1 to 2 fGPU (in steps of 0.1) arrives and nothing ends.
At the first request that cannot be placed, the share of the cluster's fGPU capacity in use is
recorded. CPU and memory are plentiful, so only GPU packing decides. The baseline is the naive
first fit of P1 (first node, first GPU with room), run on the same traces in the same process.
Each figure is the mean over several seeds, for several cluster sizes: the share depends on size,
since a larger cluster has more partly used GPUs for a request to fit into. Goal: ≥ 95%.
"""

from __future__ import annotations

import argparse
import random
import statistics

from benchmarks.p1_scheduler_throughput import make_nodes, naive_first_fit
from queue_service.core.resource_model import Allocation, Node, Request, Slots
from queue_service.core.scheduler import schedule

GIB = 2**30
MEAN_FGPU = 1.05  # of a request drawn uniformly from 0.1, 0.2, ..., 2.0


def trace(seed: int, count: int) -> list[Request]:
    rng = random.Random(seed)
    return [
        Request(f"r{seq}", f"u{seq % 17}", (), Slots(1, GIB, rng.randint(1, 20) / 10), None, seq)
        for seq in range(count)
    ]


def fgpu_capacity(nodes: list[Node], units: float) -> float:
    return sum(len(n.gpus) for n in nodes) * units


def share_at_first_wait(
    nodes: list[Node], requests: list[Request], placed: list[Allocation], units: float
) -> float | None:
    """Share of fGPU capacity held by the requests placed before the first one that waits.

    Placing the whole trace in one FIFO pass gives each request exactly the cluster that arriving
    one at a time would: every earlier request has been placed or left waiting before it is
    considered, and nothing ends. Placements after the first wait (backfill) are left out.
    """
    seq = {r.id: r.enqueued_seq for r in requests}
    placed_seqs = {seq[a.request_id] for a in placed}
    first_wait = next((r.enqueued_seq for r in requests if r.enqueued_seq not in placed_seqs), None)
    if first_wait is None:
        return None
    used = sum(a.slots.fgpu for a in placed if seq[a.request_id] < first_wait)
    return used / fgpu_capacity(nodes, units)


def by_scheduler(placement: str):
    def place(nodes, requests, units):
        return list(schedule(nodes, [], requests, units_per_gpu=units, placement=placement).placed)

    return place


def by_first_fit(nodes, requests, units):
    return naive_first_fit(nodes, [], requests, units)


PLACERS = {
    "best_fit": by_scheduler("best_fit"),
    "fill": by_scheduler("fill"),
    "spread": by_scheduler("spread"),
    "first fit": by_first_fit,
}


def measure(nodes: list[Node], seed: int, units: float, place) -> float:
    count = int(fgpu_capacity(nodes, units) / MEAN_FGPU * 1.5) + 50  # overfill by half
    while True:
        requests = trace(seed, count)
        share = share_at_first_wait(nodes, requests, place(nodes, requests, units), units)
        if share is not None:
            return share
        count *= 2


def enough_requests(nodes: list[Node], units: float) -> int:
    """A trace long enough to fill the cluster even if every request were the smallest, 0.1."""
    return int(fgpu_capacity(nodes, units) / 0.1) + 1


def sequential_share(nodes: list[Node], seed: int, units: float, placement: str) -> float:
    """The same figure the slow way, one pass per arrival: a check on the shortcut above."""
    held: list[Allocation] = []
    for request in trace(seed, enough_requests(nodes, units)):
        result = schedule(nodes, held, [request], units_per_gpu=units, placement=placement)
        if not result.placed:
            break
        held.append(result.placed[0])
    return sum(a.slots.fgpu for a in held) / fgpu_capacity(nodes, units)


def fluid_share(nodes: list[Node], seed: int, units: float) -> float:
    """The bound no placement can pass: capacity as one pool, with no GPU or node edges, so a
    request waits only when the whole free amount is smaller than it."""
    capacity, used = fgpu_capacity(nodes, units), 0.0
    for request in trace(seed, enough_requests(nodes, units)):
        if used + request.slots.fgpu > capacity + 1e-9:
            break
        used += request.slots.fgpu
    return used / capacity


def parse_size(text: str) -> tuple[int, int]:
    nodes, gpus = text.lower().split("x")
    return int(nodes), int(gpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        type=parse_size,
        nargs="+",
        default=[(8, 8), (32, 8), (128, 8)],
        help="clusters as NODESxGPUS (default: 8x8 32x8 128x8; P1's is 1000x8)",
    )
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument(
        "--units-per-gpu",
        type=float,
        nargs="+",
        default=[1, 2, 5],
        help="1: a 2 fGPU request spans two GPUs; 2: every request fits on one GPU; "
        "5: the architecture's other example, 1 fGPU = 0.2 GPU",
    )
    args = parser.parse_args()
    print(f"P5: requests of 0.1–2 fGPU until the first one waits, mean over {args.seeds} seeds")

    # The one-pass shortcut must agree with arrivals one at a time; check it on a small cluster.
    small = make_nodes(4, 8)
    for seed in range(3):
        shortcut = measure(small, seed, 1, PLACERS["best_fit"])
        assert abs(shortcut - sequential_share(small, seed, 1, "best_fit")) < 1e-9, seed

    missed = []
    for node_count, gpus in args.sizes:
        nodes = make_nodes(node_count, gpus)
        for units in args.units_per_gpu:
            shares = {
                name: [measure(nodes, seed, units, place) for seed in range(args.seeds)]
                for name, place in PLACERS.items()
            }
            base = statistics.mean(shares["first fit"])
            print(f"{node_count} nodes × {gpus} GPUs, units_per_gpu={units:g}:")
            for name, values in shares.items():
                mean = statistics.mean(values)
                print(
                    f"  {name:<9} {mean:6.1%} in use (min {min(values):6.1%}, "
                    f"max {max(values):6.1%})   ratio to first fit {mean / base:5.3f}"
                )
            fluid = statistics.mean(fluid_share(nodes, seed, units) for seed in range(args.seeds))
            print(f"  {'bound':<9} {fluid:6.1%} in use if capacity were one pool (no GPU edges)")
            if statistics.mean(shares["best_fit"]) < 0.95:
                missed.append(f"{node_count}x{gpus} at units_per_gpu={units:g}")
    if missed:
        print(f"goal ≥ 95% for best_fit: missed on {', '.join(missed)}; met on the rest")
        print("  (benchmarks.p5_lookahead estimates what any online placement reaches there)")
    else:
        print("goal ≥ 95% for best_fit: met on every size")


if __name__ == "__main__":
    main()
