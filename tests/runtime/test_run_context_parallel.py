"""`planner run` runs a context-parallel plan on CPU ranks: every rank's ring attention sends the
key/value bytes the cost model prices, and the all-to-all kind the shares of q, k, v and the
output it prices (within 10%; here exactly, as the cost model counts what
this runtime runs)."""

import subprocess
import sys
from pathlib import Path

import pytest

from cost_models.context_parallel import context_bytes_sent_per_step
from planner import api
from planner.files.models import load_model
from planner.schemas import Layout, RunReport, TrainingSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import cpu_cluster

STEPS, BATCH, SEQ = 3, 4, 256


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("cp", "recompute", "kind"),
    [(2, "none", "ring"), (4, "selective", "ring"), (2, "none", "all-to-all"), (4, "selective", "all-to-all")],
)
def test_planner_run_sends_the_bytes_the_cost_model_prices(tmp_path: Path, cp: int, recompute: str, kind: str) -> None:
    model = load_model("tiny-gpt")
    cluster, training = cpu_cluster(cp), TrainingSpec(global_batch_size=BATCH, seq_len=SEQ, dtype="fp32")
    layout = Layout(
        data_parallel_degree=1,
        context_parallel_degree=cp,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=2,
        recompute=recompute,  # type: ignore[arg-type]
        context_parallel_kind=kind,  # type: ignore[arg-type]
    )
    plan = tmp_path / "plan.json"
    api.save_plan(
        api.make_plan(model, training, cluster, "cpu-test", layout, api.estimate(model, cluster, training, layout)),
        plan,
    )
    report_path = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cp}", "-m", "planner"]
    cmd += ["run", str(plan), "--steps", str(STEPS), "--report", str(report_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = RunReport.model_validate_json(report_path.read_text())
    predicted = context_bytes_sent_per_step(model, training, layout).total_bytes
    assert predicted > 0 and len(report.context_sent_bytes_per_step) == cp
    for measured in report.context_sent_bytes_per_step:
        assert measured == predicted
