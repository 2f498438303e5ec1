"""The profiler across hosts with uneven links: namespaced hosts (scripts/netns_hosts.py), one
pair rate-limited with htb, one torchrun per host (--nnodes N --node-rank i, rendezvous at host
0's address, one rank each), ``planner profile --quick``; then the measured node matrix, and
whether the slowed pair is its slowest link.

Run (as root, with iproute2): .venv/bin/python benchmarks/netns_profile.py [--hosts 3]
    [--slow 0-1] [--rate-mbit 100] [--output cluster.json]
The shaped rate is a ceiling on bytes on the wire (Ethernet, IP and TCP headers included), so
the profile should read a little below it; unshaped veth pairs run at memory-copy speed, hundreds
of MB/s to GB/s on this machine's 2 shared cores.
"""

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from planner.inputs import load_cluster

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import netns_hosts  # noqa: E402

MASTER_PORT = "29500"
"""Free by construction: host 0's namespace is new, and nothing else listens in it."""


def profile_across(hosts: netns_hosts.NetnsHosts, output: Path, timeout_s: float) -> float:
    """Run ``planner profile --quick`` with one torchrun per host; rank 0 writes ``output``.

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
            f"--master-port={MASTER_PORT}", "--nproc-per-node=1",
            "-m", "planner", "profile", "--quick", "--output", str(output),
        ]  # fmt: skip
        procs.append(hosts.popen(i, argv, env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    failed = [i for i, p in enumerate(procs) if p.returncode != 0]
    if failed:
        shown = "\n".join(f"--- host {i} ---\n{logs[i]}" for i in failed)
        raise SystemExit(f"profiling failed on hosts {failed}:\n{shown}")
    return time.perf_counter() - start


def main() -> None:
    """Print the measured node matrix and whether the slowed pair is the slowest."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--slow", default="0-1", help="the slowed pair, I-J")
    parser.add_argument("--rate-mbit", type=float, default=100.0)
    parser.add_argument("--output", type=Path, default=None, help="keep the profile here")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole profile")
    args = parser.parse_args()
    if reason := netns_hosts.unavailable_reason():
        raise SystemExit(f"netns_profile: {reason}")
    a, b = (int(x) for x in args.slow.split("-"))
    with tempfile.TemporaryDirectory() as tmp, netns_hosts.NetnsHosts(args.hosts, {(a, b): args.rate_mbit}) as hosts:
        output = args.output or Path(tmp) / "cluster.json"
        wall_s = profile_across(hosts, output, args.timeout)
        cluster = load_cluster(str(output))
    links = cluster.inter_node_links
    n = links.size
    limit = f"{args.rate_mbit:g} Mbit/s ({args.rate_mbit / 8:g} MB/s)"
    print(f"{n} hosts, {a}<->{b} limited to {limit}; profile {wall_s:.0f} s")
    print("measured node bandwidth, MB/s (row: sender, column: receiver)")
    print("      " + "".join(f"{j:>10}" for j in range(n)))
    for i in range(n):
        cells = ["-" if i == j else f"{links.link(i, j).bandwidth_bytes_per_s / 1e6:.1f}" for j in range(n)]
        print(f"{i:>6}" + "".join(f"{c:>10}" for c in cells))
    pairs = {(i, j): links.link(i, j).bandwidth_bytes_per_s for i in range(n) for j in range(n) if i != j}
    slowest = min(pairs, key=lambda p: pairs[p])
    slow_pair_slowest = {slowest[0], slowest[1]} == {a, b}
    others = [bw for (i, j), bw in pairs.items() if {i, j} != {a, b}]
    print(f"slowest link: {slowest[0]}->{slowest[1]} at {pairs[slowest] / 1e6:.1f} MB/s")
    if others:
        ratio = min(others) / max(pairs[(a, b)], pairs[(b, a)])
        print(f"fastest slowed direction vs slowest other link: {ratio:.1f}x slower")
    print(f"slowed pair is the slowest: {slow_pair_slowest}")
    sys.exit(0 if slow_pair_slowest else 1)


if __name__ == "__main__":
    main()
