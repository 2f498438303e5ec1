"""HSDP against ZeRO-3 across two test hosts joined by a slow link: namespaced hosts
(scripts/netns_hosts.py), two ranks each, the link between them rate-limited with htb.

``planner profile --quick`` measures the 4 ranks (or ``--cluster`` reuses a profile of them); for
one model and batch the benchmark estimates and runs (a) ZeRO-3 over all 4 data-parallel ranks,
whose every gather and reduce-scatter crosses the slow link, and (b) HSDP: ZeRO-3 within each
host's 2 ranks, replicated across the hosts, whose only crossing is one all-reduce of a gradient
shard a step. The runs alternate (a, b, a, b, ...), since other work on this machine's shared
cores makes single runs noisy; each run's step time is the report's median after the warm-up.
It prints predicted and measured step times, their ratios HSDP / ZeRO-3, and checks that each
sharding group's 2 ranks run on one host (the DeviceMap's nodes and torchrun's ranks).
``--zero-stage 1`` or ``2`` compares the same two shapes under that stage.

Measured (tiny-gpt, global batch 8, seq 64, mb 2; 20 Mbit/s; profile 8.5 min, the node link read
1.2 MB/s; 2 runs of 3 pairs, load averages 3-17 on 2 cores): ZeRO-3 predicted 3.50 s, measured
3.08-3.53 s; HSDP predicted 1.04 s, measured 0.89-1.14 s; HSDP / ZeRO-3 predicted 0.30, measured
0.28-0.36 (medians 0.31, 0.30). Before the cost model priced the 4-rank group from the profile's
record of it (``cost_models.comm``), its hierarchical model predicted 1.98 s for ZeRO-3 (ratio
0.52). ``--zero-stage 1`` (2 pairs): predicted 2.48 s and 0.94 s (ratio 0.38), measured 4.51-5.23 s
and 2.94-3.08 s (ratio 0.56-0.68) while the runtime's ZeRO-1 in groups all-reduced the gradients
over all 4 ranks; since it reduces them as the cost model prices it (reduce-scatter in the group,
all-reduce of the share across the replicas: ``runtime.optim``), 4.78 s and 2.06 s (ratio 0.43).
Both stay about 2x the prediction: the runtime's ZeRO-0/1 reduce fp32 buckets, and ZeRO-1
broadcasts each owner's update, where the cost model prices bf16 reduce-scatters and all-gathers.

Run (as root, with iproute2): .venv/bin/python benchmarks/hsdp_netns.py [--rate-mbit 20]
    [--pairs 3] [--steps 6] [--cluster cluster.json] [--output cluster.json]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import planner
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.plans import make_plan, save_plan
from planner.schemas import ClusterProfile, Layout, TrainingSpec, ZeroStage

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netns_profile
from netns_profile import netns_hosts, torchrun_across

RANKS_PER_HOST = 2
HOSTS = 2
WORLD = RANKS_PER_HOST * HOSTS


def layouts(micro_batch_size: int, zero_stage: ZeroStage = ZeroStage.PARAMETERS) -> dict[str, Layout]:
    """ZeRO over the 4 ranks ("zero", ZeRO-3 by default), and ZeRO sharding within each host's 2
    ranks, replicated across the hosts ("hsdp")."""
    flat = Layout(
        data_parallel_degree=WORLD,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=micro_batch_size,
        zero_stage=zero_stage,
    )
    return {"zero": flat, "hsdp": replace(flat, sharding_group_size=RANKS_PER_HOST)}


def plan_nodes(layout: Layout, cluster: ClusterProfile) -> list[list[int]]:
    """The node of each rank of each sharding group, as the DeviceMap places them (the torch rank
    of plan rank r is ``device_of(r)``; torchrun numbers them host by host)."""
    g = layout.sharding_group_size or layout.data_parallel_degree
    return [
        [layout.device_map.node_of(r, cluster.devices_per_node) for r in range(first, first + g)]
        for first in range(0, layout.world_size, g)
    ]


def torch_rank_hosts(hosts: netns_hosts.NetnsHosts, workdir: Path, timeout_s: float) -> dict[int, str]:
    """The host each torch rank of a 2-per-host torchrun job runs on (each worker writes its
    RANK and hostname to a file)."""
    out = workdir / "ranks"
    out.mkdir(exist_ok=True)
    script = f'hostname > "{out}/$RANK"'
    torchrun_across(hosts, [], timeout_s, ranks_per_host=RANKS_PER_HOST, program=("--no-python", "sh", "-c", script))
    return {int(f.name): f.read_text().strip() for f in out.iterdir()}


def check_placement(
    hosts: netns_hosts.NetnsHosts, layout: Layout, cluster: ClusterProfile, on_host: dict[int, str]
) -> bool:
    """Print where each sharding group runs, by the plan (node numbers) and by torchrun
    (``on_host``: ``torch_rank_hosts``); whether each group's ranks share one host, the same in both."""
    by_plan = plan_nodes(layout, cluster)
    index = {h.hostname: h.index for h in hosts.hosts}
    g = layout.sharding_group_size or layout.data_parallel_degree
    groups = [[layout.device_map.device_of(r) for r in range(f, f + g)] for f in range(0, layout.world_size, g)]
    by_torch = [[index[on_host[t]] for t in group] for group in groups]
    print(f"sharding groups (torch ranks): {groups}; their nodes in the plan: {by_plan}; their hosts: {by_torch}")
    return all(len(set(nodes)) == 1 for nodes in by_plan + by_torch) and by_plan == by_torch


