"""Full recompute of some layers per pipeline stage (``Layout.recompute_layers``, Megatron-LM's
block method): at the ends it is the layout without recompute and with full recompute exactly;
between, each recomputed layer trades its kept activations for its recomputation, per stage;
the layout, the runtime and the exports check what they can express."""

from dataclasses import replace

import pytest
import torch
from harness import MID_GPT
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models.activations import kept_bytes, layer_activations
from cost_models.estimate import estimate
from cost_models.params import partially_recomputed
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.plans import make_plan
from planner.schemas import Layout, Recompute, TrainingSpec
from planner.schemas.errors import InfeasibleConfigError, SchemaError
from planner.schemas.geometry import in_flight_micro_batches
from runtime.dry_run import dry_run
from runtime.model import Decoder, loss_fn, set_recompute

LLAMA = load_model("llama3-70b")  # 80 layers: 20 a stage below
CLUSTER = load_cluster("dgx-h100:8")
TRAINING = TrainingSpec(global_batch_size=64, seq_len=4096)
FULL = Layout(
    data_parallel_degree=2,
    tensor_parallel_degree=8,
    pipeline_parallel_degree=4,
    micro_batch_size=1,
    sequence_parallel=True,
    recompute=Recompute.FULL,
)
NONE = replace(FULL, recompute=Recompute.NONE)


def _stages(layout: Layout) -> tuple[list[float], list[float], float]:
    est = estimate(LLAMA, TRAINING, CLUSTER, layout)
    return (
        [s.memory.activations_bytes for s in est.stages],
        [s.compute_per_micro_batch_s for s in est.stages],
        est.step_time_s,
    )


def test_every_layer_or_none_is_full_recompute_or_none_exactly() -> None:
    full, none = estimate(LLAMA, TRAINING, CLUSTER, FULL), estimate(LLAMA, TRAINING, CLUSTER, NONE)
    every = estimate(LLAMA, TRAINING, CLUSTER, replace(FULL, recompute_layers=(20, 20, 20, 20)))
    nothing = estimate(LLAMA, TRAINING, CLUSTER, replace(FULL, recompute_layers=(0, 0, 0, 0)))
    assert (every.step_time_s, every.stages, every.hardware_flops_per_step) == (
        full.step_time_s,
        full.stages,
        full.hardware_flops_per_step,
    )
    assert (nothing.step_time_s, nothing.stages, nothing.hardware_flops_per_step) == (
        none.step_time_s,
        none.stages,
        none.hardware_flops_per_step,
    )


