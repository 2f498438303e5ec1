"""Placed against round-robin experts, run for real on the local CPU cluster.

1. Profile the machine with the benchmark's model (``planner profile --model``), so that the
   prediction starts from the measured MoE layer of this very model.
2. Run the model at dp ``--ranks`` (2 or 4), ep 2, with contiguous experts for a few steps and
   capture its routing (``planner run --trace-routing``).
3. From that trace, place the experts with the CP-SAT refiner (``place_experts``, with
   ``--expert-replicas`` spare slots per rank for replicas of hot experts) and build the
   round-robin placement; estimate both with the trace (``api.estimate``'s routing).
4. Run both plans ``--repeats`` times, alternating, and report the median measured step time of
   each, their ratio, the predicted ratio, and the hottest rank's routed tokens of each on the
   trace (summed over the MoE layers; the mean rank's beside it).

The setting, and why (the placed plan's measured step must be lower than round-robin's,
by more than this machine's run-to-run noise of about +-8%):

- The model (``MODEL``, written to the output folder as ``moe-bench.json``): one layer of 8
  top-1 experts 4096 wide on a 128-wide model, so the experts' GEMMs are most of a step and 4
  experts per rank leave the placement many choices. tiny-moe (4 experts 256 wide, top-2)
  predicted a 3% gain, under the noise (``--model tiny-moe --expert-replicas 0`` runs it). One
  layer, because then the hottest rank of the layer is also the rank with the most work in the
  step: with two layers round-robin's hottest rank alternated between the layers (both ranks'
  totals near the mean), which a loaded machine, bound by each rank's total work rather than
  by the layers' synchronisation, does not reward.
- Hot experts: an untrained router routes uniform random tokens nearly uniformly, so the runs
  train on tokens drawn with Zipf exponent ``--zipf`` over the vocabulary; the router then sends
  the frequent tokens' share to their experts. At 2.0 (a stress setting: text is about 1) the
  most frequent token is 1/zeta(2) = 61% of all, and one expert takes 71% of the routed tokens:
  no placement of whole experts brings a rank below that (predicted 0.908), while one spare
  slot per rank lets it be replicated on both ranks, each keeping its own tokens
  (``runtime.expert_parallel.ExpertExchange``). At ``--zipf 1.2 --expert-replicas 0`` the
  hottest expert takes 41%; round-robin's hottest rank carries 1.43x the mean, the placement's
  1.00x, predicted 0.885. (Predicted ratios here come from one profile taken on a shared machine.)
- Stationary routing: the runs use ``--lr`` 1e-5. Without a load-balancing loss (the runtime has
  none) the router collapses as it trains: at lr 1e-3 a layer sent 99% of its tokens to one
  expert by step 4 of 8, so a trace of the first steps no longer described the measured ones.
  A placement is made for the routing of its trace; the small learning rate keeps that routing
  for the measured steps while every step still runs forward, backward and the update.
- ``--ranks 2`` gives each rank one of this machine's 2 cores, where the hottest rank sets the
  pace as on GPUs. With 4 ranks on 2 cores, a rank that waits for the hottest one gives its core
  to the others, so the step is bound by the ranks' total work more than by the hottest rank
  (``cost_models.shared_cores``), and placement gains less (one run under load: predicted 0.892,
  measured 0.952).

Run: .venv/bin/python benchmarks/moe_placement_local.py [--cluster F] [--ranks 2] [--repeats 5]
(without --cluster it profiles the machine first; keep the machine otherwise idle; a --cluster
profile must have been taken with the same model). Writes out/moe-placement/.
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from planner import api
from planner.files.plans import make_plan, save_plan
from planner.files.routing_trace import load_routing_stats
from planner.schemas import ExpertPlacement, Layout, TrainingSpec
from planner.schemas.routing import placement_metrics
from planner.schemas.settings import Budget
from planner.search_engine.expert_placement import expert_rank_nodes, place_experts

TRAINING = TrainingSpec(global_batch_size=32, seq_len=128)
MODEL = {
    "hidden_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 4096,
    "vocab_size": 1024,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1.0e-05,
    "num_local_experts": 8,
    "num_experts_per_tok": 1,
}
"""The benchmark's model: Mixtral-shaped as tiny-moe, its experts most of the step (module docstring)."""


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


