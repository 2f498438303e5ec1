"""The profiler and the runtime across hosts with uneven links: namespaced hosts
(scripts/netns_hosts.py), one pair rate-limited with htb, one torchrun per host (--nnodes N
--node-rank i, rendezvous at host 0's address, one rank each).

``planner profile --quick`` measures the hosts and the model's layers at the plans' sequence;
the benchmark prints the node matrix and whether the slowed pair is its slowest link. Then
``planner search`` plans a small model on that profile and ``planner run`` runs the plan across
the hosts, and, when the search mapped ranks around the slow pair, the same layout with rank r
on host r: predicted and measured step time of each.

Run (as root, with iproute2): .venv/bin/python benchmarks/netns_profile.py [--hosts 3]
    [--slow 0-1] [--rate-mbit 100] [--output cluster.json | --cluster cluster.json] [--pairs 3]
    [--steps 8 | --steps 0] [--search-args '--tp 2']
The shaped rate is a ceiling on bytes on the wire (Ethernet, IP and TCP headers included), so
the profile should read a little below it; unshaped veth pairs run at memory-copy speed, hundreds
of MB/s to GB/s on this machine's 2 shared cores. About 1.5 min at 100 Mbit/s; at 10 Mbit/s the
profile's 16 MiB collectives over the slow pair make it 5 min.

Measured (tiny-gpt, pp3 mb4, global batch 12, seq 64; 0<->1 at 10 Mbit/s, read 1.2 MB/s; load about
3 on 2 cores): the search maps the stage chain to hosts [1, 2, 0], its boundaries off the slow pair
and the tied embedding's gradient all-reduce (runtime.pipeline.TiedEmbedding) across it. Since the
profile's collective records say which links they ran over (the 3-host curve was measured across
the slow pair and priced every 2-rank group as slow), that all-reduce is priced on its own link
(0.21 s) and the identity's is not. Predicted 0.24 s mapped against 0.59 s identity; measured in 3
alternating pairs 0.45-0.91 s (median 0.58) against 0.56-0.60 s (median 0.59): no gain. The
cost model then summed the tied gradient in bf16 (256 KiB); it now prices it in fp32
(``TrainingSpec.reduce_dtype``), as the runtime sums it and Megatron-LM does under bf16.

Measured again with fp32 pricing (fresh profile, 0<->1 read 1.2 MB/s; load below 2.3): the search
still maps to [0, 2, 1], predicted 0.453 s against the identity's 0.586 s (1.29x); measured in 3
alternating pairs 0.67-1.02 s (median 0.71) against 0.46-0.55 s (median 0.52), and on a second
set of 3 pairs 0.59-0.76 s (median 0.71) against 0.42-0.54 s (median 0.53): the identity is
faster. The identity's 8 one-way 64 KiB pipeline transfers across the slow pair cost about their
price; the mapped plan's one 2-rank all-reduce of 512 KiB across it (priced 0.43 s at the
one-way 1.2 MB/s) costs about 0.65 s: a pair exchanging both ways at once gets about 0.8 MB/s
each way here (sending pure TCP acknowledgements outside the slow class did not change it).
The profile measured each link one way only then.

Since, the profile times each pair's exchange, both ends sending at once
(``LinkMatrix.duplex_bandwidth_bytes_per_s``), which prices a two-member ring; each host runs on
its share of the cores (``netns_hosts``); the profile times the model's layers; and a measured
tensor-parallel layer is moved to other groups by the links' difference
(``cost_models.tensor_parallel``). 4 hosts, tensor parallelism asked for (``--search-args '--tp
2'``), 0<->1 at 10 Mbit/s (read 1.2 MB/s one way, 0.6 MB/s each way at once; the other pairs
0.36-1.4 GB/s one way); profile 655 s; load 1.1-2.4: the search maps dp2 tp2 mb6 to hosts
[2, 1, 0, 3], both tensor groups and both data-parallel groups off the slow pair. Predicted
0.154 s mapped against 2.094 s identity (13.6x); measured in 3 alternating pairs 0.190-0.204 s
(median 0.200) against 2.195-2.209 s (median 2.204): 10.8, 11.6, 11.0x faster, each plan's
measurement 1.30x (mapped) and 1.05x (identity) its prediction. Before each host ran on its own
cores its ranks took every core's threads and both plans ran 2.2-3.0 s; before the layer's
record was moved, both were priced 2.09 s and the search kept the identity.

The same on 3 hosts without ``--search-args`` (profile 312 s; load 1.7-2.8): the search now keeps
the identity, dp1 pp3 mb1, its one slow boundary carrying the pipeline's sends rather than the
tied embedding's two-way all-reduce (which the pair's duplex figure prices at 0.6 MB/s each way).
Measured 0.213-0.231 s (median 0.231), below every plan measured on these hosts before, but
2.5x under its prediction of 0.578 s: the 16 KiB pipeline sends over the shaped pair take less
than latency + bytes / bandwidth from the 4 MiB figure (a token-bucket shaper passes short
bursts faster; not measured here), so small transfers over such a link are priced pessimistically.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import planner
from planner.files.clusters import load_cluster
from planner.files.plans import save_plan
from planner.schemas import ClusterProfile
from planner.schemas.device_map import IDENTITY

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import netns_hosts  # noqa: E402

MASTER_PORT = "29500"
"""Free by construction: host 0's namespace is new, and nothing else listens in it."""


