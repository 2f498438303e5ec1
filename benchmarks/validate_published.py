"""Predicted vs published TFLOP/s per GPU for every SC21 Table 1 run.

Run: .venv/bin/python benchmarks/validate_published.py
No constant is fitted to these rows: the cluster is the dgx-a100-80g preset built from
published hardware figures (its YAML names each source).
"""

import sys

from sc21 import SC21_TABLE1, predict  # the script's own folder is on sys.path


def main() -> int:
    """Print the comparison table; exit 1 if any row is off by more than 10%."""
    print(
        f"{'model':>6} {'GPUs':>5} {'t':>2} {'p':>3} {'v':>2} {'published':>9} {'predicted':>9} {'error':>7}"
        "  bottleneck"
    )
    worst = 0.0
    for run in SC21_TABLE1:
        layout = run.layout()
        est, predicted = predict(run)
        error = predicted / run.published_tflops_per_gpu - 1
        worst = max(worst, abs(error))
        t = est.time
        shares = {
            "tp": t.tensor_parallel_comm_s,
            "bubble": t.pipeline_bubble_s,
            "dp": t.data_parallel_comm_s,
            "p2p": t.pipeline_comm_s,
            "opt": t.optimizer_s,
        }
        top = max(shares, key=lambda k: shares[k])
        print(
            f"{run.name:>6} {run.gpus:>5} {layout.tensor_parallel_degree:>2} {layout.pipeline_parallel_degree:>3} "
            f"{layout.virtual_stages:>2} {run.published_tflops_per_gpu:>9.0f} {predicted:>9.1f} {error:>+7.1%}  "
            f"compute {(t.compute_s + t.recompute_s) / est.step_time_s:.0%}, "
            f"{top} {shares[top] / est.step_time_s:.0%}, "
            f"mem {est.peak_memory_bytes / 2**30:.1f} GiB"
        )
    print(f"worst error: {worst:.1%} (target 10%)")
    return 0 if worst <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
