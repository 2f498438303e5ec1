"""`planner run` runs a plan whose experts are folded (expert tensor parallelism 1 under tp2 with
sequence parallelism) on 4 CPU ranks: it reports losses and the bytes its all-to-alls sent, which
the cost model's folded traffic for the captured routing predicts, and its routing trace holds
every token of every step."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from planner import api
from planner.files.models import load_model
from planner.schemas import Layout, RunReport, TrainingSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import cpu_cluster

STEPS, BATCH, SEQ = 2, 8, 16


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_planner_run_trains_a_folded_plan_and_sends_the_predicted_bytes(tmp_path: Path) -> None:
    cluster = cpu_cluster(4)
    model, training = load_model("tiny-moe"), TrainingSpec(global_batch_size=BATCH, seq_len=SEQ)
    # ep 4 over a stage's dp2 x tp2 ranks: every group mixes replicas and tensor shards
    layout = Layout(
        data_parallel_degree=2,
        tensor_parallel_degree=2,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        expert_parallel_degree=4,
        expert_tensor_parallel_degree=1,
        sequence_parallel=True,
    )
    plan = tmp_path / "plan.json"
    api.save_plan(
        api.make_plan(model, training, cluster, "cpu-test", layout, api.estimate(model, cluster, training, layout)),
        plan,
    )
    trace, report_path = tmp_path / "trace.npz", tmp_path / "r.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", "-m", "planner"]
    cmd += ["run", str(plan), "--steps", str(STEPS), "--report", str(report_path), "--trace-routing", str(trace)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = RunReport.model_validate_json(report_path.read_text())
    assert report.layout.folds_experts and len(report.losses) == STEPS
    with np.load(trace) as f:
        assert f["expert_ids"].shape == (STEPS * BATCH * SEQ, model.num_hidden_layers, model.num_experts_per_tok)
    # each rank routes its own quarter of the tokens: its bytes are the cost model's folded ones
    (predicted,) = api.expert_traffic(plan, trace)
    assert len(report.expert_sent_bytes_per_step) == 4
    assert sum(report.expert_sent_bytes_per_step) / 4 == pytest.approx(predicted, rel=0.10)
