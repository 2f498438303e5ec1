"""The search space covers every valid layout and nothing else."""

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models.layout_validity import check_layout
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import (
    DEFAULT_RECOMPUTE_MODULES,
    AttentionKernel,
    ContextParallelKind,
    Recompute,
    RecomputeModule,
    Schedule,
    TrainingSpec,
    ZeroStage,
)
from planner.search_engine.axes import AXES, divisors
from planner.search_engine.space import SearchSpace

TINY = load_model("tiny-gpt")  # 4 heads
RING, A2A = ContextParallelKind.RING, ContextParallelKind.ALL_TO_ALL


def space(world: int, batch: int = 32, per_node: int = 8) -> SearchSpace:
    return SearchSpace(
        model=TINY,
        training=TrainingSpec(global_batch_size=batch, seq_len=64),
        world_size=world,
        devices_per_node=per_node,
    )


def test_divisors() -> None:
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(1) == [1]


@given(world=st.sampled_from([1, 2, 4, 6, 8, 12, 16]), batch=st.sampled_from([8, 12, 32]))
@settings(max_examples=30, deadline=None)
def test_every_candidate_is_a_valid_layout(world: int, batch: int) -> None:
    s = space(world, batch)
    cluster = load_cluster(f"dgx-a100-80g:{1}")
    for layout in s.candidates():
        assert layout.world_size == world
        assert layout.tensor_parallel_degree <= 8 and TINY.num_attention_heads % layout.tensor_parallel_degree == 0
        if world == cluster.world_size:
            check_layout(TINY, s.training, cluster, layout)  # raises if the cost models would refuse it


def test_degrees_are_all_factorizations_within_the_bounds() -> None:
    # tiny-gpt: 4 heads, 4 layers; 8 ranks on one node of 8.
    degree_axes = [a for a in AXES if a.name in {"tp", "pp", "cp", "dp"}]
    assert degree_axes == list(AXES[:4])
    assert {a["cp"] for a in space(8).assignments(degree_axes)} == {1}  # 64 tokens: too short to split
    degrees = [(a["dp"], a["tp"], a["pp"]) for a in space(8).assignments(degree_axes)]
    assert sorted(degrees) == sorted(
        [(8, 1, 1), (4, 1, 2), (2, 1, 4), (4, 2, 1), (2, 2, 2), (1, 2, 4), (2, 4, 1), (1, 4, 2)]
    )


def test_groups_order_recompute_from_none_to_full() -> None:
    for group in space(4).groups():
        assert [(g.recompute, g.recompute_modules) for g in group] == [
            (Recompute.NONE, DEFAULT_RECOMPUTE_MODULES),
            (Recompute.SELECTIVE, (RecomputeModule.CORE_ATTN,)),
            (Recompute.SELECTIVE, (RecomputeModule.CORE_ATTN, RecomputeModule.MLP)),  # a dense model's MLP too
            (Recompute.FULL, DEFAULT_RECOMPUTE_MODULES),
        ]


def test_interleaving_needs_layers_and_divisible_micro_batches() -> None:
    s = space(8)  # batch 32: dp 4 x micro-batch 1 leaves 8 micro-batches
    assert s.choices("schedule", dp=4, pp=2, micro_batch_size=1) == [Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED]
    # tiny-gpt's 4 layers fill 2 x 2 chunks, not 2 x 3.
    assert s.choices("virtual_stages", pp=2, schedule=Schedule.INTERLEAVED) == [2]
    assert s.choices("virtual_stages", pp=2, schedule=Schedule.ONE_F_ONE_B) == [1]
    # 3 micro-batches: pp 2 does not divide them.
    assert space(8, batch=12).choices("schedule", dp=4, pp=2, micro_batch_size=1) == [Schedule.ONE_F_ONE_B]
    assert s.choices("schedule", dp=8, pp=1, micro_batch_size=1) == [Schedule.ONE_F_ONE_B]
    # Fewer micro-batches than stages: no schedule, and no such micro-batch size offered.
    assert s.choices("schedule", dp=4, pp=2, micro_batch_size=8) == []
    assert s.choices("micro_batch_size", dp=4, pp=2) == [1, 2, 4]


def test_each_pipeline_schedule_of_a_step_gets_whole_micro_batches_and_one_per_stage() -> None:
    # batch 32 over dp 4: 8 sequences a replica. In 2 schedules a step, micro-batch 4 leaves one
    # micro-batch a schedule for 2 stages; in 4, micro-batch 2 does.
    def flushed(flushes: int) -> SearchSpace:
        s = space(8)
        return replace(s, training=s.training.model_copy(update={"pipeline_flushes": flushes}))

    assert space(8).choices("micro_batch_size", dp=4, pp=2) == [1, 2, 4]
    assert flushed(2).choices("micro_batch_size", dp=4, pp=2) == [1, 2]
    assert flushed(4).choices("micro_batch_size", dp=4, pp=2) == [1]
    assert flushed(4).choices("micro_batch_size", dp=8, pp=1) == [1, 2, 4]  # no pipeline: nothing to split
    # interleaving needs each schedule's micro-batches divisible by pp: 8 / 2 = 4 over pp 2
    assert Schedule.INTERLEAVED in flushed(2).choices("schedule", dp=4, pp=2, micro_batch_size=1)
    assert flushed(2).choices("schedule", dp=4, pp=2, micro_batch_size=4) == []


