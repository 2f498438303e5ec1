"""Dry run of a large plan on this machine: Llama 3 70B on 256 H100s (tp 8, pp 4, dp 8, ZeRO-1,
full recompute, sequence parallel). Traces the first and the last pipeline stage, each in a fresh
process, and prints traced peak beside the cost model's estimate, with the wall time.

Run: .venv/bin/python benchmarks/dry_run_scale.py
"""

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cost_models.estimate import estimate
from planner.inputs import load_cluster, load_model
from planner.plans import make_plan, save_plan
from planner.schemas import Layout, TrainingSpec


def main() -> None:
    """Write the plan, dry-run ranks 0 and 255, print the CLI's tables and wall times."""
    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100:32")
    training = TrainingSpec(global_batch_size=256, seq_len=4096)
    layout = Layout(
        data_parallel_degree=8,
        tensor_parallel_degree=8,
        pipeline_parallel_degree=4,
        micro_batch_size=1,
        zero_stage=1,
        recompute="full",
        sequence_parallel=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        save_plan(
            make_plan(model, training, cluster, "dgx-h100:32", layout, estimate(model, training, cluster, layout)), path
        )
        for rank in (0, 255):
            start = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-m", "planner", "run", str(path), "--dry-run", "--rank", str(rank)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            rows = [line for line in out.splitlines() if line.startswith("│")]
            print(f"{rows[0]}  wall {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
