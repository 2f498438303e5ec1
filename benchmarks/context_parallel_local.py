"""Context parallelism run for real on the local CPU cluster, beside what the cost model predicts.

1. Profile the machine as ``--ranks`` ranks (``planner profile --quick``), unless ``--cluster``
   gives such a profile.
2. For every cp dividing the ranks (1, 2, 4 on 4 ranks; dp takes the rest) and both kinds of
   context parallelism (ring, all-to-all), plan tiny-llama (rotary, grouped-query attention) at
   ``--seq-len`` tokens on that profile and run it for ``--steps`` steps (``planner run``),
   ``--repeats`` times, the plans alternating.
3. Print, for each cp: the predicted step time, the median measured one, their ratio, the ring's
   predicted key/value bytes per rank and step beside the measured ones (``RunReport``), and the
   predicted exposed context-parallel communication.

The target is the ratio of measured to predicted step time with cp ranks on the local
cluster. On this machine gloo runs no transfer behind compute, so the ring's every send is
exposed, as the all-to-alls always are (``cost_models.context_parallel``); ranks beyond the cores share them
(``cost_models.shared_cores``).

Run: .venv/bin/python benchmarks/context_parallel_local.py [--cluster F] [--ranks 4]
[--seq-len 2048] [--steps 6] [--repeats 3] (keep the machine otherwise idle). Writes
out/context-parallel/.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from cost_models.context_parallel import context_bytes_sent_per_step
from planner import api
from planner.files.clusters import load_cluster
from planner.schemas import ContextParallelKind, Layout, ModelSpec, TrainingSpec

MODEL = ModelSpec(
    name="tiny-llama",
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=384,
    vocab_size=1024,
    hidden_act="silu",
    tie_word_embeddings=False,
    max_position_embeddings=8192,
)
"""Llama-shaped and small, so that at a few thousand tokens attention is much of a step."""


def _torchrun(ranks: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]


def main() -> None:
    """Profile, plan each cp, run them alternately, print the ratios."""
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", help="a profile of this machine as --ranks ranks (default: measure one)")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=4, help="global batch (sequences)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default="out/context-parallel")
    args = parser.parse_args()
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    cluster_path = Path(args.cluster) if args.cluster else out / "cluster.json"
    if not args.cluster:
        print(f"profiling this machine as {args.ranks} ranks ...", file=sys.stderr)
        cmd = [*_torchrun(args.ranks), "-m", "planner", "profile", "--output", str(cluster_path), "--quick"]
        subprocess.run(cmd, check=True, capture_output=True)
    cluster = load_cluster(str(cluster_path))
    training = TrainingSpec(global_batch_size=args.batch, seq_len=args.seq_len, dtype="fp32")
    plans: dict[str, Path] = {}
    for cp in (c for c in (1, 2, 4, 8) if args.ranks % c == 0):
        for kind in ContextParallelKind if cp > 1 else (ContextParallelKind.RING,):
            layout = Layout(
                data_parallel_degree=args.ranks // cp,
                context_parallel_degree=cp,
                context_parallel_kind=kind,
                tensor_parallel_degree=1,
                pipeline_parallel_degree=1,
                micro_batch_size=1,
            )
            plan = api.make_plan(
                MODEL, training, cluster, str(cluster_path), layout, api.estimate(MODEL, cluster, training, layout)
            )
            name = f"cp{cp}" + ("a2a" if kind is ContextParallelKind.ALL_TO_ALL else "")
            plans[name] = out / f"plan-{name}.json"
            api.save_plan(plan, plans[name])
    measured: dict[str, list[float]] = {name: [] for name in plans}
    sent: dict[str, float] = {}
    for repeat in range(args.repeats):
        for cp, plan_path in plans.items():
            report = out / f"report-{cp}-{repeat}.json"
            cmd = [*_torchrun(args.ranks), "-m", "planner", "run", str(plan_path), "--steps", str(args.steps)]
            subprocess.run([*cmd, "--report", str(report)], check=True, capture_output=True)
            raw = json.loads(report.read_text())
            measured[cp].append(float(raw["measured_step_time_s"]))
            sent[cp] = max(raw.get("context_sent_bytes_per_step") or [0.0])
            print(f"repeat {repeat} {cp}: {measured[cp][-1]:.3f} s", file=sys.stderr)
    print(f"tiny-llama, {args.batch} x {args.seq_len} tokens a step, {args.ranks} ranks, fp32")
    header = "plan    predicted s  measured s  measured/predicted  sent MB pred/meas  cp comm s (predicted)"
    print(header)
    for cp, plan_path in plans.items():
        plan = api.load_plan(plan_path)
        predicted = plan.estimate.step_time_s
        median = statistics.median(measured[cp])
        bytes_mb = context_bytes_sent_per_step(MODEL, training, plan.layout).total_bytes / 1e6
        exposed = plan.estimate.time.context_parallel_comm_s
        print(
            f"{cp:<7} {predicted:>11.3f} {median:>11.3f} {median / predicted:>19.2f}"
            f"  {bytes_mb:>8.1f} / {sent[cp] / 1e6:<8.1f} {exposed:>13.4f}"
        )
    print(f"({time.perf_counter() - started:.0f} s; medians of {args.repeats} runs of {args.steps} steps)")


if __name__ == "__main__":
    main()
