"""What profiling costs as the cluster grows: wall time per phase at 2, 4 and 6 local ranks, the
link phase per round (every pair is measured once, in rounds of disjoint pairs: n - 1 rounds for
even n), and the projection to 1,024 ranks.

Run: .venv/bin/python benchmarks/profile_cost.py [--quick]
The local "cluster" shares 2 cores, so its rounds are slow (gloo latency of milliseconds); the
projection also prices a round on the dgx-a100-80g preset's links (ping-pong of the latency and
bandwidth sizes, warm-up + repeats), which is what a GPU cluster would pay.
"""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from planner.files.clusters import load_cluster
from planner.schemas.settings import ProfileSettings
from profiler.rounds import round_robin


def run(ranks: int, quick_mode: bool) -> tuple[float, dict[str, float]]:
    """Wall time of a whole torchrun profile, and its phases' seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "c.json"
        args = ["--output", str(out)] + (["--quick"] if quick_mode else [])
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
            "-m",
            "planner",
            "profile",
            *args,
        ]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        wall = time.perf_counter() - start
        settings = json.loads(out.read_text())["provenance"]["settings"]
    return wall, {k.removeprefix("seconds_"): v for k, v in settings.items() if k.startswith("seconds_")}


def gpu_round_s(settings: ProfileSettings) -> float:
    """One round's cost on the A100 preset: two directions, two sizes, warm-up + repeats of a ping-pong."""
    link = load_cluster("dgx-a100-80g:2").inter_node_links.link(0, 1)
    barrier_s = 20e-6  # assumption: one NCCL barrier across the job, tens of microseconds
    per_size = [
        2 * link.latency_s + size / link.bandwidth_bytes_per_s + barrier_s
        for size in (settings.latency_bytes, settings.bandwidth_bytes)
    ]
    return 2 * (settings.warmup + settings.repeats) * sum(per_size)


def main() -> None:
    """Print the table and the projection."""
    quick_mode = "--quick" in sys.argv
    settings = ProfileSettings(output=Path("unused"), quick=quick_mode).quickened()
    print(
        f"{'ranks':>5} {'rounds':>6} {'wall s':>7} {'topology':>8} {'links':>6} {'collect.':>8} {'ops':>6} "
        f"{'s/round':>8}"
    )
    per_round = []
    for ranks in (2, 4, 6):
        wall, phases = run(ranks, quick_mode)
        rounds = len(round_robin(ranks))
        per_round.append(phases["links"] / rounds)
        print(
            f"{ranks:>5} {rounds:>6} {wall:>7.1f} {phases['topology']:>8.2f} {phases['links']:>6.2f} "
            f"{phases['collectives']:>8.2f} {phases['ops']:>6.2f} {per_round[-1]:>8.3f}"
        )
    rounds_1024 = len(round_robin(1024))
    print(
        f"links at 1,024 ranks: {rounds_1024} rounds; at this machine's {per_round[-1]:.3f} s/round "
        f"{rounds_1024 * per_round[-1] / 60:.0f} min; on the A100 preset's links {gpu_round_s(settings) * 1e3:.1f} "
        f"ms/round, {rounds_1024 * gpu_round_s(settings):.0f} s"
    )


if __name__ == "__main__":
    main()
