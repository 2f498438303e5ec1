"""torchtitan's per-op selective recompute (``SelectiveRecompute.EVERY_OTHER_MATMUL``): what it
keeps of a layer, what it runs again, hand-worked on Llama 3 8B's shapes."""

import pytest

from cost_models.activations import kept_bytes, layer_activations, rematerialized_bytes
from cost_models.estimate import estimate
from cost_models.layer_work import layer_work
from cost_models.tensor_parallel import recomputed_forward_share
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import (
    AttentionKernel,
    DType,
    Layout,
    Recompute,
    SelectiveRecompute,
    TrainingSpec,
    ZeroStage,
)

LLAMA = load_model("llama3-8b")  # h 4096, 32 query and 8 key/value heads of 128, SwiGLU f 14336
PER_OP = SelectiveRecompute.EVERY_OTHER_MATMUL


def _terms(t: int = 1, *, sp: bool = False, model_name: str = "llama3-8b"):  # type: ignore[no-untyped-def]
    return layer_activations(
        load_model(model_name),
        seq_len=1,
        micro_batch_size=1,
        activation_dtype=DType.BF16,
        tensor_parallel_degree=t,
        sequence_parallel=sp,
        attention_kernel=AttentionKernel.FLASH,
    )


def test_it_keeps_the_input_the_attention_output_and_the_odd_matmuls_outputs() -> None:
    # one token in bf16: input 4096, attention output 4096, q 4096, v 1024, gate 14336, down 4096
    # (the 1st, 3rd, 5th and 7th of q, k, v, output, gate, up, down), and the fp32 log-sum-exp of
    # 32 heads
    terms = _terms()
    kept = 2 * (4096 + 4096 + 4096 + 1024 + 14336 + 4096) + 4 * 32
    assert kept_bytes(terms, Recompute.SELECTIVE, selective=PER_OP) == kept == 63_616
    # about half of what Megatron-Core's core_attn selective keeps, which only FlashAttention's
    # scores already leave out
    assert kept_bytes(terms, Recompute.SELECTIVE) == pytest.approx(2.19 * kept, rel=0.01)
    assert rematerialized_bytes(terms, Recompute.SELECTIVE, selective=PER_OP) == terms.total_bytes - kept
    # full recompute is unchanged by it
    assert kept_bytes(terms, Recompute.FULL, selective=PER_OP) == kept_bytes(terms, Recompute.FULL)


def test_under_tensor_and_sequence_parallelism_it_keeps_the_reduce_scatters_outputs() -> None:
    # t = 2 with sequence parallelism: the input sharded (2048), the attention output, q, v and
    # gate split (2048 + 2048 + 512 + 7168), the down projection's output whole before its
    # reduction (4096), the two reduce-scatters' outputs (2 x 2048), 16 heads' log-sum-exp
    kept = 2 * (2048 + 2048 + 2048 + 512 + 7168 + 4096 + 2 * 2048) + 4 * 16
    assert kept_bytes(_terms(2, sp=True), Recompute.SELECTIVE, selective=PER_OP) == kept == 44_096


def test_moe_layers_keep_what_the_modules_keep() -> None:
    terms = _terms(model_name="mixtral-8x7b")
    assert terms.every_other_matmul_bytes is None
    assert kept_bytes(terms, Recompute.SELECTIVE, selective=PER_OP) == kept_bytes(terms, Recompute.SELECTIVE)


def _layout(t: int = 1, recompute: Recompute = Recompute.SELECTIVE, *, sp: bool = False) -> Layout:
    return Layout(
        data_parallel_degree=8 // t,
        tensor_parallel_degree=t,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        zero_stage=ZeroStage.PARAMETERS,
        recompute=recompute,
        sequence_parallel=sp,
    )


def test_it_runs_the_even_matmuls_again() -> None:
    # k (4096 -> 1024), the output projection (4096 -> 4096) and up (4096 -> 14336): 2 x 4096 x
    # 19456 FLOP a token
    training = TrainingSpec(global_batch_size=8, seq_len=2048, stack="torchtitan")
    work = layer_work(LLAMA, training, _layout())
    assert sum(g.flop for g in work.every_other_gemms) == 2048 * 2 * 4096 * (1024 + 4096 + 14336)
    assert layer_work(load_model("mixtral-8x7b"), training, _layout()).every_other_gemms == ()


def test_its_recompute_costs_more_than_the_attention_cores_and_less_than_the_layers() -> None:
    cluster = load_cluster("dgx-h100:1")
    seconds = {}
    for name, recompute, selective in (
        ("modules", Recompute.SELECTIVE, SelectiveRecompute.MODULES),
        ("per-op", Recompute.SELECTIVE, PER_OP),
        ("full", Recompute.FULL, PER_OP),
    ):
        training = TrainingSpec(global_batch_size=8, seq_len=4096, stack="torchtitan", selective_recompute=selective)
        seconds[name] = estimate(LLAMA, training, cluster, _layout(recompute=recompute)).step_time_s
    assert seconds["modules"] < seconds["per-op"] < seconds["full"]


def test_it_runs_the_all_gathers_again_not_the_reduce_scatters() -> None:
    assert recomputed_forward_share(LLAMA, _layout(2, sp=True), moe=False, selective=PER_OP) == 0.5
    assert recomputed_forward_share(LLAMA, _layout(2), moe=False, selective=PER_OP) == 1.0  # all-reduces
    assert recomputed_forward_share(LLAMA, _layout(2, sp=True), moe=False) == 0.0  # core_attn re-runs none
