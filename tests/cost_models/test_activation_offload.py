"""Activation offload (``Layout.activation_offload_layers``): what the first N layers keep for
their backward leaves device memory for the host's, and each micro-batch copies it down and up;
hand-worked on Llama 3 8B on one DGX H100, with the layer's bytes from ``layer_activations``. The
runtime's layer under ``save_on_cpu`` computes the same gradients, and refuses CPU devices."""

from dataclasses import replace

import pytest
import torch

from cost_models.activations import layer_activations
from cost_models.estimate import estimate
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import Layout, Recompute, TrainingSpec, ZeroStage
from planner.schemas.errors import InfeasibleConfigError, SchemaError
from planner.schemas.geometry import num_micro_batches

LLAMA = load_model("llama3-8b")
TINY = load_model("tiny-gpt")
NODE = load_cluster("dgx-h100:1")
TRAINING = TrainingSpec(global_batch_size=16, seq_len=8192)
KEPT = Layout(
    data_parallel_degree=8,
    tensor_parallel_degree=1,
    pipeline_parallel_degree=1,
    micro_batch_size=1,
    zero_stage=ZeroStage.PARAMETERS,
)
OFFLOADED = replace(KEPT, activation_offload_layers=8)
GIB = 2**30


def _layer_bytes(training: TrainingSpec = TRAINING) -> float:
    """What one Llama 3 8B layer keeps for its backward without recompute, one micro-batch."""
    return layer_activations(
        LLAMA,
        seq_len=training.seq_len,
        micro_batch_size=1,
        activation_dtype=training.precision.activations,
        tensor_parallel_degree=1,
        sequence_parallel=False,
        attention_kernel=training.attention_kernel,
    ).total_bytes


def test_the_offloaded_layers_activations_move_from_the_device_to_the_host_by_hand() -> None:
    kept, offloaded = estimate(LLAMA, TRAINING, NODE, KEPT), estimate(LLAMA, TRAINING, NODE, OFFLOADED)
    (before,), (after,) = (s.memory for s in kept.stages), (s.memory for s in offloaded.stages)
    moved = 8 * _layer_bytes()  # about 1.06 GiB a layer at 8,192 tokens
    assert 8.4 * GIB < moved < 8.6 * GIB
    assert before.activations_bytes - after.activations_bytes == pytest.approx(moved)
    assert after.host_bytes == pytest.approx(moved) and before.host_bytes == 0
    for term in ("weights_bytes", "gradients_bytes", "optimizer_states_bytes", "logits_bytes"):
        assert getattr(after, term) == getattr(before, term), term
    assert offloaded.host_memory_per_node_bytes == pytest.approx(8 * moved)  # 8 ranks share a host
    assert offloaded.fits_host and kept.host_memory_per_node_bytes == 0


def test_the_planners_runtime_copies_in_series_and_megatron_behind_the_layers_compute() -> None:
    d2h = NODE.device.device_to_host_bytes_per_s
    h2d = NODE.device.host_to_device_bytes_per_s
    assert d2h and h2d
    m = num_micro_batches(TRAINING.global_batch_size, OFFLOADED)
    serial = estimate(LLAMA, TRAINING, NODE, OFFLOADED).time
    assert serial.activation_offload_s == pytest.approx(m * 8 * _layer_bytes() * (1 / d2h + 1 / h2d))
    megatron = TRAINING.model_copy(update={"stack": "megatron-lm"})
    kept = estimate(LLAMA, megatron, NODE, KEPT).time
    hidden = estimate(LLAMA, megatron, NODE, OFFLOADED).time
    covered_s = hidden.compute_s / m * 8 / LLAMA.num_hidden_layers  # the 8 layers' compute, a micro-batch
    expected = m * (
        max(0.0, 8 * _layer_bytes() / d2h - covered_s / 3) + max(0.0, 8 * _layer_bytes() / h2d - 2 * covered_s / 3)
    )
    assert 0 < hidden.activation_offload_s == pytest.approx(expected)
    assert hidden.activation_offload_s < serial.activation_offload_s
    assert hidden.step_time_s - kept.step_time_s == pytest.approx(hidden.activation_offload_s)


def test_more_layers_offloaded_hold_less_and_take_longer() -> None:
    estimates = [estimate(LLAMA, TRAINING, NODE, replace(KEPT, activation_offload_layers=n)) for n in (0, 4, 16, 31)]
    peaks = [e.peak_memory_bytes for e in estimates]
    times = [e.time.activation_offload_s for e in estimates]
    assert peaks == sorted(peaks, reverse=True) and times == sorted(times) and times[0] == 0


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"activation_offload_layers": -1}, "whole number of layers >= 0"),
        ({"activation_offload_layers": 2, "pipeline_parallel_degree": 2}, "pipeline_parallel_degree=2"),
        ({"activation_offload_layers": 2, "recompute": Recompute.FULL}, "recompute=full"),
        ({"activation_offload_layers": 2, "recompute": Recompute.SELECTIVE}, "recompute=selective"),
    ],
)
def test_a_layout_megatron_core_would_not_offload_is_refused_in_one_line(fields: dict, says: str) -> None:
    with pytest.raises(SchemaError, match=says):
        replace(KEPT, **fields)


def test_offloading_every_layer_or_without_host_facts_is_refused() -> None:
    with pytest.raises(InfeasibleConfigError, match="offload at most 31"):
        estimate(LLAMA, TRAINING, NODE, replace(KEPT, activation_offload_layers=32))
    bare = NODE.model_copy(update={"host": None})
    with pytest.raises(InfeasibleConfigError, match="activation_offload_layers=8 offloads to the host"):
        estimate(LLAMA, TRAINING, bare, OFFLOADED)
    assert "act-offload8" in OFFLOADED.describe()


def test_the_runtime_layer_under_save_on_cpu_computes_the_same_gradients() -> None:
    """The runtime's path (``Block.offload_activations``) on this CPU: the saved tensors take the
    host copy's round trip (a copy here, host and device being one memory) and the gradients are
    the kept layers' exactly."""
    from runtime.model import Decoder, set_activation_offload

    kept, offloaded = Decoder(TINY, seed=0), Decoder(TINY, seed=0)
    set_activation_offload(offloaded, 1)
    assert [b.offload_activations for b in offloaded.layers.values()] == [True] + [False] * (TINY.num_hidden_layers - 1)
    tokens = torch.randint(0, TINY.vocab_size, (2, 16))
    for net in (kept, offloaded):
        net(tokens).float().square().mean().backward()
    for (name, a), (_, b) in zip(kept.named_parameters(), offloaded.named_parameters(), strict=True):
        assert a.grad is not None and b.grad is not None and torch.equal(a.grad, b.grad), name


def test_the_runtime_refuses_it_on_cpu_devices_and_the_dry_run_says_why() -> None:
    from planner.files.plans import make_plan
    from planner.schemas.plan import PlannedLayout
    from planner.schemas.runtime_support import check_runnable
    from runtime.dry_run import dry_run

    training = TrainingSpec(global_batch_size=8, seq_len=64)
    layout = replace(KEPT, activation_offload_layers=1)
    check_runnable(PlannedLayout(TINY, training, layout), cuda=True)
    with pytest.raises(InfeasibleConfigError, match=r"on CPU devices the host is the devices' own memory"):
        check_runnable(PlannedLayout(TINY, training, layout), cuda=False)
    plan = make_plan(TINY, training, NODE, "dgx-h100:1", layout, estimate(TINY, training, NODE, layout))
    with pytest.raises(InfeasibleConfigError, match=r"copies there from a GPU only"):
        dry_run(plan, 0)