def estimate_plans(cluster_path: Path, workdir: Path, args: argparse.Namespace) -> dict[str, Path]:
    """Estimate each layout on the profile and write it as a plan."""
    cluster = load_cluster(str(cluster_path))
    training = TrainingSpec(global_batch_size=args.global_batch_size, seq_len=args.seq_len)
    model = load_model(args.model)
    paths = {}
    for name, layout in layouts(args.micro_batch_size, ZeroStage(args.zero_stage)).items():
        estimate = planner.estimate(model, cluster, training, layout)
        plan = make_plan(model, training, cluster, str(cluster_path), layout, estimate)
        paths[name] = workdir / f"{name}.json"
        save_plan(plan, paths[name])
        t = estimate.time
        print(
            f"{name:<6} {layout.describe():<28} predicted {estimate.step_time_s:.3f} s "
            f"(compute {t.compute_s:.3f}, data-parallel comm {t.data_parallel_comm_s:.3f} "
            f"of which behind compute {t.data_parallel_comm_overlapped_s:.3f})"
        )
    return paths


def run_interleaved(
    hosts: netns_hosts.NetnsHosts, plans: dict[str, Path], workdir: Path, args: argparse.Namespace
) -> None:
    """Run the plans in turn, ``args.pairs`` times; print each run's times and the ratios."""
    measured: dict[str, list[float]] = {name: [] for name in plans}
    predicted: dict[str, float] = {}
    for pair in range(args.pairs):
        for name, path in plans.items():
            report_path = workdir / f"{name}-{pair}.report.json"
            run_args = ["run", str(path), "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps)]
            torchrun_across(
                hosts, [*run_args, "--report", str(report_path)], args.timeout, ranks_per_host=RANKS_PER_HOST
            )
            report = json.loads(report_path.read_text())
            measured[name].append(report["measured_step_time_s"])
            predicted[name] = report["predicted_step_time_s"]
            steps = " ".join(f"{t:.3f}" for t in report["step_times_s"])
            print(f"pair {pair} {name:<6} median {report['measured_step_time_s']:.3f} s  steps [{steps}]  {_load()}")
    print(f"{'plan':<8}{'predicted s':>12}{'measured s (median of runs)':>30}")
    for name in plans:
        print(f"{name:<8}{predicted[name]:>12.3f}{statistics.median(measured[name]):>30.3f}")
    ratios = [b / a for a, b in zip(measured["zero"], measured["hsdp"], strict=True)]
    print(
        f"HSDP / ZeRO-{args.zero_stage}: predicted {predicted['hsdp'] / predicted['zero']:.2f}, measured per pair "
        f"{', '.join(f'{r:.2f}' for r in ratios)} (median {statistics.median(ratios):.2f})"
    )


def _load() -> str:
    return "load " + ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    """Profile (or reuse a profile), check the placement, estimate and run both plans."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate-mbit", type=float, default=20.0, help="the link between the two hosts")
    parser.add_argument("--cluster", type=Path, default=None, help="a profile of these hosts: skip profiling")
    parser.add_argument("--output", type=Path, default=None, help="keep the profile here")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for each torchrun job")
    parser.add_argument("--model", default="tiny-gpt")
    parser.add_argument("--global-batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6, help="training steps per run")
    parser.add_argument("--warmup-steps", type=int, default=2, help="first steps left out of a run's median")
    parser.add_argument("--zero-stage", type=int, default=3, choices=(1, 2, 3), help="of both plans")
    parser.add_argument("--pairs", type=int, default=3, help="runs of each plan, alternating")
    args = parser.parse_args()
    if reason := netns_hosts.unavailable_reason():
        raise SystemExit(f"hsdp_netns: {reason}")
    with tempfile.TemporaryDirectory() as tmp, netns_hosts.NetnsHosts(HOSTS, {(0, 1): args.rate_mbit}) as hosts:
        workdir = Path(tmp)
        print(f"{HOSTS} hosts x {RANKS_PER_HOST} ranks, the link between them {args.rate_mbit:g} Mbit/s; {_load()}")
        cluster_path = args.cluster
        if cluster_path is None:
            cluster_path = args.output or workdir / "cluster.json"
            profile = ["profile", "--quick", "--output", str(cluster_path)]
            wall_s = torchrun_across(hosts, profile, args.timeout, ranks_per_host=RANKS_PER_HOST)
            print(f"profile {wall_s:.0f} s")
        cluster = load_cluster(str(cluster_path))
        netns_profile.print_matrix(cluster, (0, 1))
        hsdp = layouts(args.micro_batch_size, ZeroStage(args.zero_stage))["hsdp"]
        placed = check_placement(hosts, hsdp, cluster, torch_rank_hosts(hosts, workdir, 120.0))
        print(f"each sharding group on one host: {placed}")
        print(f"{args.model}, global batch {args.global_batch_size}, seq {args.seq_len}, {args.steps} steps a run")
        run_interleaved(hosts, estimate_plans(cluster_path, workdir, args), workdir, args)
    sys.exit(0 if placed else 1)


if __name__ == "__main__":
    main()
