"""Selective recomputation by module (``Layout.recompute_modules``, Megatron-Core's
--recompute-modules): what each module frees, worked by hand for a small layer, and that adding
modules never keeps more nor re-runs less."""

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models.activations import kept_bytes, layer_activations, rematerialized_bytes
from cost_models.estimate import estimate
from cost_models.expert_parallel import exchanges_per_micro_batch
from cost_models.timing import stage_times
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import (
    DEFAULT_RECOMPUTE_MODULES,
    AttentionKernel,
    DType,
    Layout,
    ModelSpec,
    Recompute,
    RecomputeModule,
    TrainingSpec,
)
from planner.schemas.errors import InfeasibleConfigError, SchemaError
from planner.schemas.layout import check_experts

CORE, NORM, ACT, MLP, MOE = (
    RecomputeModule.CORE_ATTN,
    RecomputeModule.LAYERNORM,
    RecomputeModule.MOE_ACT,
    RecomputeModule.MLP,
    RecomputeModule.MOE,
)
TINY_MOE = load_model("tiny-moe")
# tiny-moe, s 64, b 1, bf16 (2 bytes), t 1, eager attention, no dropout. h 128, a 4 heads of 32,
# 2 kv heads (64 wide), SwiGLU experts f 256, E 4, top-2. Per layer, in bytes:
#   norm inputs 2 x 2*64*128 = 32768; norm outputs (QKV input, router input) 2 x 16384 = 32768
#   attention: QKV input 16384 + Q, K 2*64*(128+64) = 24576 + V 2*64*64 = 8192 + o-proj input 16384 = 65536
#   scores (softmax output): 2 * 4 * 64 * 64 = 32768
#   MoE: router input 16384 + fp32 logits 4*64*4 = 1024; per routed copy (x2): expert input and
#        output 2 x 2*64*128 = 32768, gate, up and their product 3 x 2*64*256 = 98304 -> 262144;
#        the block beyond its input 1024 + 262144 = 263168, of which the activation outputs 2 x 32768
#   dense MLP (moe=False): input 16384 + gate, up, product 98304
TOTAL_MOE = 32768 + 65536 + 32768 + (16384 + 1024 + 262144)
TOTAL_DENSE = 32768 + 65536 + 32768 + (16384 + 98304)


def _terms(moe: bool) -> object:
    return layer_activations(
        TINY_MOE,
        seq_len=64,
        micro_batch_size=1,
        activation_dtype=DType.BF16,
        attention_kernel=AttentionKernel.EAGER,
        moe=moe,
    )


@pytest.mark.parametrize(
    ("modules", "kept"),
    [
        ((CORE,), TOTAL_MOE - 32768),
        ((NORM,), TOTAL_MOE - 32768),
        ((ACT,), TOTAL_MOE - 65536),
        ((CORE, NORM, ACT), TOTAL_MOE - 32768 - 32768 - 65536),
        ((NORM, MOE), TOTAL_MOE - 32768 - 263168),  # the Model Zoo's Qwen3-235B recipe
        ((NORM, ACT, MOE), TOTAL_MOE - 32768 - 263168),  # moe holds moe_act's terms
        ((CORE, NORM, MOE), TOTAL_MOE - 32768 - 32768 - 263168),
        ((MLP,), TOTAL_MOE),  # an MoE layer has no dense MLP
    ],
)
def test_an_moe_layer_keeps_what_its_modules_do_not_rebuild(modules: tuple[RecomputeModule, ...], kept: int) -> None:
    terms = _terms(moe=True)
    assert terms.total_bytes == TOTAL_MOE == 410624  # type: ignore[attr-defined]
    assert kept_bytes(terms, Recompute.SELECTIVE, modules) == kept  # type: ignore[arg-type]
    assert kept_bytes(terms, Recompute.NONE, modules) == TOTAL_MOE  # type: ignore[arg-type]
    assert kept_bytes(terms, Recompute.FULL, modules) == 16384  # type: ignore[arg-type]


def test_a_dense_layer_drops_its_mlp_under_mlp_and_nothing_under_the_moe_modules() -> None:
    terms = _terms(moe=False)
    assert terms.total_bytes == TOTAL_DENSE  # type: ignore[attr-defined]
    assert kept_bytes(terms, Recompute.SELECTIVE, (NORM, MLP)) == TOTAL_DENSE - 32768 - 98304  # type: ignore[arg-type]
    assert kept_bytes(terms, Recompute.SELECTIVE, (ACT, MOE)) == TOTAL_DENSE  # type: ignore[arg-type]


