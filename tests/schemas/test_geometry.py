"""Layout geometry and the DeviceMap: the rank order stated once, hand-worked, and its properties."""

from dataclasses import replace

import pytest
from conftest import make_cluster
from hypothesis import given
from hypothesis import strategies as st

from cost_models import groups as grp
from cost_models.estimate import estimate
from planner.export.torchrun import node_ranks
from planner.files.models import load_model
from planner.files.plans import make_plan
from planner.schemas import DeviceMap, Layout, TrainingSpec, VocabularyLayout
from planner.schemas.errors import SchemaError
from planner.schemas.geometry import (
    MESH_AXES,
    accounted_split,
    chunk_layer_range,
    chunk_stage,
    context_chunks,
    context_coordinates,
    coordinates,
    holds_embedding,
    holds_output_layer,
    mesh_shape,
    rank_of,
    splits_into_context_chunks,
    stage_chunks,
    vocabulary_rows,
    vocabulary_share,
)


def _layout(d: int, t: int, p: int, **kw: object) -> Layout:
    return Layout(
        data_parallel_degree=d, tensor_parallel_degree=t, pipeline_parallel_degree=p, micro_batch_size=1, **kw
    )  # type: ignore[arg-type]


def test_rank_order_is_pp_dp_tp_with_tp_fastest() -> None:
    layout = _layout(2, 4, 3)
    assert [str(a) for a in MESH_AXES] == ["pp", "dp", "tp"] and mesh_shape(layout) == (3, 2, 4)
    assert rank_of(layout, 0, 0, 3) == 3  # a tensor-parallel group is consecutive
    assert rank_of(layout, 0, 1, 0) == 4  # data-parallel peers are t apart
    assert rank_of(layout, 2, 1, 2) == 2 * 8 + 4 + 2


