"""A search on two A100 nodes and two H100 nodes finds a plan that beats the best plan of the
homogeneous treatment (every rank priced as an A100): a pipeline whose H100 stage holds more
layers; ``planner explain`` says so, stage by stage."""

import os
import subprocess
import sys
from pathlib import Path

from cost_models.stage_devices import uniformly_slowest
from planner import api
from planner.schemas import TrainingSpec
from planner.schemas.settings import SearchSettings

SPEC = "dgx-a100-80g:2+dgx-h100:2"
TRAINING = TrainingSpec(global_batch_size=256, seq_len=4096)
NARROWED = {"tp": [1], "micro_batch_size": [2], "zero_stage": [1], "recompute": ["none"], "cp": [1]}
"""What the best plans of both treatments share, to keep the two searches short."""


def test_the_mixed_aware_plan_beats_the_best_homogeneous_treatment_plan(tmp_path: Path) -> None:
    cluster = api.load_cluster(SPEC)
    (aware,) = api.search("llama3-8b", cluster, TRAINING, SearchSettings(top_k=1, constraints=NARROWED))
    (homogeneous,) = api.search(
        "llama3-8b", uniformly_slowest(cluster), TRAINING, SearchSettings(top_k=1, constraints=NARROWED)
    )
    assert aware.estimate.step_time_s < 0.8 * homogeneous.estimate.step_time_s
    layout = aware.layout
    assert layout.pipeline_parallel_degree == 2 and layout.layer_split is not None
    assert api.stage_device_names(cluster, layout) == ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")
    assert layout.layer_split[1] > 2 * layout.layer_split[0]  # the H100 stage holds the most layers

    path = tmp_path / "plan.json"
    api.save_plan(aware, path)
    proc = subprocess.run(
        [sys.executable, "-m", "planner", "explain", str(path)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    same_layout = api.homogeneous_estimate("llama3-8b", cluster, TRAINING, layout)
    ratio = same_layout.step_time_s / aware.estimate.step_time_s
    text = " ".join(proc.stdout.split())  # captions wrap
    assert "mixed devices: each stage priced on its own ranks' devices" in text
    assert f"with every rank priced as the NVIDIA A100-SXM4-80GB ({ratio:.3g}x)" in text
    rows = [line for line in proc.stdout.splitlines() if "NVIDIA H100 80GB HBM3 │" in line]
    assert len(rows) == 1 and f"│ {layout.layer_split[1]} │" in rows[0].replace("  ", "")
