"""Optimizer offload against published runs: device memory saved, and the step time added.

Each row is a run whose source states the model, the GPUs, the layout and the offloaded share of
the optimizer, and what offloading did to device memory or step time (the difference from the
same run without it, so that what the planner prices of the rest of the step does not enter).
Predicted beside published, the ratio, and every assumption stated in the row:

- Megatron-Bridge, docs/training/cpu-offloading.md (PR #3062): Qwen3-30B-A3B, TP 2, PP 2, EP 4 on
  two 8-GPU H100 nodes (d = 4, the distributed optimizer), Megatron-Core's hybrid device
  optimizer: 15.3 GB less device memory a GPU at fraction 1, 3.8 GB per quarter.
- NeMo-RL PR #3628: Qwen3-0.6B on one H100 (Megatron-Core's hybrid device optimizer): peak
  15.24 GiB without, 10.53 GiB at fraction 1; step 0.752 s without, 1.187 s at 0.5 (no
  overlap), 1.678 s at 1 (copies overlapped with the CPU step, which the planner does not price:
  it prices them in series, as without).

Run: ``python benchmarks/published_offload.py``. Prints one table; exits 0 (a report, not a gate).
"""

from dataclasses import dataclass, replace

from cost_models.estimate import estimate
from planner.files.clusters import load_cluster
from planner.files.models import model_from_dict
from planner.schemas import ClusterProfile, Layout, LinkMatrix, ModelSpec, TrainingSpec, ZeroStage

QWEN3_30B_A3B = model_from_dict(  # Hugging Face Qwen/Qwen3-30B-A3B config.json
    {
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "vocab_size": 151936,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "max_position_embeddings": 40960,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "mlp_only_layers": [],
        "decoder_sparse_step": 1,
        "model_type": "qwen3_moe",
    },
    name="qwen3-30b-a3b",
)
QWEN3_0_6B = model_from_dict(  # Hugging Face Qwen/Qwen3-0.6B config.json
    {
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "vocab_size": 151936,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "max_position_embeddings": 40960,
        "model_type": "qwen3",
    },
    name="qwen3-0.6b",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One published figure of an offload and what it is the difference of."""

    source: str
    model: ModelSpec
    cluster: ClusterProfile
    layout: Layout
    training: TrainingSpec
    fraction: float
    published: float
    unit: str
    """"GB" (1e9 bytes) or "GiB" of device memory saved, or "s" added to a step."""
    assumptions: str


def _one_gpu() -> ClusterProfile:
    """One H100 of the preset's node, as a one-GPU job runs on it (its host shared by no other rank)."""
    node = load_cluster("dgx-h100:1")
    links = node.intra_node_links
    one = LinkMatrix(size=1, uniform=links.uniform) if links.uniform is not None else links
    return node.model_copy(update={"devices_per_node": 1, "intra_node_links": one, "collectives": ()})


def _saved(row: Row) -> float:
    kept = estimate(row.model, row.training, row.cluster, row.layout).stages[0].memory
    offloaded = replace(row.layout, optimizer_offload_fraction=row.fraction)
    less = estimate(row.model, row.training, row.cluster, offloaded).stages[0].memory
    return kept.total_bytes - less.total_bytes


def _added_s(row: Row) -> float:
    kept = estimate(row.model, row.training, row.cluster, row.layout)
    offloaded = replace(row.layout, optimizer_offload_fraction=row.fraction)
    return estimate(row.model, row.training, row.cluster, offloaded).step_time_s - kept.step_time_s


def rows() -> list[Row]:
    """The published rows (module docstring)."""
    bridge = Layout(
        data_parallel_degree=4,
        tensor_parallel_degree=2,
        pipeline_parallel_degree=2,
        expert_parallel_degree=4,
        micro_batch_size=1,
        sequence_parallel=True,
        zero_stage=ZeroStage.OPTIMIZER,
        recompute="full",
    )
    megatron = TrainingSpec(global_batch_size=64, seq_len=4096, stack="megatron-bridge")
    bridge_assumed = (
        "batch, sequence and recompute not stated (the saving does not depend on them); Megatron's default "
        "expert tensor parallelism (= TP); Megatron-Core moves the moments, not the fp32 master"
    )
    small = Layout(data_parallel_degree=1, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    nemo = TrainingSpec(global_batch_size=8, seq_len=4096, stack="megatron-lm")
    nemo_assumed = (
        "batch and sequence not stated (the difference does not depend on them); the dgx-h100 preset's host: "
        "55 GB/s copies, CPU AdamW at 10.2e9 parameters a second for the node (a roofline of its memory bandwidth)"
    )
    return [
        Row(source="Megatron-Bridge cpu-offloading.md", model=QWEN3_30B_A3B, cluster=load_cluster("dgx-h100:2"),
            layout=bridge, training=megatron, fraction=1.0, published=15.3, unit="GB", assumptions=bridge_assumed),
        Row(source="Megatron-Bridge cpu-offloading.md", model=QWEN3_30B_A3B, cluster=load_cluster("dgx-h100:2"),
            layout=bridge, training=megatron, fraction=0.25, published=3.8, unit="GB", assumptions=bridge_assumed),
        Row(source="NeMo-RL PR #3628", model=QWEN3_0_6B, cluster=_one_gpu(), layout=small, training=nemo,
            fraction=1.0, published=15.24 - 10.53, unit="GiB", assumptions=nemo_assumed),
        Row(source="NeMo-RL PR #3628", model=QWEN3_0_6B, cluster=_one_gpu(), layout=small, training=nemo,
            fraction=0.5, published=1.187 - 0.752, unit="s", assumptions=nemo_assumed),
        Row(source="NeMo-RL PR #3628", model=QWEN3_0_6B, cluster=_one_gpu(), layout=small, training=nemo,
            fraction=1.0, published=1.678 - 0.752, unit="s", assumptions=nemo_assumed + "; its copies overlapped"),
    ]  # fmt: skip


def predicted(row: Row) -> float:
    """The row's figure as the planner prices it, in the row's unit."""
    if row.unit == "s":
        return _added_s(row)
    return _saved(row) / (1e9 if row.unit == "GB" else 2**30)


def main() -> None:
    print(f"{'source':36} {'model':14} {'fraction':>8} {'published':>10} {'predicted':>10} {'ratio':>6}")
    for row in rows():
        what = predicted(row)
        print(
            f"{row.source:36} {row.model.name:14} {row.fraction:8.2f} {row.published:9.3f}{row.unit[0]:1} "
            f"{what:9.3f}{row.unit[0]:1} {what / row.published:6.2f}"
        )
    print()
    for source in dict.fromkeys(r.source for r in rows()):
        print(f"{source}: {next(r.assumptions for r in rows() if r.source == source)}")


if __name__ == "__main__":
    main()
