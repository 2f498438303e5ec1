"""The cost model's memory per rank against the runtime's dry-run trace, on the plans the search
chooses: llama3-8b on dgx-h100:2, llama3-70b and mixtral-8x7b on dgx-h100:8, each with a global
batch of 256 sequences of 4096 tokens in bf16 (the search's defaults otherwise). The chosen
plans have no pipeline; a fixed pipelined layout of llama3-8b (dp8 pp2 1F1B ZeRO-1, name
"llama3-8b-pp2") checks a first and a last stage.

For each plan it traces, each in a fresh process (a process sets up the fake process group
once), the first rank of the first and of the last pipeline stage and the last rank of the
world, and prints the traced peak
beside the estimate's terms that tensors hold (the estimate's total without its workspace: the
CUDA context, cuBLAS and NCCL buffers are no tensor a trace sees), their ratio, the estimate's
total with the workspace and the usable memory the search held it to.

Run: .venv/bin/python benchmarks/dry_run_fidelity.py [model ...]
"""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cost_models.estimate import estimate
from planner.api import search_outcome
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.plans import make_plan, save_plan
from planner.schemas import Layout, Plan, TrainingSpec
from planner.schemas.geometry import rank_of

GIB = 2**30
CASES = (("llama3-8b", "dgx-h100:2"), ("llama3-70b", "dgx-h100:8"), ("mixtral-8x7b", "dgx-h100:8"))
PIPELINED = Layout(
    data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=2, micro_batch_size=1, zero_stage=1
)
TRAINING = TrainingSpec(global_batch_size=256, seq_len=4096)
HEADER = (
    f"{'model':<13} {'layout':<44} {'rank':>4} {'stage':>5} {'traced':>7} {'estimate':>8} {'ratio':>5} "
    f"{'+workspace':>10} {'usable':>6}   (GiB = 2^30 bytes; ratio = estimate / traced)"
)
TRACE = """
import json, sys
from planner.api import dry_run
r = dry_run(sys.argv[1], int(sys.argv[2]))
print(json.dumps({"peak": r.peak_bytes, "stage": r.stage, "breakdown": r.breakdown_bytes}))
"""


def traced_ranks(plan: Plan) -> list[int]:
    """The first rank of the first and of the last pipeline stage, and the world's last rank
    (the data-parallel ranks of a stage differ in the whole parameters ZeRO-1 gives each)."""
    layout = plan.layout
    last = layout.pipeline_parallel_degree - 1
    return sorted({rank_of(layout, 0, 0, 0), rank_of(layout, last, 0, 0), plan.cluster.world_size - 1})


def main(models: list[str]) -> None:
    """Search each case, dry-run its ranks, print one row per rank."""
    print(HEADER)
    for name, cluster in (*CASES, ("llama3-8b-pp2", "dgx-h100:2")):
        if models and name not in models:
            continue
        outcome, plans = search_outcome(name.removesuffix("-pp2"), cluster, TRAINING, top_k=1)
        (plan,) = plans
        usable = outcome.usable_memory_bytes
        if name.endswith("-pp2"):
            model, profile = load_model("llama3-8b"), load_cluster(cluster)
            plan = make_plan(
                model, TRAINING, profile, cluster, PIPELINED, estimate(model, TRAINING, profile, PIPELINED)
            )
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "plan.json"
            save_plan(plan, path)
            for rank in traced_ranks(plan):
                print(traced_row(name, plan, path, rank, usable))


def traced_row(name: str, plan: Plan, path: Path, rank: int, usable_bytes: float | None) -> str:
    """Dry-run ``rank`` of ``plan`` (saved at ``path``) in a fresh process; one printed row."""
    start = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-c", TRACE, str(path), str(rank)], capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - start
    if run.returncode != 0:
        reason = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "failed"
        return f"{name:<13} {plan.layout.describe():<44} {rank:>4} not traced: {reason}"
    traced = json.loads(run.stdout.strip().splitlines()[-1])
    memory = plan.estimate.stages[traced["stage"]].memory
    tensors = memory.tensors_bytes
    usable = "" if usable_bytes is None else f"{usable_bytes / GIB:.2f}"
    return (
        f"{name:<13} {plan.layout.describe():<44} {rank:>4} {traced['stage']:>5} "
        f"{traced['peak'] / GIB:>7.2f} {tensors / GIB:>8.2f} {tensors / traced['peak']:>5.3f} "
        f"{memory.total_bytes / GIB:>10.2f} {usable:>6}   {seconds:.0f} s"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
