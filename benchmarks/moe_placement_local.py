"""Placed against round-robin experts, run for real on the local CPU cluster.

1. Run tiny-moe at dp ``--ranks`` (4 or 2), ep 2 (two of its 4 experts per rank; with one per rank no placement
   changes the hottest rank) with contiguous experts for a few steps and capture its routing
   (``planner run --trace-routing``).
2. From that trace, place the experts with the CP-SAT refiner (``place_experts``) and build the
   round-robin placement; estimate both with the trace (``api.estimate``'s routing).
3. Run both plans ``--repeats`` times, alternating, and report the median measured step time of
   each, their ratio, and the predicted ratio; beside it the hottest rank's routed tokens of each.

The target (issue 13) is a lower measured step time for the placed plan. An untrained router on
uniform random tokens routes close to uniformly, so no placement can gain there; with
``--zipf S`` the runs train on tokens drawn with Zipf exponent S over the vocabulary (text's
token frequencies are Zipf-like, S about 1), which the router turns into hot experts. The gain
is bounded by how hot round-robin's hottest rank is on the captured trace (printed).

With 4 ranks on this machine's 2 cores, a rank that waits for the hottest one gives its core
to the others, so the step is bound by the ranks' total work more than by the hottest rank
(``cost_models.shared_cores``); ``--ranks 2`` gives each rank a core of its own, where the
hottest rank sets the pace as on GPUs.

Run: .venv/bin/python benchmarks/moe_placement_local.py [--cluster F] [--ranks 2] [--repeats 3] [--zipf 1.2]
(without --cluster it profiles the machine first, as the README's main job does; keep the
machine otherwise idle). Writes out/moe-placement/.
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from planner import api
from planner.plans import make_plan, save_plan
from planner.routing_trace import load_routing_stats
from planner.schemas import ExpertPlacement, Layout, TrainingSpec
from planner.schemas.routing import placement_metrics
from planner.search_engine.expert_placement import expert_rank_nodes, place_experts
from planner.search_engine.strategy import Budget

TRAINING = TrainingSpec(global_batch_size=32, seq_len=128)


def _torchrun(ranks: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(ranks),
        "-m",
        "planner",
    ]


def _run(plan: Path, report: Path, ranks: int, steps: int, data: Path | None, trace: Path | None = None) -> float:
    cmd = [*_torchrun(ranks), "run", str(plan), "--steps", str(steps), "--report", str(report)]
    cmd += ["--trace-routing", str(trace)] if trace else []
    cmd += ["--data", str(data)] if data else []
    subprocess.run(cmd, check=True, capture_output=True)
    return float(json.loads(report.read_text())["measured_step_time_s"])


def main() -> None:
    """Capture, place, run both placements alternately, print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", help="a profile of this machine as --ranks ranks (default: measure one)")
    parser.add_argument("--ranks", type=int, default=4, choices=(2, 4), help="data-parallel ranks (ep 2 either way)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--zipf", type=float, default=0.0, help="token frequency exponent (0: uniform tokens)")
    args = parser.parse_args()
    layout = Layout(
        data_parallel_degree=args.ranks,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=2,
        expert_parallel_degree=2,
    )
    workdir = Path("out/moe-placement")
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    cluster_path = args.cluster or str(workdir / "cluster.json")
    if args.cluster is None:
        profile = ["profile", "--output", cluster_path, "--quick", "--model", "tiny-moe", "--seq-len", "128"]
        subprocess.run([*_torchrun(args.ranks), *profile, "--dtype", "bf16"], check=True, capture_output=True)
    model, cluster = api.load_model("tiny-moe"), api.load_cluster(cluster_path)
    data = None
    if args.zipf > 0:
        data = workdir / "tokens.u16"
        weights = np.arange(1, model.vocab_size + 1, dtype=np.float64) ** -args.zipf
        rng = np.random.default_rng(0)
        rng.choice(model.vocab_size, size=400_000, p=weights / weights.sum()).astype(np.uint16).tofile(data)

    def plan_of(layout: Layout, name: str, routing_trace: Path | None = None) -> Path:
        estimate = api.estimate(model, cluster, TRAINING, layout, routing_trace=routing_trace)
        path = workdir / f"{name}.json"
        save_plan(make_plan(model, TRAINING, cluster, cluster_path, layout, estimate), path)
        return path

    trace = workdir / "routing.npz"
    _run(plan_of(layout, "contiguous"), workdir / "capture.json", args.ranks, 4, data, trace)
    stats = load_routing_stats(trace, model)
    nodes = expert_rank_nodes(layout, cluster.devices_per_node)
    placements = {
        "placed": place_experts(stats, nodes, Budget(max_time_s=10.0)),
        "round-robin": ExpertPlacement.round_robin(model.num_local_experts, 2, stats.num_layers),
    }
    plans = {name: plan_of(replace(layout, expert_placement=p), name, trace) for name, p in placements.items()}
    measured: dict[str, list[float]] = {name: [] for name in plans}
    for r in range(args.repeats):
        for name in plans if r % 2 == 0 else reversed(list(plans)):
            measured[name].append(_run(plans[name], workdir / f"{name}-{r}.json", args.ranks, args.steps, data))
    tokens = f"Zipf {args.zipf} tokens" if data else "uniform random tokens"
    batch = f"gbs {TRAINING.global_batch_size}, seq {TRAINING.seq_len}"
    print(f"tiny-moe dp{args.ranks} ep2, {batch}, {tokens}, {args.repeats} runs each")
    for name, placement in placements.items():
        metrics = placement_metrics(stats, placement, nodes)
        predicted = json.loads(plans[name].read_text())["estimate"]["step_time_s"]
        print(
            f"  {name:12s} measured {statistics.median(measured[name]):.4f} s (runs {measured[name]})"
            f"   predicted {predicted:.4f} s   hottest rank {metrics.hottest_rank_tokens:.0f} tokens"
            f" (mean {metrics.mean_rank_tokens:.0f})"
        )
    ratio = statistics.median(measured["placed"]) / statistics.median(measured["round-robin"])
    steps = {name: json.loads(path.read_text())["estimate"]["step_time_s"] for name, path in plans.items()}
    print(f"  placed / round-robin: measured {ratio:.3f}, predicted {steps['placed'] / steps['round-robin']:.3f}")


if __name__ == "__main__":
    main()
