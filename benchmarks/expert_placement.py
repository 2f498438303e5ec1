"""Expert placement against round-robin on skewed synthetic routing traces, and its time at scale.

Traces (``planner.files.routing_trace.synthetic_trace``): expert popularity Zipf-like with exponent
``skew`` (the expert of popularity rank q gets weight q^-skew, ranks shuffled per layer) and
``affinity``, the probability that each of a token's experts in layer l is followed in layer
l + 1 by its fixed partner. Metrics (``planner.schemas.routing.placement_metrics``): the
hottest rank's routed tokens summed over layers, and the co-activated token pairs of consecutive
layers whose experts sit on different ranks / nodes (8 ranks per node).

Targets: on the skewed trace, cross-rank traffic at most 70% of round-robin's and a
lower hottest-rank load; the DeepSeek-V3-sized case (256 experts x 61 layers on 256 ranks) placed
in seconds. With top-8 routing only 1 of a token's 8 layer-l experts is the partner of a given
layer-(l + 1) expert, so at most about affinity / k of the pairs can be kept local there: that
case is reported for its time and its cut, not held to 30%. Replicas trade the other way: a hot
expert's tokens split over ranks cut the hottest rank's load but some of those tokens then
cross ranks, so the replica cases are reported, not held to the traffic target. With one slot
per rank and no replica the hottest rank is the hottest expert whatever the placement.

Run: .venv/bin/python benchmarks/expert_placement.py
     .venv/bin/python benchmarks/expert_placement.py --trace routing.npz --model tiny-moe --ranks 2
     (a trace captured from a run: ``planner run --trace-routing``)
"""

import argparse
import sys
import time
from dataclasses import dataclass

from planner.files.models import load_model
from planner.files.routing_trace import load_routing_stats, summarize, synthetic_trace
from planner.schemas import ExpertPlacement, RoutingStats
from planner.schemas.routing import placement_metrics
from planner.schemas.settings import Budget
from planner.search_engine.expert_placement import place_experts

DEVICES_PER_NODE = 8


@dataclass(frozen=True)
class Case:
    name: str
    experts: int
    layers: int
    ranks: int
    k: int
    tokens: int
    skew: float
    affinity: float
    spare_slots: int
    budget_s: float
    max_cross_rank_ratio: float | None
    """Cross-rank tokens at most this share of round-robin's (None: reported only)."""
    max_wall_s: float | None


CASES = (
    Case("skewed, top-2", 64, 16, 16, 2, 8000, 1.0, 0.9, 0, 4.0, 0.7, None),
    Case("skewed, top-2, 1 replica slot", 64, 16, 16, 2, 8000, 1.0, 0.9, 1, 4.0, None, None),
    Case("DeepSeek-V3 size, top-8", 256, 61, 256, 8, 4096, 1.0, 0.9, 0, 5.0, None, 15.0),
    Case("DeepSeek-V3 size, top-2", 256, 61, 256, 2, 4096, 1.0, 0.9, 0, 5.0, 0.7, 15.0),
    Case("DeepSeek-V3 size, top-8, 1 replica", 256, 61, 256, 8, 4096, 1.0, 0.9, 1, 5.0, None, 15.0),
)


def run(case: Case) -> bool:
    """Place one case, print one line; whether it met its targets."""
    ids = synthetic_trace(
        tokens=case.tokens,
        layers=case.layers,
        num_experts=case.experts,
        experts_per_token=case.k,
        skew=case.skew,
        affinity=case.affinity,
        seed=0,
    )
    label = f"{case.name:<32} skew {case.skew}, affinity {case.affinity}"
    return place(label, summarize(ids, case.experts, case.name), case.ranks, case.spare_slots, case.budget_s, case)


def place(label: str, stats: RoutingStats, ranks: int, spare_slots: int, budget_s: float, case: Case | None) -> bool:
    """Place ``stats``'s experts on ``ranks`` ranks, print one line against round-robin; whether
    it met ``case``'s targets (a lower hottest rank at least)."""
    nodes = tuple(r // DEVICES_PER_NODE for r in range(ranks))
    start = time.perf_counter()
    placement = place_experts(stats, nodes, Budget(max_time_s=budget_s), spare_slots=spare_slots)
    wall_s = time.perf_counter() - start
    ours = placement_metrics(stats, placement, nodes)
    base = placement_metrics(stats, ExpertPlacement.round_robin(stats.num_experts, ranks, stats.num_layers), nodes)
    rank_ratio = ours.cross_rank_tokens / base.cross_rank_tokens if base.cross_rank_tokens else 1.0
    node_ratio = ours.cross_node_tokens / base.cross_node_tokens if base.cross_node_tokens else 1.0
    hot_ratio = ours.hottest_rank_tokens / base.hottest_rank_tokens
    ok = hot_ratio <= 1.0
    if case is not None:
        ok &= case.max_cross_rank_ratio is None or rank_ratio <= case.max_cross_rank_ratio
        ok &= case.max_wall_s is None or wall_s <= case.max_wall_s
    print(
        f"{label}: {stats.num_experts:>3} experts x {stats.num_layers:>2} layers on {ranks:>3} ranks, "
        f"{wall_s:5.2f} s; vs round-robin: cross-rank {rank_ratio:.2f}x, cross-node {node_ratio:.2f}x, "
        f"hottest rank {hot_ratio:.2f}x (mean-rank floor {ours.mean_rank_tokens / base.hottest_rank_tokens:.2f}x)  "
        f"{'ok' if ok else 'MISSED'}"
    )
    return ok


def main() -> int:
    """Print one line per case (or for a captured trace); exit 1 if any misses its targets."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", help="a routing trace captured by `planner run --trace-routing` (.npz)")
    parser.add_argument("--model", default="tiny-moe", help="the trace's model (preset or config file)")
    parser.add_argument("--ranks", type=int, default=2, help="expert-parallel ranks to place the trace's experts on")
    parser.add_argument("--spare-slots", type=int, default=0)
    args = parser.parse_args()
    if args.trace:
        stats = load_routing_stats(args.trace, load_model(args.model))
        return 0 if place(f"captured {args.trace}", stats, args.ranks, args.spare_slots, 5.0, None) else 1
    missed = sum(not run(case) for case in CASES)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