def test_each_recomputed_layer_keeps_its_input_alone_by_hand() -> None:
    """Stage s recomputing r of its 20 layers keeps, per micro-batch in flight, r layer inputs and
    20 - r whole layers (Korthikanti Table 2), beside what it keeps either way; the layer it
    rebuilds in the backward (its first ones run their backward last) adds what it exceeds the
    20 - r layers kept whole by: nothing here."""
    counts = (12, 6, 3, 0)
    partial, _, _ = _stages(replace(FULL, recompute_layers=counts))
    none, _, _ = _stages(NONE)
    terms = layer_activations(
        LLAMA,
        seq_len=TRAINING.seq_len,
        micro_batch_size=1,
        activation_dtype=TRAINING.precision.activations,
        tensor_parallel_degree=8,
        sequence_parallel=True,
        attention_kernel=TRAINING.attention_kernel,
    )
    saved = kept_bytes(terms, Recompute.NONE) - kept_bytes(terms, Recompute.FULL)
    m = TRAINING.global_batch_size // (FULL.data_parallel_degree * FULL.micro_batch_size)
    for stage, r in enumerate(counts):
        in_flight = in_flight_micro_batches(FULL, stage, m, vocabulary_warmup=TRAINING.vocabulary_overlap)
        rebuilt = max(0.0, terms.total_bytes - terms.layer_input_bytes - (20 - r) * terms.total_bytes) if r else 0.0
        assert rebuilt == 0.0
        assert partial[stage] == pytest.approx(none[stage] - r * saved * in_flight + rebuilt, rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(
    counts=st.tuples(*(st.integers(0, 20) for _ in range(4))),
    stage=st.integers(0, 3),
)
def test_recomputing_one_more_layer_costs_time_and_saves_memory_on_its_stage(
    counts: tuple[int, int, int, int], stage: int
) -> None:
    if counts[stage] == 20:
        return
    more = tuple(r + (s == stage) for s, r in enumerate(counts))
    memory, times, step = _stages(replace(FULL, recompute_layers=counts))
    memory_more, times_more, step_more = _stages(replace(FULL, recompute_layers=more))
    assert times_more[stage] > times[stage] and step_more >= step
    assert memory_more[stage] <= memory[stage]
    others = [s for s in range(4) if s != stage]
    assert [times_more[s] for s in others] == [times[s] for s in others]
    assert [memory_more[s] for s in others] == [memory[s] for s in others]


def test_an_moe_stage_recomputes_its_dense_layers_first() -> None:
    deepseek = load_model("deepseek-v3")  # 61 layers, the first 3 dense
    layout = Layout(
        data_parallel_degree=64,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=4,
        expert_parallel_degree=8,
        micro_batch_size=1,
        recompute=Recompute.FULL,
        layer_split=(16, 15, 15, 15),
        recompute_layers=(5, 2, 0, 15),
    )
    assert partially_recomputed(deepseek, layout) == ((3, 2), (0, 2), (0, 0), (0, 15))


@pytest.mark.parametrize(
    ("change", "error", "fragment"),
    [
        ({"recompute": Recompute.SELECTIVE}, SchemaError, "set recompute='full'"),
        ({"recompute_layers": (1, 2)}, SchemaError, "one per pipeline stage"),
        ({"recompute_layers": (1, -1, 0, 0)}, SchemaError, "whole numbers >= 0"),
    ],
)
def test_what_the_layout_refuses(change: dict[str, object], error: type[Exception], fragment: str) -> None:
    fields = {"recompute_layers": (4, 2, 1, 0), **change}
    with pytest.raises(error, match=fragment):
        replace(FULL, **fields)  # type: ignore[arg-type]


def test_interleaved_stages_and_more_layers_than_a_stage_holds_are_refused() -> None:
    with pytest.raises(SchemaError, match="one model chunk"):
        replace(FULL, schedule="interleaved", virtual_stages=2, recompute_layers=(1, 1, 1, 1))  # type: ignore[arg-type]
    with pytest.raises(InfeasibleConfigError, match=r"at most its own layers"):
        estimate(LLAMA, TRAINING, CLUSTER, replace(FULL, recompute_layers=(21, 0, 0, 0)))


@pytest.mark.slow
def test_the_dry_run_traces_what_the_estimate_predicts_per_stage() -> None:
    """Measured: stage 0 recomputing 1 of its 2 layers, estimated 458 MiB of tensors, traced 443;
    every other stage and count within 4%."""
    cluster, training = load_cluster("dgx-h100:1"), TrainingSpec(global_batch_size=32, seq_len=2048)
    base = Layout(
        data_parallel_degree=4,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=2,
        micro_batch_size=2,
        recompute=Recompute.FULL,
    )
    traced = {}
    for counts in [(2, 0), (1, 2), (0, 1)]:
        layout = replace(base, recompute_layers=counts)
        est = estimate(MID_GPT, training, cluster, layout)
        plan = make_plan(MID_GPT, training, cluster, "dgx-h100:1", layout, est)
        for stage, rank in ((0, 0), (1, 4)):  # ranks 0-3 run stage 0, 4-7 stage 1
            memory = est.stages[stage].memory
            traced[counts, stage] = dry_run(plan, rank).peak_bytes
            assert memory.total_bytes - memory.workspace_bytes == pytest.approx(traced[counts, stage], rel=0.05)
    assert traced[(2, 0), 0] < traced[(1, 2), 0] and traced[(1, 2), 1] <= traced[(0, 1), 1] < traced[(2, 0), 1]


def test_the_runtime_recomputes_each_stage_s_first_layers_with_the_same_gradients() -> None:
    model = load_model("tiny-gpt")
    tokens = torch.randint(0, model.vocab_size, (2, 17), generator=torch.Generator().manual_seed(3))

    def gradients(recompute: Recompute, full_layers: int | None) -> tuple[list[bool], dict[str, torch.Tensor]]:
        net = Decoder(model, seed=7)
        set_recompute(net, recompute, full_layers=full_layers)
        loss_fn(net(tokens[:, :-1]), tokens[:, 1:]).backward()  # type: ignore[no-untyped-call]
        flags = [block.recompute_all for block in net.layers.values()]  # type: ignore[union-attr]
        return flags, {name: p.grad.clone() for name, p in net.named_parameters() if p.grad is not None}

    _, kept = gradients(Recompute.NONE, None)
    flags, partial = gradients(Recompute.FULL, 3)
    assert flags == [True, True, True, False]
    for name, grad in kept.items():
        assert torch.allclose(partial[name], grad, atol=1e-6), name


def _plan(counts: tuple[int, ...], base: Layout = FULL) -> object:
    layout = replace(base, recompute_layers=counts)
    return make_plan(LLAMA, TRAINING, CLUSTER, "dgx-h100:8", layout, estimate(LLAMA, TRAINING, CLUSTER, layout))


def test_megatron_runs_the_same_count_on_every_stage_and_the_others_refuse() -> None:
    from planner.export import deepspeed, megatron, torchtitan

    args = megatron.megatron_args(_plan((6, 6, 6, 6)))  # type: ignore[arg-type]
    assert " ".join(args).count("--recompute-granularity full --recompute-method block --recompute-num-layers 6") == 1
    with pytest.raises(InfeasibleConfigError, match="as many layers on every stage"):
        megatron.check(_plan((6, 4, 2, 0)))  # type: ignore[arg-type]
    with pytest.raises(InfeasibleConfigError, match="full recompute of"):
        torchtitan.check(_plan((6, 6, 6, 6)))  # type: ignore[arg-type]
    data_parallel = replace(
        FULL, data_parallel_degree=64, tensor_parallel_degree=1, pipeline_parallel_degree=1, sequence_parallel=False
    )
    with pytest.raises(InfeasibleConfigError, match="full recompute of"):
        deepspeed.check(_plan((40,), data_parallel))  # type: ignore[arg-type]