def test_the_rebuilt_working_set_is_the_larger_side_of_the_layer() -> None:
    terms = _terms(moe=True)
    # attention side: scores 32768 + the QKV input 16384; MLP side: the router input 16384 + the block 263168
    assert rematerialized_bytes(terms, Recompute.SELECTIVE, (CORE, NORM, MOE)) == 16384 + 263168  # type: ignore[arg-type]
    assert rematerialized_bytes(terms, Recompute.SELECTIVE, (CORE, NORM)) == 32768 + 16384  # type: ignore[arg-type]
    assert rematerialized_bytes(terms, Recompute.SELECTIVE, DEFAULT_RECOMPUTE_MODULES) == 32768  # type: ignore[arg-type]


MIXED = ModelSpec(  # one dense layer, then MoE layers with a shared expert: every module has terms
    name="mixed-moe",
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=512,
    moe_intermediate_size=128,
    n_shared_experts=1,
    first_k_dense_replace=1,
    vocab_size=1024,
    hidden_act="silu",
    num_local_experts=8,
    num_experts_per_tok=2,
)
CLUSTER = load_cluster("dgx-h100:1")
TRAINING = TrainingSpec(global_batch_size=16, seq_len=1024, attention_kernel=AttentionKernel.EAGER)
BASE = Layout(
    data_parallel_degree=4,
    tensor_parallel_degree=2,
    pipeline_parallel_degree=1,
    expert_parallel_degree=4,
    micro_batch_size=2,
    sequence_parallel=True,
    recompute=Recompute.SELECTIVE,
)
SUBSETS = [s for n in range(1, 6) for s in itertools.combinations((CORE, NORM, ACT, MLP, MOE), n)]


def _priced(modules: tuple[RecomputeModule, ...]) -> tuple[float, float, float]:
    """(activation bytes of the largest rank, recompute seconds, tp + ep seconds) of a micro-batch."""
    layout = replace(BASE, recompute_modules=modules)
    time = stage_times(MIXED, TRAINING, CLUSTER, layout)[0]
    memory = estimate(MIXED, TRAINING, CLUSTER, layout).stages[0].memory
    return memory.activations_bytes, time.recompute_s, time.tensor_parallel_comm_s + time.expert_parallel_comm_s


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(SUBSETS), st.sampled_from(SUBSETS))
def test_more_modules_never_keep_more_nor_rerun_less(
    a: tuple[RecomputeModule, ...], b: tuple[RecomputeModule, ...]
) -> None:
    small, large = a, tuple(sorted({*a, *b}, key=list(RecomputeModule).index))
    kept_small, again_small, comm_small = _priced(small)
    kept_large, again_large, comm_large = _priced(large)
    assert kept_large <= kept_small
    assert again_large >= again_small
    assert comm_large >= comm_small


def test_full_recompute_keeps_least_and_reruns_most() -> None:
    layout = replace(BASE, recompute=Recompute.FULL)
    time = stage_times(MIXED, TRAINING, CLUSTER, layout)[0]
    kept = estimate(MIXED, TRAINING, CLUSTER, layout).stages[0].memory.activations_bytes
    every = _priced((CORE, NORM, ACT, MLP, MOE))
    assert kept <= every[0]
    assert time.recompute_s >= every[1]
    assert time.tensor_parallel_comm_s + time.expert_parallel_comm_s >= every[2]


def test_only_the_moe_block_sends_its_all_to_alls_again() -> None:
    assert exchanges_per_micro_batch(BASE) == 4
    assert exchanges_per_micro_batch(replace(BASE, recompute_modules=(CORE, NORM, ACT))) == 4
    assert exchanges_per_micro_batch(replace(BASE, recompute_modules=(NORM, MOE))) == 6
    assert exchanges_per_micro_batch(replace(BASE, recompute=Recompute.FULL)) == 6


def test_the_modules_are_stored_one_way_and_checked_against_the_model() -> None:
    given_order = replace(BASE, recompute_modules=("moe", "layernorm", "moe"))  # type: ignore[arg-type]
    assert given_order.recompute_modules == (NORM, MOE)
    assert given_order.describe().endswith("rc-selective:layernorm+moe sp")
    assert replace(BASE, recompute=Recompute.FULL, recompute_modules=(MOE,)).recompute_modules == (CORE,)
    with pytest.raises(SchemaError, match="recompute_modules is empty"):
        replace(BASE, recompute_modules=())
    with pytest.raises(SchemaError, match="'attn' is not one of 'core_attn'"):
        replace(BASE, recompute_modules=("attn",))  # type: ignore[arg-type]
    dense = load_model("tiny-gpt")
    plain = Layout(data_parallel_degree=1, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    with pytest.raises(InfeasibleConfigError, match="recompute module moe_act recomputes mixture-of-experts layers"):
        check_experts(dense, replace(plain, recompute=Recompute.SELECTIVE, recompute_modules=(ACT,)))
    with pytest.raises(InfeasibleConfigError, match="recompute module mlp recomputes dense layers"):
        check_experts(TINY_MOE, replace(plain, recompute=Recompute.SELECTIVE, recompute_modules=(MLP,)))