def test_context_parallel_ranks_sit_between_data_and_tensor() -> None:
    """Megatron-Core's order (tp, cp, dp, pp fastest first): with d 2, cp 2, t 2 a context-parallel
    group is the data-axis ranks 2k, 2k + 1, t apart in rank order, and a replica's two groups
    hold the two halves of the batch."""
    layout = _layout(2, 2, 1, context_parallel_degree=2)
    assert layout.world_size == 8 and layout.dense_replicas == 4 and mesh_shape(layout) == (1, 4, 2)
    assert [tuple(g.devices) for g in grp.context_groups(layout)] == [(0, 2), (4, 6), (1, 3), (5, 7)]
    assert [tuple(g.devices) for g in grp.data_groups(layout)] == [(0, 2, 4, 6), (1, 3, 5, 7)]
    assert [context_coordinates(layout, r) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert layout.describe().startswith("dp2 tp2 pp1 cp2 ")


def test_context_chunks_pair_an_early_chunk_with_a_late_one() -> None:
    # 2 cp chunks: rank r holds r and 2 cp - 1 - r, so each rank's causal work is equal
    assert [context_chunks(4, r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    with pytest.raises(ValueError, match="context_rank=2"):
        context_chunks(2, 2)


def test_a_sequence_splits_into_context_chunks_where_2_cp_divides_it() -> None:
    assert splits_into_context_chunks(8, 2) and splits_into_context_chunks(8, 4) and splits_into_context_chunks(6, 1)
    assert not splits_into_context_chunks(12, 4)  # 12 / 8 chunks
    assert not splits_into_context_chunks(6, 2)  # 6 tokens over 2 ranks, but not in 4 equal chunks
    assert not splits_into_context_chunks(7, 1)


@given(cp=st.integers(1, 8))
def test_context_chunks_cover_the_sequence_once_with_equal_causal_work(cp: int) -> None:
    held = [context_chunks(cp, r) for r in range(cp)]
    assert sorted(c for pair in held for c in pair) == list(range(2 * cp))
    # chunk c's queries attend to c + 1/2 chunks' keys on average: every rank's sum is 2 cp
    assert {sum(c + 0.5 for c in pair) for pair in held} == {2 * cp}


@given(p=st.integers(2, 6), v=st.integers(1, 4))
def test_chunk_stage_inverts_stage_chunks(p: int, v: int) -> None:
    layout = _layout(1, 1, p, schedule="interleaved" if v > 1 else "1f1b", virtual_stages=v)
    for stage in range(p):
        assert all(chunk_stage(layout, c) == stage for c in stage_chunks(layout, stage))


@given(d=st.integers(1, 4), t=st.integers(1, 4), p=st.integers(1, 4), cp=st.integers(1, 3), data=st.data())
def test_coordinates_invert_rank_of(d: int, t: int, p: int, cp: int, data: st.DataObject) -> None:
    layout = _layout(d, t, p, context_parallel_degree=cp)
    rank = data.draw(st.integers(0, layout.world_size - 1))
    assert rank_of(layout, *coordinates(layout, rank)) == rank


def test_vocabulary_layers_sit_on_the_first_and_last_chunk() -> None:
    model = load_model("tiny-gpt")
    layout = _layout(1, 1, 2, schedule="interleaved", virtual_stages=2)
    assert stage_chunks(layout, 0) == (0, 2) and stage_chunks(layout, 1) == (1, 3)
    assert holds_embedding(layout, 0) and not holds_embedding(layout, 1)
    assert holds_output_layer(layout, 1) and not holds_output_layer(layout, 0)
    ranges = [chunk_layer_range(model, layout, c) for c in range(4)]
    assert [r.start for r in ranges[1:]] == [r.stop for r in ranges[:-1]]
    assert ranges[-1].stop == model.num_hidden_layers


def test_device_map_is_a_permutation_and_the_identity_has_one_spelling() -> None:
    assert DeviceMap(devices=(0, 1, 2)).is_identity and DeviceMap(devices=(0, 1, 2)) == DeviceMap()
    moved = DeviceMap(devices=(1, 0, 3, 2))
    assert moved.device_of(0) == 1 and moved.node_of(2, devices_per_node=2) == 1
    with pytest.raises(SchemaError, match="exactly once"):
        DeviceMap(devices=(0, 0, 1))
    with pytest.raises(SchemaError, match="one device per rank"):
        _layout(2, 1, 1, device_map=DeviceMap(devices=(1, 0, 2)))


def test_process_groups_follow_the_device_map() -> None:
    swap_nodes = DeviceMap(devices=(2, 3, 0, 1))
    layout = _layout(2, 2, 1, device_map=swap_nodes)
    assert [g.devices for g in grp.tensor_groups(layout)] == [(2, 3), (0, 1)]
    assert [g.devices for g in grp.data_groups(layout)] == [(2, 0), (3, 1)]


def test_a_map_that_splits_tensor_groups_across_nodes_costs_more() -> None:
    """Two nodes of 2 devices, fast inside a node: tp pairs split across nodes pay the slow link."""
    model = load_model("tiny-gpt")
    training = TrainingSpec(global_batch_size=8, seq_len=128)
    cluster = make_cluster(nodes=2, per_node=2, intra_bw=100e9, inter_bw=1e9)
    identity = _layout(2, 2, 1)
    across = replace(identity, device_map=DeviceMap(devices=(0, 2, 1, 3)))
    same = estimate(model, training, cluster, identity).time
    split = estimate(model, training, cluster, across).time
    assert split.tensor_parallel_comm_s > 10 * same.tensor_parallel_comm_s


def test_the_launch_export_says_which_plan_ranks_each_node_runs() -> None:
    model = load_model("tiny-gpt")
    training = TrainingSpec(global_batch_size=8, seq_len=128)
    cluster = make_cluster(nodes=2, per_node=2)
    layout = _layout(2, 2, 1, device_map=DeviceMap(devices=(2, 3, 0, 1)))
    plan = make_plan(model, training, cluster, "test", layout, estimate(model, training, cluster, layout))
    assert node_ranks(plan) == ((2, 3), (0, 1))


@given(d=st.sampled_from([1, 2, 4]), t=st.integers(1, 3), p=st.integers(1, 3), data=st.data())
def test_groups_hold_the_devices_of_their_mesh_coordinates(d: int, t: int, p: int, data: st.DataObject) -> None:
    ep = data.draw(st.sampled_from([e for e in (1, 2, 4) if d % e == 0]))
    devices = tuple(data.draw(st.permutations(range(d * t * p))))
    layout = _layout(d, t, p, expert_parallel_degree=ep, device_map=DeviceMap(devices=devices))

    def at(s: int, r: int, j: int) -> int:
        return devices[rank_of(layout, s, r, j)]

    assert [tuple(g.devices) for g in grp.tensor_groups(layout)] == [
        tuple(at(s, r, j) for j in range(t)) for s in range(p) for r in range(d)
    ]
    assert [tuple(g.devices) for g in grp.data_groups(layout)] == [
        tuple(at(s, r, j) for r in range(d)) for s in range(p) for j in range(t)
    ]
    assert [tuple(g.devices) for g in grp.expert_groups(layout)] == [
        tuple(at(s, g * ep + i, j) for i in range(ep)) for s in range(p) for j in range(t) for g in range(d // ep)
    ]
    assert [tuple(g.devices) for g in grp.expert_data_groups(layout)] == [
        tuple(at(s, g * ep + i, j) for g in range(d // ep)) for s in range(p) for j in range(t) for i in range(ep)
    ]


def test_vocabulary_rows_split_the_vocabulary_over_the_pipeline() -> None:
    split = Layout(
        data_parallel_degree=1,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=3,
        micro_batch_size=1,
        vocabulary_layout=VocabularyLayout.VOCAB_2,
    )
    rows = [vocabulary_rows(10, split, s) for s in range(3)]
    assert rows == [range(0, 4), range(4, 7), range(7, 10)]
    assert [vocabulary_share(split, s) for s in range(3)] == [(1 / 3, 1 / 3)] * 3
    assert not any(holds_output_layer(split, s) for s in range(3))
    pinned = replace(split, vocabulary_layout=VocabularyLayout.PINNED)
    assert vocabulary_rows(10, pinned, 1) == range(10)
    assert [vocabulary_share(pinned, s) for s in range(3)] == [(1.0, 0.0), (0.0, 0.0), (0.0, 1.0)]


@pytest.mark.parametrize("change", [{"pipeline_parallel_degree": 1}, {"schedule": "gpipe"}])
def test_a_vocabulary_split_over_the_pipeline_needs_a_1f1b_pipeline(change: dict[str, object]) -> None:
    fields: dict[str, object] = {
        "data_parallel_degree": 1,
        "tensor_parallel_degree": 1,
        "pipeline_parallel_degree": 2,
        "micro_batch_size": 1,
        "vocabulary_layout": VocabularyLayout.VOCAB_1,
    }
    with pytest.raises(SchemaError, match="vocab-1 splits the vocabulary over the pipeline ranks"):
        Layout(**{**fields, **change})  # type: ignore[arg-type]


def test_megatron_counts_the_embedding_and_the_loss_as_layers() -> None:
    # Megatron-LM's own example: 30 layers, 8 stages, both flags: 32 / 8 = 4 slots a stage.
    assert accounted_split(30, 8) == (3, 4, 4, 4, 4, 4, 4, 3)
    assert accounted_split(31, 8, loss=False) == (3, 4, 4, 4, 4, 4, 4, 4)
    assert accounted_split(32, 8, embedding=False, loss=False) == (4,) * 8
    assert sum(accounted_split(32, 8)) == 32


def test_folded_expert_groups_split_a_stage_in_rank_order() -> None:
    """dp2 tp2 pp2, ep2, experts whole per rank: stage 0 holds ranks 0-3, stage 1 ranks 4-7; the
    expert-parallel groups are consecutive pairs of a stage's ranks (tp rank fastest), the
    expert-data-parallel groups the ranks at the same place of each pair."""
    layout = _layout(2, 2, 2, expert_parallel_degree=2, expert_tensor_parallel_degree=1, sequence_parallel=True)
    assert [tuple(g.devices) for g in grp.expert_groups(layout)] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [tuple(g.devices) for g in grp.expert_data_groups(layout)] == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert [tuple(g.devices) for g in grp.expert_data_groups(layout, 1)] == [(4, 6), (5, 7)]
    # ep 8 with t 4: one group is a stage's 8 ranks, the two replicas of 4 shards (one 8-device node)
    whole = _layout(2, 4, 1, expert_parallel_degree=8, expert_tensor_parallel_degree=1, sequence_parallel=True)
    assert [tuple(g.devices) for g in grp.expert_groups(whole)] == [tuple(range(8))]
    assert [tuple(g.devices) for g in grp.expert_data_groups(whole)] == [(i,) for i in range(8)]


@given(d=st.sampled_from([1, 2, 4]), t=st.sampled_from([2, 4]), p=st.integers(1, 3), data=st.data())
def test_folded_expert_groups_hold_the_devices_of_their_stage_ranks(
    d: int, t: int, p: int, data: st.DataObject
) -> None:
    """Folded: rank (s, r, j) is place (r t + j) mod ep of expert-parallel group (r t + j) // ep of stage s."""
    ep = data.draw(st.sampled_from([e for e in (1, 2, 4, 8) if d * t % e == 0]))
    devices = tuple(data.draw(st.permutations(range(d * t * p))))
    layout = _layout(
        d,
        t,
        p,
        expert_parallel_degree=ep,
        expert_tensor_parallel_degree=1,
        sequence_parallel=True,
        device_map=DeviceMap(devices=devices),
    )
    members: dict[tuple[int, int], list[int]] = {}
    holders: dict[tuple[int, int], list[int]] = {}
    for s in range(p):
        for r in range(d):
            for j in range(t):
                group, place = divmod(r * t + j, ep)
                members.setdefault((s, group), []).append(devices[rank_of(layout, s, r, j)])
                holders.setdefault((s, place), []).append(devices[rank_of(layout, s, r, j)])
    assert [list(g.devices) for g in grp.expert_groups(layout)] == [members[k] for k in sorted(members)]
    assert [list(g.devices) for g in grp.expert_data_groups(layout)] == [holders[k] for k in sorted(holders)]
    assert layout.expert_data_parallel_degree == d * t // ep


def test_expert_tensor_parallel_degree_is_1_or_t() -> None:
    assert _layout(2, 2, 1, expert_tensor_parallel_degree=2) == _layout(2, 2, 1)  # t is the default, one spelling
    assert _layout(2, 1, 1, expert_tensor_parallel_degree=1).expert_tensor_parallel_degree is None
    with pytest.raises(SchemaError, match="must be 1 or tensor_parallel_degree=4"):
        _layout(1, 4, 1, expert_tensor_parallel_degree=2)
    with pytest.raises(SchemaError, match="needs sequence_parallel"):
        _layout(1, 4, 1, expert_tensor_parallel_degree=1)
    with pytest.raises(SchemaError, match="must divide data x tensor_parallel_degree=8"):
        _layout(2, 4, 1, expert_parallel_degree=16, expert_tensor_parallel_degree=1, sequence_parallel=True)
    with pytest.raises(SchemaError, match="must divide data_parallel_degree=2"):
        _layout(2, 4, 1, expert_parallel_degree=4, sequence_parallel=True)
    folded = _layout(2, 4, 1, expert_parallel_degree=8, expert_tensor_parallel_degree=1, sequence_parallel=True)
    assert folded.describe() == "dp2 tp4 pp1 ep8 etp1 mb1 zero0 rc-none sp"
    assert "etp" not in _layout(2, 4, 1, expert_parallel_degree=2, sequence_parallel=True).describe()
