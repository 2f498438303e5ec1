"""Layer split, in-flight micro-batches, bubbles, slots and transfers of the pipeline schedules."""

import pytest
from conftest import make_cluster
from hypothesis import given
from hypothesis import strategies as st

from cost_models.pipeline import bubble_fraction, bubble_s, micro_batch_slots, pipeline_comm_s
from planner.files.models import load_model
from planner.schemas import DType, Layout, ModelSpec, Schedule, TrainingSpec
from planner.schemas.geometry import chunk_layers, in_flight_micro_batches, stage_layers

MODEL = ModelSpec(hidden_size=64, num_hidden_layers=10, num_attention_heads=4, vocab_size=100)


def layout(
    p: int, *, v: int = 1, schedule: Schedule = Schedule.ONE_F_ONE_B, split: tuple[int, ...] | None = None
) -> Layout:
    sched = Schedule.INTERLEAVED if v > 1 else schedule
    return Layout(
        data_parallel_degree=1,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=p,
        micro_batch_size=1,
        schedule=sched,
        virtual_stages=v,
        layer_split=split,
    )


def test_even_split_gives_the_remainder_to_the_middle() -> None:
    assert chunk_layers(MODEL, layout(4)) == (2, 3, 3, 2)
    assert stage_layers(MODEL, layout(2, v=2)) == (5, 5)
    assert stage_layers(MODEL, layout(2, split=(3, 7))) == (3, 7)


def test_one_f_one_b_holds_p_minus_rank() -> None:
    assert [in_flight_micro_batches(layout(4), r, 8) for r in range(4)] == [4, 3, 2, 1]
    assert in_flight_micro_batches(layout(4), 0, 2) == 2
    assert in_flight_micro_batches(layout(4, schedule=Schedule.GPIPE), 3, 8) == 8


@pytest.mark.parametrize(("p", "v"), [(2, 2), (4, 2), (4, 3), (8, 4)])
def test_interleaved_first_stage_matches_korthikanti(p: int, v: int) -> None:
    assert in_flight_micro_batches(layout(p, v=v), 0, 64) == pytest.approx(p * (1 + (p - 1) / (p * v)))


@given(p=st.integers(1, 16), m=st.integers(1, 64), v=st.integers(1, 4))
def test_more_micro_batches_never_raise_the_bubble(p: int, m: int, v: int) -> None:
    if p == 1:
        v = 1
    lay = layout(p, v=v)
    assert bubble_fraction(lay, m + 1) <= bubble_fraction(lay, m)
    assert bubble_fraction(lay, m) == pytest.approx((p - 1) / (v * m))


def test_slots_of_the_critical_path() -> None:
    assert micro_batch_slots(layout(1), 8) == 8
    assert micro_batch_slots(layout(4), 8) == 8 + 3
    assert micro_batch_slots(layout(4, v=2), 8) == 2 * 8 + 3


def test_bubble_seconds_are_the_fraction_of_the_slowest_stages_micro_batches() -> None:
    assert bubble_s(layout(4, v=2), 8, 0.5) == pytest.approx(3 / 16 * 8 * 0.5)


def test_pipeline_transfers_hand_worked() -> None:
    # tiny-gpt, pp 2 on one node (100 GB/s, 1 us): each hop sends one micro-batch's activation,
    # 1 x 128 x 128 x 2 bytes = 32,768 bytes, in 1 us + 0.32768 us. m = 8 micro-batches and one
    # chunk a stage: 2 x 8 x 1 sends plus 2 x (2 - 1) to fill and drain the pipeline.
    tiny = load_model("tiny-gpt")
    training = TrainingSpec(global_batch_size=16, seq_len=128, dtype=DType.BF16)
    two = Layout(data_parallel_degree=2, tensor_parallel_degree=1, pipeline_parallel_degree=2, micro_batch_size=1)
    cluster = make_cluster(per_node=4)
    assert pipeline_comm_s(tiny, training, cluster, two, 8) == pytest.approx(18 * (1e-6 + 32_768 / 100e9))
    flat = Layout(data_parallel_degree=4, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    assert pipeline_comm_s(tiny, training, cluster, flat, 4) == 0.0


def test_a_pipeline_that_leaves_its_node_at_some_boundaries_pays_the_inter_node_hop() -> None:
    # 16 devices, 8 a node; d 2 t 2 puts stage s on devices 4s..4s+3: stages 0-1 share node 0,
    # stages 2-3 node 1, so the hop 1 -> 2 crosses nodes (devices 4 -> 8) and every hop waits for it.
    from cost_models.comm import p2p_time_s
    from planner.files.clusters import load_cluster

    cluster = load_cluster("dgx-h100:2")
    training = TrainingSpec(global_batch_size=16, seq_len=1024)
    spread = Layout(data_parallel_degree=2, tensor_parallel_degree=2, pipeline_parallel_degree=4, micro_batch_size=1)
    m = 8  # micro-batches: 16 / (2 x 1)
    act_bytes = 1 * 1024 * MODEL.hidden_size * training.dtype.bytes / 2
    inter_hop_s = p2p_time_s(act_bytes, 4, 8, cluster)
    assert inter_hop_s > 1.3 * p2p_time_s(act_bytes, 0, 4, cluster)  # the test means something: 48 vs 370 GB/s
    assert pipeline_comm_s(MODEL, training, cluster, spread, m) == pytest.approx((2 * m + 2 * 3) * inter_hop_s)


def test_interleaved_transfers_run_behind_compute_but_fill_and_drain() -> None:
    # dgx-h100:2, d 2 t 2 p 4 v 2, m 8: the hop is the inter-node one (previous test). With the
    # overlap the 2 m v = 32 steady-state hops cost what overlap costs beside m = 8 micro-batches
    # of compute (1 s each, far more than the hops: sigma / (1 + sigma) of them); the 2 (p - 1) = 6
    # that fill and drain are paid in full. Without it, or without virtual stages, all 38 are.
    from cost_models.comm import p2p_time_s
    from cost_models.overlap import OVERLAP_COMPUTE_SLOWDOWN as sigma
    from planner.files.clusters import load_cluster

    cluster = load_cluster("dgx-h100:2")
    training = TrainingSpec(global_batch_size=16, seq_len=1024)
    interleaved = Layout(
        data_parallel_degree=2,
        tensor_parallel_degree=2,
        pipeline_parallel_degree=4,
        micro_batch_size=1,
        schedule=Schedule.INTERLEAVED,
        virtual_stages=2,
    )
    hop_s = p2p_time_s(1 * 1024 * MODEL.hidden_size * training.dtype.bytes / 2, 4, 8, cluster)
    overlapped = pipeline_comm_s(MODEL, training, cluster, interleaved, 8, 1.0)
    assert overlapped == pytest.approx(32 * hop_s * sigma / (1 + sigma) + 6 * hop_s)
    off = training.model_copy(update={"pp_comm_overlap": False})
    assert pipeline_comm_s(MODEL, off, cluster, interleaved, 8, 1.0) == pytest.approx(38 * hop_s)
    # Too little compute to hide behind: the steady-state hops beyond it are exposed.
    assert pipeline_comm_s(MODEL, training, cluster, interleaved, 8, hop_s) == pytest.approx(
        (32 - 8) * hop_s + 6 * hop_s
    )
