"""Dry run of a large plan on this machine: Llama 3 70B on 256 H100s (tp 8, pp 4, dp 8, ZeRO-1,
full recompute, sequence parallel). Traces the first and the last pipeline stage, each in a fresh
process, and prints traced peak beside the cost model's estimate of what tensors hold (as
``dry_run_fidelity.py`` does: without the workspace, which no trace sees), with the wall time.

Run: .venv/bin/python benchmarks/dry_run_scale.py
"""

import tempfile
from pathlib import Path

from dry_run_fidelity import HEADER, traced_row  # the script's folder is on sys.path

from cost_models.estimate import estimate
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.plans import make_plan, save_plan
from planner.schemas import Layout, TrainingSpec


def main() -> None:
    """Write the plan, dry-run ranks 0 and 255, print a row each."""
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
    plan = make_plan(model, training, cluster, "dgx-h100:32", layout, estimate(model, training, cluster, layout))
    print(HEADER)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        save_plan(plan, path)
        for rank in (0, 255):
            print(traced_row("llama3-70b", plan, path, rank, None))


if __name__ == "__main__":
    main()