def _run(
    plan: Path, report: Path, ranks: int, steps: int, lr: float, data: Path | None, trace: Path | None = None
) -> float:
    cmd = [*_torchrun(ranks), "run", str(plan), "--steps", str(steps), "--report", str(report), "--lr", str(lr)]
    cmd += ["--trace-routing", str(trace)] if trace else []
    cmd += ["--data", str(data)] if data else []
    subprocess.run(cmd, check=True, capture_output=True)
    return float(json.loads(report.read_text())["measured_step_time_s"])


def main() -> None:
    """Profile, capture, place, run both placements alternately, print the ratios."""
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", help="a profile of this machine as --ranks ranks (default: measure one)")
    parser.add_argument("--model", help="a model preset or file (default: MODEL, written to the output folder)")
    parser.add_argument("--ranks", type=int, default=2, choices=(2, 4), help="data-parallel ranks (ep 2 either way)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each plan (0: predict only)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--zipf", type=float, default=2.0, help="token frequency exponent (0: uniform tokens)")
    parser.add_argument("--expert-replicas", type=int, default=1, help="spare expert slots per rank when placing")
    parser.add_argument("--lr", type=float, default=1e-5, help="learning rate of every run (see above)")
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
    model_arg = args.model
    if model_arg is None:
        model_arg = str(workdir / "moe-bench.json")
        Path(model_arg).write_text(json.dumps(MODEL, indent=2) + "\n")
    cluster_path = args.cluster or str(workdir / "cluster.json")
    if args.cluster is None:
        profile = ["profile", "--output", cluster_path, "--quick", "--model", model_arg, "--seq-len", "128"]
        subprocess.run([*_torchrun(args.ranks), *profile, "--dtype", "bf16"], check=True, capture_output=True)
    model, cluster = api.load_model(model_arg), api.load_cluster(cluster_path)
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
    _run(plan_of(layout, "contiguous"), workdir / "capture.json", args.ranks, 4, args.lr, data, trace)
    stats = load_routing_stats(trace, model)
    nodes = expert_rank_nodes(layout, cluster.devices_per_node)
    placements = {
        "placed": place_experts(stats, nodes, Budget(max_time_s=10.0), spare_slots=args.expert_replicas),
        "round-robin": ExpertPlacement.round_robin(model.num_local_experts, 2, stats.num_layers),
    }
    plans = {name: plan_of(replace(layout, expert_placement=p), name, trace) for name, p in placements.items()}
    predicted = {name: json.loads(path.read_text())["estimate"]["step_time_s"] for name, path in plans.items()}
    tokens = f"Zipf {args.zipf} tokens" if data else "uniform random tokens"
    batch = f"gbs {TRAINING.global_batch_size}, seq {TRAINING.seq_len}, lr {args.lr}"
    print(f"{model.name} dp{args.ranks} ep2, {batch}, {tokens}, {args.expert_replicas} spare slot(s) per rank")
    print(f"  experts' routed tokens per layer on the trace: {stats.expert_tokens.tolist()}")
    for name, placement in placements.items():
        metrics = placement_metrics(stats, placement, nodes)
        print(
            f"  {name:12s} predicted {predicted[name]:.4f} s   hottest rank {metrics.hottest_rank_tokens:.0f} tokens"
            f" (mean {metrics.mean_rank_tokens:.0f})   experts per rank {[list(r) for r in placement.slots[0]]}, ..."
        )
    print(f"  placed / round-robin: predicted {predicted['placed'] / predicted['round-robin']:.3f}", flush=True)
    if args.repeats == 0:
        return
    measured: dict[str, list[float]] = {name: [] for name in plans}
    for r in range(args.repeats):
        for name in plans if r % 2 == 0 else reversed(list(plans)):
            run = _run(plans[name], workdir / f"{name}-{r}.json", args.ranks, args.steps, args.lr, data)
            measured[name].append(run)
    for name, runs in measured.items():
        print(f"  {name:12s} measured {statistics.median(runs):.4f} s (runs {[round(t, 4) for t in runs]})")
    ratio = statistics.median(measured["placed"]) / statistics.median(measured["round-robin"])
    print(f"  placed / round-robin: measured {ratio:.3f} ({args.repeats} runs each)")
    print(f"  wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
