"""The dry run traces the MoE model the cost model priced: a Qwen1.5-MoE-A2.7B-shaped model (60
experts 1408 wide beside a dense f of 5632, a gated shared expert 5632 wide, q/k/v biases; 4 of
its 24 layers) traces within 5% of its estimate's tensors. Built with every expert at f and no
shared expert, the same plan traced more than twice its estimate."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_run_cli import _dry

from cost_models.estimate import estimate
from planner.files.clusters import load_cluster
from planner.files.plans import make_plan, save_plan
from planner.schemas import Layout, ModelSpec, TrainingSpec, ZeroStage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

QWEN_MOE_SHAPED = ModelSpec(  # Hugging Face Qwen/Qwen1.5-MoE-A2.7B config.json, 4 layers
    name="qwen1.5-moe-a2.7b-4-layers",
    hidden_size=2048,
    num_hidden_layers=4,
    num_attention_heads=16,
    num_key_value_heads=16,
    intermediate_size=5632,
    moe_intermediate_size=1408,
    shared_expert_intermediate_size=5632,
    num_local_experts=60,
    num_experts_per_tok=4,
    vocab_size=151936,
    hidden_act="silu",
    tie_word_embeddings=False,
    max_position_embeddings=8192,
    rope_theta=1e6,
    qkv_bias=True,
)
TRAINING = TrainingSpec(global_batch_size=16, seq_len=2048)
CLUSTER = "dgx-h100:1"


def test_a_qwen_moe_shaped_plan_traces_within_5_percent_of_its_estimate(tmp_path: Path) -> None:
    layout = Layout(
        data_parallel_degree=8,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        expert_parallel_degree=4,
        zero_stage=ZeroStage.OPTIMIZER,
    )
    cluster = load_cluster(CLUSTER)
    estimated = estimate(QWEN_MOE_SHAPED, TRAINING, cluster, layout)
    path = tmp_path / "plan.json"
    save_plan(make_plan(QWEN_MOE_SHAPED, TRAINING, cluster, CLUSTER, layout, estimated), path)
    memory = estimated.stages[0].memory
    tensors_mib = (memory.total_bytes - memory.workspace_bytes) / 2**20
    assert tensors_mib == pytest.approx(_dry(path, 0), rel=0.05)
