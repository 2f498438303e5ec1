"""What overlapped communication costs the compute it runs behind (cost_models.overlap)."""

from dataclasses import replace

import pytest
from conftest import cpu_cluster
from hypothesis import given
from hypothesis import strategies as st

from cost_models.estimate import estimate
from cost_models.overlap import (
    OVERLAP_COMPUTE_SLOWDOWN,
    hides_communication,
    overlapped_comm_cost_s,
    tensor_parallel_exposed_s,
)
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import Layout, TrainingSpec


def test_a_short_collective_slows_the_compute_beside_it() -> None:
    # 1 s of communication behind 10 s of compute slowed by 25% while it runs: the compute does
    # 0.8 s of work during it, 9.2 s after; the window takes 10.2 s.
    assert overlapped_comm_cost_s(1.0, 10.0, slowdown=0.25) == pytest.approx(0.2)


def test_a_long_collective_outlasts_its_window() -> None:
    # 10 s behind 4 s: the compute is done under it; the window takes the communication's 10 s.
    assert overlapped_comm_cost_s(10.0, 4.0, slowdown=0.25) == pytest.approx(6.0)


def test_free_overlap_is_the_old_rule_and_no_communication_costs_nothing() -> None:
    assert overlapped_comm_cost_s(3.0, 5.0, slowdown=0.0) == 0.0
    assert overlapped_comm_cost_s(7.0, 5.0, slowdown=0.0) == 2.0
    assert overlapped_comm_cost_s(0.0, 5.0) == 0.0


def test_the_published_average_costs_a_sixth_of_what_it_hides() -> None:
    assert overlapped_comm_cost_s(1.0, 100.0) == pytest.approx(0.189 / 1.189)
    assert OVERLAP_COMPUTE_SLOWDOWN == 0.189


@given(
    comm=st.floats(0.0, 100.0),
    window=st.floats(0.0, 100.0),
    slowdown=st.floats(0.0, 1.0),
)
def test_overlap_costs_no_more_than_serial_and_no_less_than_what_overflows(
    comm: float, window: float, slowdown: float
) -> None:
    cost = overlapped_comm_cost_s(comm, window, slowdown)
    assert max(0.0, comm - window) <= cost <= comm + 1e-12


def test_tensor_parallel_collectives_in_chunks_expose_a_reduce_scatter_chunk_and_the_slowdown() -> None:
    # 8 ms of collectives at t = 4 behind 100 ms of GEMMs: 1 ms (8 / (2 x 4)) waits, the other 7 ms
    # slow the GEMMs by 7 x 0.189 / 1.189 = 1.113 ms.
    assert tensor_parallel_exposed_s(8e-3, 100e-3, 4) == pytest.approx(1e-3 + 7e-3 * 0.189 / 1.189)
    # behind 2 ms of GEMMs the 7 ms outlast them by 5 ms
    assert tensor_parallel_exposed_s(8e-3, 2e-3, 4) == pytest.approx(1e-3 + 5e-3)


GPT = load_model("llama3-8b")
TRAINING = TrainingSpec(global_batch_size=64, seq_len=4096)
OVERLAPPED = TRAINING.model_copy(update={"tp_comm_overlap": True})
TP4 = Layout(
    data_parallel_degree=2,
    tensor_parallel_degree=4,
    pipeline_parallel_degree=1,
    micro_batch_size=1,
    sequence_parallel=True,
)


def test_overlap_hides_tensor_parallel_time_on_gpus_with_sequence_parallelism_only() -> None:
    gpu = load_cluster("dgx-h100:1")
    plain = estimate(GPT, TRAINING, gpu, TP4).time
    hidden = estimate(GPT, OVERLAPPED, gpu, TP4).time
    assert 0 < hidden.tensor_parallel_comm_s < 0.5 * plain.tensor_parallel_comm_s
    assert hidden.compute_s == plain.compute_s
    # without sequence parallelism the collectives are all-reduces, which the chunks do not split
    no_sp = replace(TP4, sequence_parallel=False)
    assert estimate(GPT, OVERLAPPED, gpu, no_sp).time == estimate(GPT, TRAINING, gpu, no_sp).time
    # on a CPU nothing runs behind compute
    cpu = cpu_cluster(8)
    assert estimate(GPT, OVERLAPPED, cpu, TP4).time == estimate(GPT, TRAINING, cpu, TP4).time
    assert hides_communication(gpu) and not hides_communication(cpu)


@pytest.mark.parametrize(("recipe", "share"), [("tensorwise", 1.0), ("rowwise", 0.25), ("rowwise-gw-hp", 0.5)])
def test_torch_async_tp_overlaps_only_the_collectives_it_can_fuse_under_each_torchao_recipe(
    recipe: str, share: float
) -> None:
    """torch's micro-pipeline pass fuses a gather only into matmuls that read it and a reduce-scatter
    only with the matmul that writes its input: rowwise quantizes what it gathers and rescales its
    backward GEMMs' outputs, so 3/4 of its collectives stay exposed; with the weight gradient in
    bf16 the gathers, half (``RecipeRun.micro_pipelined_share``)."""
    gpu = load_cluster("dgx-h100:1")
    fp8 = TRAINING.model_copy(update={"stack": "torchtitan", "fp8": recipe})
    plain = estimate(GPT, fp8, gpu, TP4).time.tensor_parallel_comm_s
    overlapped = estimate(GPT, fp8.model_copy(update={"tp_comm_overlap": True}), gpu, TP4).time
    assert fp8.precision.fp8 is not None and fp8.precision.fp8.micro_pipelined_share == share
    assert (1 - share) * plain < overlapped.tensor_parallel_comm_s < (1 - share) * plain + 0.5 * share * plain