def test_only_zero_stages_that_differ_are_searched() -> None:
    s = space(8)
    # One replica shards nothing: every stage would be ZeRO-0.
    assert s.zero_stages_for(1, 4) == (ZeroStage.NONE,)
    # Under a pipeline ZeRO 2-3 hold what ZeRO-1 holds, and take longer.
    assert s.zero_stages_for(2, 4) == (ZeroStage.NONE, ZeroStage.OPTIMIZER)
    assert s.zero_stages_for(8, 1) == tuple(ZeroStage)
    # A user who allows only the deep stages keeps the lowest of them.
    deep = replace(s, zero_stages=(ZeroStage.GRADIENTS, ZeroStage.PARAMETERS))
    assert deep.zero_stages_for(2, 4) == (ZeroStage.GRADIENTS,)
    assert {(c.data_parallel_degree, c.pipeline_parallel_degree, c.zero_stage) for c in s.candidates()} >= {
        (8, 1, ZeroStage.PARAMETERS),
        (4, 2, ZeroStage.OPTIMIZER),
    }
    assert not any(
        c.zero_stage > (ZeroStage.NONE if c.data_parallel_degree == 1 else ZeroStage.OPTIMIZER)
        for c in s.candidates()
        if c.pipeline_parallel_degree > 1 or c.data_parallel_degree == 1
    )


def test_context_parallel_splits_the_sequence_into_two_chunks_a_rank_and_leaves_dp_the_rest() -> None:
    def long(seq_len: int, kernel: AttentionKernel = AttentionKernel.FLASH) -> SearchSpace:
        training = TrainingSpec(global_batch_size=32, seq_len=seq_len, attention_kernel=kernel)
        return replace(space(8), training=training)

    # 8192 tokens: cp 8 would leave each rank 1024 < 2048 (min_context_share_tokens).
    assert long(8192).choices("cp", tp=1, pp=1) == [1, 2, 4]
    assert long(8192).choices("cp", tp=2, pp=2) == [1, 2]
    assert long(8192).choices("dp", tp=2, pp=1, cp=2) == (2,)
    # cp 4 would leave 1536 and 1500 tokens a rank; 2 cp divides both.
    assert long(6144).choices("cp", tp=1, pp=1) == [1, 2]
    assert long(6000).choices("cp", tp=1, pp=1) == [1, 2]
    # A constraint asks for more ranks than the floor allows; still whole chunks.
    assert long(8192).constrained({"cp": {8}}).choices("cp", tp=1, pp=1) == [8]
    # 8190 % 4: the ring cannot cut 2 x 2 equal chunks; the all-to-all's 2 contiguous ones it can.
    assert long(8190).constrained({"cp": {2}}).choices("cp", tp=1, pp=1) == [2]
    assert long(8190).choices("cp_kind", tp=1, cp=2) == [A2A]
    assert long(8190).constrained({"cp": {2}, "cp_kind": {RING}}).choices("cp", tp=1, pp=1) == []
    # Both kinds where both can run, ring first; the all-to-all needs cp to divide a tp rank's 4 heads.
    assert long(8192).choices("cp_kind", tp=1, cp=4) == [RING, A2A]
    assert long(8192).choices("cp_kind", tp=2, cp=4) == [RING]
    assert long(8192).choices("cp_kind", tp=2, cp=1) == [RING]  # no kind without context parallelism
    # Ring attention runs the fused kernel: eager attention leaves the all-to-all (local attention).
    assert long(8192, AttentionKernel.EAGER).choices("cp", tp=1, pp=1) == [1, 2, 4]
    assert long(8192, AttentionKernel.EAGER).choices("cp", tp=4, pp=1) == [1]
    assert long(8192, AttentionKernel.EAGER).choices("cp_kind", tp=1, cp=2) == [A2A]
    # ZeRO shards over the data axis, dp x cp: one replica of two context ranks still shards.
    assert long(8192).choices("zero_stage", dp=1, pp=1, cp=2) == tuple(ZeroStage)
    # Sequence parallelism splits each rank's share: 8192 / 4 = 2048 over tp 2.
    assert long(8192).choices("sequence_parallel", tp=2, cp=4, etp=2) == [True, False]
    for layout in long(8192).candidates():
        assert layout.world_size == 8 and 8192 % (2 * layout.context_parallel_degree) == 0
    kinds = {(c.context_parallel_degree, c.context_parallel_kind) for c in long(8192).candidates()}
    assert kinds == {(1, RING), (2, RING), (2, A2A), (4, RING), (4, A2A)}


@given(
    model=st.sampled_from(["tiny-gpt", "mixtral-8x7b"]),
    world=st.sampled_from([4, 8, 16]),
    constrained=st.booleans(),
)
@settings(max_examples=12, deadline=None)
def test_the_walk_lists_each_axis_once_per_dependency_values_and_finds_what_asking_each_time_finds(
    model: str, world: int, constrained: bool
) -> None:
    # ``ChoiceMemo`` reuses an axis's values wherever the axes it depends on recur; asking the
    # rule at every node of the walk must give the same candidates in the same order.
    s = replace(space(world), model=load_model(model))
    if constrained:
        s = s.constrained({"recompute": [Recompute.FULL, Recompute.SELECTIVE], "zero_stage": [ZeroStage.OPTIMIZER]})

    def walk(i: int, chosen: dict) -> list[dict]:
        if i == len(AXES):
            return [chosen]
        return [a for v in AXES[i].choices(s, chosen) for a in walk(i + 1, {**chosen, AXES[i].name: v})]

    asked_each_time = [s.layout(chosen) for chosen in walk(0, {})]
    assert list(s.candidates()) == asked_each_time
    assert s.size() == len(asked_each_time)
