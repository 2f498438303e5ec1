"""The precision gradients are summed in (``TrainingSpec.grad_reduce_dtype``): its default per
training precision, its refusal of a precision no framework sums in, plans written before it, and
the runtime's buckets and the cost model's memory holding the same bytes for it."""

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.testing._internal.distributed.fake_pg import FakeStore

from cost_models.communication_buffers import communication_buffer_bytes
from cost_models.params import stage_params
from planner.files.models import load_model
from planner.schemas import DType, Layout, TrainingSpec
from planner.schemas.errors import SchemaError
from planner.schemas.plan import PLAN_SCHEMA_VERSION, VERSION_12_BEHAVIOURS, upgrade
from runtime.model import TORCH_DTYPES
from runtime.optim import DataParallelOptimizer


def test_gradients_are_summed_in_fp32_under_bf16_and_in_the_training_precision_otherwise() -> None:
    def spec(dtype: DType, reduce: DType | None = None) -> TrainingSpec:
        return TrainingSpec(global_batch_size=8, seq_len=64, dtype=dtype, grad_reduce_dtype=reduce)

    assert spec(DType.BF16).reduce_dtype is DType.FP32  # Megatron-LM under bf16, torchtitan's FSDP
    assert spec(DType.FP16).reduce_dtype is DType.FP16  # Megatron-LM's default under fp16
    assert spec(DType.FP32).reduce_dtype is DType.FP32
    assert spec(DType.BF16, DType.BF16).reduce_dtype is DType.BF16  # --grad-reduce-in-bf16
    assert spec(DType.FP16, DType.FP32).reduce_dtype is DType.FP32
    with pytest.raises(SchemaError, match=r"grad_reduce_dtype='bf16' under dtype='fp16'.*give 'fp32' or 'fp16'"):
        spec(DType.FP16, DType.BF16)
    with pytest.raises(SchemaError, match="grad_reduce_dtype='bf16' under dtype='fp32'"):
        spec(DType.FP32, DType.BF16)


def test_a_version_7_plan_sums_in_its_training_precision_as_it_was_priced() -> None:
    raw = {"schema_version": 7, "training": {"global_batch_size": 8, "seq_len": 64, "dtype": "bf16"}}
    upgraded = upgrade(raw)
    # and on to the current version: a vocabulary split, the pipeline's receive buffers and every other
    # behaviour as they were priced before stacks
    assert upgraded["schema_version"] == PLAN_SCHEMA_VERSION
    expected = {
        **VERSION_12_BEHAVIOURS,
        **raw["training"],  # type: ignore[dict-item]
        "grad_reduce_dtype": "bf16",
        "vocabulary_overlap": True,
        "pipeline_buffers": "per-transfer",
        "loss_method": "fp32-in-place",
        "selective_recompute": "modules",
    }
    assert upgraded["training"] == expected
    fp32 = upgrade({"schema_version": 7, "training": {"global_batch_size": 8, "seq_len": 64, "dtype": "fp32"}})
    assert fp32["training"]["grad_reduce_dtype"] == "fp32"  # type: ignore[index]


@pytest.mark.parametrize(("reduce", "element_bytes"), [(DType.FP32, 4), (DType.BF16, 2)])
def test_the_runtimes_buckets_hold_what_the_cost_model_counts(reduce: DType, element_bytes: int) -> None:
    # tiny-gpt without ZeRO on 2 ranks: every one of its 957,184 gradients goes through the buckets
    # (below their 2 x 25 M elements), in the precision they are summed in.
    model = load_model("tiny-gpt")
    layout = Layout(data_parallel_degree=2, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    training = TrainingSpec(global_batch_size=8, seq_len=64, grad_reduce_dtype=reduce)
    counted = communication_buffer_bytes(model, training, layout, stage_params(model, layout, 0))
    assert counted == element_bytes * 957_184

    params = [nn.Parameter(torch.zeros(957_184, dtype=torch.bfloat16))]
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        world = dist.distributed_c10d._get_default_group()
        held = DataParallelOptimizer("sgd", params, 0.1, world, shard=False, reduce_dtype=TORCH_DTYPES[reduce]).buckets
    finally:
        dist.destroy_process_group()
    assert held.dtype is TORCH_DTYPES[reduce]
    assert held.numel() * held.element_size() == counted
