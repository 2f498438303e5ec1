"""The precision of each role, derived from the plan's one dtype: bf16, fp16 and fp32 map onto the
roles as the cost models priced them when they read the dtype alone, and the plan stays as it was."""

import dataclasses

import pytest

from planner.schemas import DType, Precision, TrainingSpec, precision_of
from planner.schemas.enums import TRAINING_DTYPES
from planner.schemas.errors import SchemaError
from planner.schemas.training import default_reduce_dtype

REDUCE_CHOICES = [(dtype, reduce) for dtype in TRAINING_DTYPES for reduce in dict.fromkeys((None, DType.FP32, dtype))]
"""Every (dtype, grad_reduce_dtype) a TrainingSpec accepts."""


def test_bf16_is_mixed_with_fp32_masters_moments_and_gradient_sums() -> None:
    p = precision_of(DType.BF16)
    assert (p.weights, p.gradients, p.activations, p.gemm_inputs, p.attention) == (DType.BF16,) * 5
    assert (p.parameter_gather, p.activation_communication) == (DType.BF16, DType.BF16)
    assert p.master_weights is DType.FP32 and p.mixed
    assert p.optimizer_states is DType.FP32 and p.gradient_accumulation is DType.FP32
    assert p.gradient_reduce is DType.FP32
    # 4 master + 2 x 4 moments; 2 weights + 2 gradients beside them (ZeRO paper: 2 + 2 + K = 16)
    assert (p.master_weight_bytes_per_param, p.optimizer_bytes_per_param) == (4, 12)
    assert p.model_state_bytes_per_param == 16


def test_bf16_sums_gradients_in_bf16_when_told() -> None:
    p = precision_of(DType.BF16, DType.BF16)
    assert p.gradient_reduce is DType.BF16
    assert dataclasses.replace(p, gradient_reduce=DType.FP32) == precision_of(DType.BF16)


def test_fp16_sums_gradients_in_fp16_by_default() -> None:
    p = precision_of(DType.FP16)
    assert p.weights is DType.FP16 and p.master_weights is DType.FP32
    assert p.gradient_reduce is DType.FP16
    assert precision_of(DType.FP16, DType.FP32).gradient_reduce is DType.FP32
    assert p.optimizer_bytes_per_param == 12


def test_fp32_has_no_master_copy() -> None:
    p = precision_of(DType.FP32)
    assert p.master_weights is None and not p.mixed
    assert all(
        getattr(p, f.name) is DType.FP32
        for f in dataclasses.fields(p)
        if f.name not in ("master_weights", "fp8", "fp8_experts")
    )
    # two 4-byte moments; 4 weights + 4 gradients (ZeRO paper's fp32 K = 8)
    assert (p.master_weight_bytes_per_param, p.optimizer_bytes_per_param, p.model_state_bytes_per_param) == (0, 8, 16)


@pytest.mark.parametrize(("dtype", "reduce"), REDUCE_CHOICES)
def test_model_states_per_param_are_the_old_formula(dtype: DType, reduce: DType | None) -> None:
    p = precision_of(dtype, reduce)
    old_optimizer = 8 if dtype is DType.FP32 else 12
    assert p.optimizer_bytes_per_param == old_optimizer
    assert p.model_state_bytes_per_param == dtype.bytes + dtype.bytes + old_optimizer
    assert p.mixed is (dtype is not DType.FP32)


@pytest.mark.parametrize(("dtype", "reduce"), REDUCE_CHOICES)
def test_a_training_spec_derives_its_precision(dtype: DType, reduce: DType | None) -> None:
    training = TrainingSpec(global_batch_size=8, seq_len=128, dtype=dtype, grad_reduce_dtype=reduce)
    assert training.precision == precision_of(dtype, reduce)
    assert training.precision is training.precision  # one object per pair: memos keyed on it hit
    assert training.reduce_dtype is training.precision.gradient_reduce
    assert training.reduce_dtype is (reduce or default_reduce_dtype(dtype))
    assert "precision" not in training.model_dump()


def test_a_reduce_precision_other_than_fp32_or_the_dtype_is_refused() -> None:
    with pytest.raises(SchemaError, match="give 'fp32' or 'fp16'"):
        precision_of(DType.FP16, DType.BF16)
    with pytest.raises(SchemaError, match="grad_reduce_dtype='bf16' under dtype='fp16'"):
        TrainingSpec(global_batch_size=8, seq_len=128, dtype=DType.FP16, grad_reduce_dtype=DType.BF16)


def test_a_precision_is_frozen_and_needs_every_role() -> None:
    p = precision_of(DType.BF16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.weights = DType.FP32  # type: ignore[misc]
    with pytest.raises(TypeError):
        Precision(weights=DType.BF16)  # type: ignore[call-arg]
    assert hash(p) == hash(dataclasses.replace(p))


def test_the_run_report_says_what_the_runtime_holds_and_computes_in() -> None:
    # bf16 weights that compute themselves (no autocast), fp32 masters beside them
    assert precision_of(DType.BF16).describe() == (
        "bf16 weights and compute, fp32 master weights and fp32 optimizer states, gradients summed in fp32"
    )
    assert precision_of(DType.FP32).describe() == (
        "fp32 weights and compute and fp32 optimizer states, gradients summed in fp32"
    )
    assert precision_of(DType.BF16, DType.BF16).describe().endswith("gradients summed in bf16")