def torchrun_across(
    hosts: netns_hosts.NetnsHosts,
    planner_args: list[str],
    timeout_s: float,
    *,
    ranks_per_host: int = 1,
    program: Sequence[str] = ("-m", "planner"),
) -> float:
    """Run ``planner <planner_args>`` (or torchrun's ``program`` with them) with one torchrun per
    host (``ranks_per_host`` ranks each, torch ranks host by host; rendezvous at host 0's address).

    Returns:
        The wall time in seconds.
    """
    n = hosts.n_hosts
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    procs = []
    for i in range(n):
        argv = [
            sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={n}", f"--node-rank={i}", f"--master-addr={hosts.hosts[0].address}",
            f"--master-port={MASTER_PORT}", f"--nproc-per-node={ranks_per_host}", *program, *planner_args,
        ]  # fmt: skip
        procs.append(hosts.popen(i, argv, env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    failed = [i for i, p in enumerate(procs) if p.returncode != 0]
    if failed:
        shown = "\n".join(f"--- host {i} ---\n{logs[i]}" for i in failed)
        raise SystemExit(f"{' '.join([*program, *planner_args][:3])} failed on hosts {failed}:\n{shown}")
    return time.perf_counter() - start


def print_matrix(cluster: ClusterProfile, slow: tuple[int, int]) -> bool:
    """Print the node matrix; whether the ``slow`` pair is its slowest link."""
    links = cluster.inter_node_links
    n = links.size
    print("measured node bandwidth, MB/s (row: sender, column: receiver)")
    print("      " + "".join(f"{j:>10}" for j in range(n)))
    for i in range(n):
        cells = ["-" if i == j else f"{links.link(i, j).bandwidth_bytes_per_s / 1e6:.1f}" for j in range(n)]
        print(f"{i:>6}" + "".join(f"{c:>10}" for c in cells))
    pairs = {(i, j): links.link(i, j).bandwidth_bytes_per_s for i in range(n) for j in range(n) if i != j}
    slowest = min(pairs, key=lambda p: pairs[p])
    a, b = slow
    others = [bw for (i, j), bw in pairs.items() if {i, j} != {a, b}]
    print(f"slowest link: {slowest[0]}->{slowest[1]} at {pairs[slowest] / 1e6:.1f} MB/s")
    if others:
        ratio = min(others) / max(pairs[(a, b)], pairs[(b, a)])
        print(f"fastest slowed direction vs slowest other link: {ratio:.1f}x slower")
    return {slowest[0], slowest[1]} == {a, b}


def plans_for(cluster_path: Path, workdir: Path, args: argparse.Namespace) -> dict[str, Path]:
    """The searched plan for ``args.model`` on the measured cluster and, when the search mapped
    ranks to devices, the same layout with rank r on host r."""
    searched = workdir / "searched.json"
    search = [sys.executable, "-m", "planner", "search", "--model", args.model, "--cluster", str(cluster_path)]
    search += ["--global-batch-size", str(args.global_batch_size), "--seq-len", str(args.seq_len)]
    search += args.search_args.split()
    subprocess.run([*search, "--output", str(searched)], check=True, capture_output=True, cwd=ROOT)
    plans = {"searched": searched}
    plan = planner.load_plan(searched)
    if not plan.layout.device_map.is_identity:
        layout = replace(plan.layout, device_map=IDENTITY)
        estimate = planner.estimate(plan.model, str(cluster_path), plan.training, layout)
        plans["identity map"] = workdir / "identity.json"
        save_plan(
            plan.model_copy(update={"layout": layout, "estimate": estimate, "runner_up": None}), plans["identity map"]
        )
    return plans


def run_plans(hosts: netns_hosts.NetnsHosts, plans: dict[str, Path], workdir: Path, args: argparse.Namespace) -> None:
    """Run the plans across the hosts in turn, ``args.pairs`` times (a, b, a, b, ...: other work
    on the shared cores moves single runs), and print each run's predicted and measured step time
    (the report's median after the warm-up), then each plan's median and the ratio of the others'
    to the first's."""
    print(f"\n{args.model}, global batch {args.global_batch_size}, seq {args.seq_len}, {args.steps} steps per run")
    head = f"{'run':<5}{'plan':<14}{'layout':<22}{'ranks on hosts':<16}{'predicted s':>12}{'measured s':>12}  load"
    print(head)
    measured: dict[str, list[float]] = {name: [] for name in plans}
    predicted: dict[str, float] = {}
    for run in range(args.pairs):
        for name, path in plans.items():
            report_path = workdir / f"{path.stem}.report.json"
            torchrun_across(
                hosts, ["run", str(path), "--steps", str(args.steps), "--report", str(report_path)], args.timeout
            )
            report = json.loads(report_path.read_text())
            lay = report["layout"]
            shape = f"dp{lay['data_parallel_degree']} tp{lay['tensor_parallel_degree']}"
            shape += f" pp{lay['pipeline_parallel_degree']} mb{lay['micro_batch_size']}"
            devices = lay["device_map"]["devices"] or list(range(report["world_size"]))
            predicted[name] = report["predicted_step_time_s"]
            measured[name].append(report["measured_step_time_s"])
            load = os.getloadavg()[0]
            print(
                f"{run:<5}{name:<14}{shape:<22}{devices!s:<16}"
                f"{predicted[name]:>12.4f}{measured[name][-1]:>12.4f}  {load:.1f}"
            )
    first = next(iter(plans))
    for name in plans:
        median_s = statistics.median(measured[name])
        line = f"{name:<14} predicted {predicted[name]:.4f} s, measured median {median_s:.4f} s"
        if name != first:
            ratios = [m / f for m, f in zip(measured[name], measured[first], strict=True)]
            line += (
                f"; / {first}: predicted {predicted[name] / predicted[first]:.2f}, "
                f"measured {', '.join(f'{r:.2f}' for r in ratios)}"
            )
        print(line)


def main() -> None:
    """Profile, print the node matrix, run the plans; exit 1 when the slowed pair is not the slowest."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--slow", default="0-1", help="the slowed pair, I-J")
    parser.add_argument("--rate-mbit", type=float, default=100.0)
    parser.add_argument("--output", type=Path, default=None, help="keep the profile here")
    parser.add_argument("--cluster", type=Path, default=None, help="reuse this profile of the hosts (no profiling)")
    parser.add_argument("--pairs", type=int, default=1, help="runs of each plan, alternating")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for each torchrun job")
    parser.add_argument("--model", default="tiny-gpt", help="the model whose plans are run")
    parser.add_argument("--global-batch-size", type=int, default=12)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8, help="training steps per plan (0: profile only)")
    parser.add_argument(
        "--search-args", default="", help="more options for planner search, in one string (e.g. '--tp 2')"
    )
    args = parser.parse_args()
    if reason := netns_hosts.unavailable_reason():
        raise SystemExit(f"netns_profile: {reason}")
    a, b = (int(x) for x in args.slow.split("-"))
    with tempfile.TemporaryDirectory() as tmp, netns_hosts.NetnsHosts(args.hosts, {(a, b): args.rate_mbit}) as hosts:
        workdir = Path(tmp)
        limit = f"{args.rate_mbit:g} Mbit/s ({args.rate_mbit / 8:g} MB/s)"
        if args.cluster is not None:
            output = args.cluster
            print(f"{args.hosts} hosts, {a}<->{b} limited to {limit}; profile {output.name} reused")
        else:
            output = args.output or workdir / "cluster.json"
            profile = ["profile", "--quick", "--model", args.model, "--seq-len", str(args.seq_len)]
            wall_s = torchrun_across(hosts, [*profile, "--output", str(output)], args.timeout)
            print(f"{args.hosts} hosts, {a}<->{b} limited to {limit}; profile {wall_s:.0f} s")
        slow_pair_slowest = print_matrix(load_cluster(str(output)), (a, b))
        print(f"slowed pair is the slowest: {slow_pair_slowest}")
        if args.steps:
            run_plans(hosts, plans_for(output, workdir, args), workdir, args)
    sys.exit(0 if slow_pair_slowest else 1)


if __name__ == "__main__":
    main()
