"""ZeRO (Rajbhandari et al. SC20): what the data-parallel ranks shard, which collectives that
costs them each step, and which compute hides those collectives.

This is the one module that reads ``Layout.zero_stage``: memory (``cost_models.memory``), stage
times (``cost_models.timing``), data-parallel communication (``cost_models.data_parallel``) and
the optimizer step (``cost_models.optimizer``) ask it. What each stage shards is a property of
``ZeroStage`` (``shards_optimizer_states``, ``shards_gradients``, ``shards_parameters``).

Model states (SC20 sec. 5): stage 1 shards the optimizer states, stage 2 also the gradients,
stage 3 also the weights, over the d cp ranks of the data axis (``Layout.dense_replicas``: the
data-parallel replicas and, under context parallelism, the cp ranks sharing each sequence, which
hold the same weights and whose gradients are summed with theirs; experts over the ranks
holding the same experts, ``Layout.expert_data_parallel_degree``: d / ep, or d t / ep when the
experts are folded over the stage's d t ranks). ZeRO-3 gathers its parameters module by
module: ``ZERO3_GATHERED_UNITS`` = 2 units (the one in use and the next, prefetched), a unit
being the largest module gathered at once on the stage (a transformer layer, the embedding or
the output layer on this rank's tensor-parallel shard), in the precision weights are gathered in
(``Precision.parameter_gather``); as DeepSpeed's estimator, whose 4 x largest_layer_params bytes
is the same term. The dense states of ZeRO-2/3 are counted as FSDP2 (our runtime's ZeRO-2/3,
torchtitan's) holds them: sharded gradients in ``Precision.gradient_accumulation`` (fp32) and,
in mixed precision, no sharded copy of the weights beside the master (``fsdp_model_states``).

Collectives per step (each over the gradients' bytes, summed in ``Precision.gradient_reduce``,
or the parameters' bytes, gathered in ``Precision.parameter_gather``:
``data_parallel.element_bytes``; the ZeRO paper's 2 psi in fp16): without ZeRO one all-reduce,
bucket by bucket during the last micro-batch's backward. ZeRO-1 reduce-scatters the accumulated gradients once and
all-gathers the updated parameters (the same volume), hidden the same way. ZeRO-2 keeps no full
gradient, so it reduce-scatters every micro-batch's gradients during that micro-batch's backward
(as DeepSpeed stage 2 and FSDP with gradient sync do). ZeRO-3 also gathers parameters for every
forward and backward of every micro-batch (3 psi per micro-batch), prefetched behind all of the
compute. ZeRO 2-3 shard module by module (``StageParams.units``), one collective per unit each;
without ZeRO and under ZeRO-1 the collectives run bucket by bucket
(``schemas.buffers.GRAD_BUCKET_ELEMENTS``, PyTorch DDP's 25 MB, Megatron-LM's 40M-parameter
buckets are of the same order). The pieces at the edges of the hiding compute are hidden by none
(``StepCollectives.edges``): the last bucket or unit reduces after the backward that fills it,
the first gather precedes the forward that needs it.
Under a pipeline (``pipeline.defers_gradient_reduction``) ZeRO 2-3 reduce once, after the last
backward, and ZeRO-3 gathers for every backward and for the first forward, m + 1 times; the
single reduction has no backward left to hide behind (``StepCollectives.exposed``), and the
stage holds what ZeRO-1 holds. What the hidden collectives still cost is
``cost_models.overlap``'s.
Units: parameters (elements), bytes, seconds.
"""

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final

from cost_models.compute import measured_sharded_unit_s
from cost_models.params import StageParams
from cost_models.pipeline import defers_gradient_reduction
from planner.schemas import CollectiveOp, DeviceProfile, DType, Layout, ModelSpec, Precision, ZeroStage
from planner.schemas.errors import SchemaError

ZERO3_GATHERED_UNITS: Final = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelStates:
    """Bytes of model states one rank holds (Rajbhandari et al. SC20, sec. 5)."""

    weights_bytes: float
    """Parameters in ``Precision.weights`` (and under ZeRO-3 the gathered units)."""
    gradients_bytes: float
    """Gradients in ``Precision.gradients`` (FSDP2's sharded ones in ``Precision.gradient_accumulation``)."""
    optimizer_states_bytes: float
    """Adam: the master copy (mixed precision only) and two moments (``Precision.optimizer_bytes_per_param``)."""
    gathered_bytes: float = 0.0
    """Of ``weights_bytes``, ZeRO-3's gathered units (``zero3_gather_buffer_bytes``): held only while
    a unit computes, in its forward or its backward, not through the step."""

    @property
    def total_bytes(self) -> float:
        """Sum of the three."""
        return self.weights_bytes + self.gradients_bytes + self.optimizer_states_bytes


def model_state_bytes(params: float, shard_degree: int, zero_stage: ZeroStage, precision: Precision) -> ModelStates:
    """Weights, gradients and Adam states of ``params`` parameters on one rank under ZeRO.

    Source: Rajbhandari et al. (SC20) sec. 5. Per parameter: the weights and gradients in their
    precisions (``Precision.weights``, ``Precision.gradients``) and K bytes of optimizer states
    (``Precision.optimizer_bytes_per_param``: a master copy where there is one, two moments).
    Mixed precision (bf16/fp16): 2 bytes of weights, 2 of gradients and K = 12 (fp32 master
    weights and two fp32 moments); fp32 training: 4, 4 and K = 8 (no master copy). Each term is
    divided by ``shard_degree`` where ``zero_stage`` shards it. The gathered-parameter buffer of
    stage 3 is ``zero3_gather_buffer_bytes``, not included here.

    Args:
        params: parameters this rank holds without ZeRO (elements).
        shard_degree: ranks that share these parameters' states (d, or d / ep for experts).
        zero_stage: what is sharded.
        precision: the weights', gradients' and optimizer states' precisions.

    Returns:
        The three model-state terms, in bytes.
    """
    if shard_degree < 1:
        raise SchemaError(f"shard_degree={shard_degree} must be >= 1")
    d = shard_degree
    optimizer_bytes = precision.optimizer_bytes_per_param * params
    return ModelStates(
        weights_bytes=precision.weights.bytes * params / (d if zero_stage.shards_parameters else 1),
        gradients_bytes=precision.gradients.bytes * params / (d if zero_stage.shards_gradients else 1),
        optimizer_states_bytes=optimizer_bytes / (d if zero_stage.shards_optimizer_states else 1),
    )


def zero3_gather_buffer_bytes(largest_unit_params: float, gather_dtype: DType) -> float:
    """Bytes of the parameters ZeRO-3 gathers at once: 2 units in ``gather_dtype``
    (``Precision.parameter_gather``).

    One unit is in use while the next is prefetched (DeepSpeed ``stage3.py`` estimator:
    4 x largest_layer_params bytes for 2-byte weights; FSDP's default backward prefetch).
    """
    return ZERO3_GATHERED_UNITS * largest_unit_params * gather_dtype.bytes


def gathered_unit_bytes(params: StageParams, precision: Precision) -> float:
    """Bytes of the largest unit ZeRO-3 gathers on a stage holding ``params``, gathered in
    ``Precision.parameter_gather``; under an FP8 weight gather the transformer layers' units in
    FP8 and the embedding's and output layer's in the training precision, as no recipe converts
    them (``runtime.fp8``, torchao's float8 all-gather of Float8Linear weights only)."""
    gather = precision.parameter_gather
    if gather is precision.weights:
        return params.largest_unit * gather.bytes
    return max(params.largest_layer_unit * gather.bytes, params.largest_vocabulary_unit * precision.weights.bytes)


def fsdp_model_states(
    states: ModelStates, params: float, shard_degree: int, zero_stage: ZeroStage, precision: Precision
) -> ModelStates:
    """``states`` (``model_state_bytes`` under ZeRO-2/3) as FSDP2 holds them, the ZeRO-2/3 of
    our runtime and of torchtitan: the sharded gradients in ``Precision.gradient_accumulation``,
    fp32, x params / d (``MixedPrecisionPolicy`` casts the gathered parameters and the reduction
    only; FSDP2's ``FSDPParam`` accumulates each reduced shard into the fp32 shard's gradient; the
    ZeRO paper keeps them in fp16, 2 bytes: DeepSpeed converts each partition to fp32 only for
    the update); under ZeRO-3 in mixed precision (``Precision.mixed``) no sharded copy of the
    weights in ``Precision.weights``: the fp32 shard is the master copy (in the optimizer states)
    and FSDP casts it as it gathers (the gathered units are ``zero3_gather_buffer_bytes``). The
    optimizer states are the ZeRO paper's.
    """
    return ModelStates(
        weights_bytes=0.0 if zero_stage.shards_parameters and precision.mixed else states.weights_bytes,
        gradients_bytes=precision.gradient_accumulation.bytes * params / shard_degree,
        optimizer_states_bytes=states.optimizer_states_bytes,
    )


def held_zero_stage(layout: Layout) -> ZeroStage:
    """The ZeRO stage whose states a rank holds through the step: ZeRO-1's where a pipeline keeps
    ZeRO 2-3's gradients and gathered weights whole (``pipeline.defers_gradient_reduction``),
    else the layout's."""
    return ZeroStage.OPTIMIZER if defers_gradient_reduction(layout) else layout.zero_stage


def stage_model_states(model: ModelSpec, layout: Layout, params: StageParams, precision: Precision) -> ModelStates:
    """Model states of one rank holding ``params``, under the layout's ZeRO stage.

    Dense parameters are sharded over d, experts over d / ep or folded d t / ep
    (``Layout.expert_data_parallel_degree``; ``model_state_bytes`` with
    ``held_zero_stage``; the dense ones as FSDP2 holds them under ZeRO-2/3 with d > 1,
    ``fsdp_model_states``); under ZeRO-3 with d > 1 the weights add the gathered buffer of 2 units
    (``zero3_gather_buffer_bytes``); with d = 1 nothing is sharded or gathered (FSDP then falls
    back to no sharding).

    Args:
        model: the model (whether it has experts).
        layout: degrees and ZeRO stage.
        params: what the rank holds before sharding (``params.stage_params``).
        precision: the model states' and gathered weights' precisions.

    Returns:
        Weights (gathered buffer included), gradients and optimizer states, in bytes.
    """
    edp = layout.expert_data_parallel_degree if model.is_moe else layout.dense_replicas
    secondary = layout.secondary_partition_size
    return _model_states(params, layout.shard_degree, edp, held_zero_stage(layout), precision, secondary)


@functools.lru_cache(maxsize=4096)
def _model_states(
    params: StageParams, d: int, edp: int, zero: ZeroStage, precision: Precision, secondary: int | None = None
) -> ModelStates:
    """``stage_model_states`` of what it reads of the model and layout (memoized on those: the
    layouts of a search that differ in micro-batch, recompute, schedule, ... share it): the dense
    states sharded over ``d`` ranks (the sharding group), ``edp`` ranks hold the same experts,
    and ZeRO-3's weights kept after the forward over a ``secondary`` partition: every unit's
    shard as it is gathered (``Precision.parameter_gather``), held from its forward to its
    backward (ZeRO++ hpZ's secondary copy, FSDP2's ``reshard_after_forward=<int>``)."""
    gather = precision.parameter_gather
    dense = model_state_bytes(params.dense, d, zero, precision)
    if zero.shards_gradients and d > 1:
        dense = fsdp_model_states(dense, params.dense, d, zero, precision)
    expert = model_state_bytes(params.expert, edp, zero, precision)
    gathered = (
        ZERO3_GATHERED_UNITS * gathered_unit_bytes(params, precision) if zero.shards_parameters and d > 1 else 0.0
    )
    secondary_copy = (
        gather.bytes * params.dense / secondary if secondary is not None and zero.shards_parameters else 0.0
    )
    return ModelStates(
        weights_bytes=dense.weights_bytes + expert.weights_bytes + gathered + secondary_copy,
        gradients_bytes=dense.gradients_bytes + expert.gradients_bytes,
        optimizer_states_bytes=dense.optimizer_states_bytes + expert.optimizer_states_bytes,
        gathered_bytes=gathered,
    )


def optimizer_shard_params(params: StageParams, layout: Layout) -> float:
    """Parameters whose optimizer step one rank runs: all it holds, or under ZeRO 1-3 its shard,
    1/d (1/g in sharding groups of g) of the dense parameters and
    1/``Layout.expert_data_parallel_degree`` of the experts' (elements)."""
    sharded = layout.zero_stage.shards_optimizer_states
    shard = layout.shard_degree if sharded else 1
    expert_shard = layout.expert_data_parallel_degree if sharded else 1
    return params.dense / shard + params.expert / expert_shard


def sharded_unit_s(device: DeviceProfile, layout: Layout, weights_dtype: DType) -> float:
    """Seconds FSDP spends of its own on one sharded unit and micro-batch under ZeRO 2-3 with
    d > 1 (hooks, casts, copies, beyond compute and collectives), as the profiler timed it with
    the weights in ``weights_dtype`` (``compute.measured_sharded_unit_s``); 0 without sharded
    units or without the record."""
    if not layout.shards_over_replicas:
        return 0.0
    measured = measured_sharded_unit_s(device, layout.zero_stage, defers_gradient_reduction(layout), weights_dtype)
    return measured or 0.0


class OverlapWindow(StrEnum):
    """The compute behind which a rank's data-parallel collectives run."""

    LAST_BACKWARD = "last_backward"
    """The last micro-batch's backward: bucket by bucket as its gradients are ready."""
    EVERY_BACKWARD = "every_backward"
    """Every micro-batch's backward: each reduces its own gradients."""
    ALL_COMPUTE = "all_compute"
    """Every forward and backward: gathers are prefetched behind the module before."""
    NONE = "none"
    """Nothing: one reduction after the last backward."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Collectives:
    """How many times each collective runs, each over every parameter (or gradient) held."""

    all_reduce: int = 0
    reduce_scatter: int = 0
    all_gather: int = 0

    @property
    def ops(self) -> tuple[CollectiveOp, ...]:
        """The collectives that run at least once."""
        counts = (
            (CollectiveOp.ALL_REDUCE, self.all_reduce),
            (CollectiveOp.REDUCE_SCATTER, self.reduce_scatter),
            (CollectiveOp.ALL_GATHER, self.all_gather),
        )
        return tuple(op for op, count in counts if count)

    def time_s(self, run_s: Mapping[CollectiveOp, float]) -> float:
        """Seconds of all the runs, ``run_s[op]`` each (an op absent from it must not run)."""
        return (
            self.all_reduce * run_s.get(CollectiveOp.ALL_REDUCE, 0.0)
            + self.reduce_scatter * run_s.get(CollectiveOp.REDUCE_SCATTER, 0.0)
            + self.all_gather * run_s.get(CollectiveOp.ALL_GATHER, 0.0)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCollectives:
    """The data-parallel collectives of one rank in one step, and what hides them."""

    per_micro_batch: Collectives
    """Run for every micro-batch."""
    per_step: Collectives
    """Run once a step (counts already multiplied where they depend on the micro-batches)."""
    unit_by_unit: bool
    """Whether each collective runs once per sharded unit (``StageParams.units``) on 1/units of
    the bytes, rather than bucket by bucket (``schemas.buffers.GRAD_BUCKET_ELEMENTS``); each
    piece pays its own latency."""
    window: OverlapWindow
    """The compute that hides ``per_micro_batch`` and ``per_step``."""
    exposed: Collectives = Collectives()
    """Run once a step after the last backward, behind no compute."""
    edges: Collectives = Collectives()
    """Pieces (one unit or bucket each) of the hidden runs at the window's edges, which no compute
    hides: the first gather before the first forward, the last reduction after the last backward."""
    edges_every_micro_batch: bool = False
    """Whether the ``edges`` wait once per micro-batch rather than once a step: ZeRO 2-3 without
    a pipeline reduce (and ZeRO-3 gathers) in every micro-batch, and each backward ends by
    waiting for its last unit's reduce-scatter (PyTorch FSDP's post-backward final callback
    makes the compute stream wait for it: FSDP1 ``_wait_for_post_backward``, FSDP2
    ``FSDPState._root_post_backward_final_callback``) while the next forward's first unit
    waits for its gather, which no earlier compute of that micro-batch hides."""

    @property
    def ops(self) -> tuple[CollectiveOp, ...]:
        """The collectives that run at least once a step."""
        return tuple(dict.fromkeys(self.per_micro_batch.ops + self.per_step.ops + self.exposed.ops))

    def time_s(self, run_s: Mapping[CollectiveOp, float], micro_batches: int) -> float:
        """Seconds of one step's collectives, ``run_s[op]`` each run (over all the bytes).

        Args:
            run_s: seconds of one run of each op in ``ops``, piece by piece.
            micro_batches: micro-batches per step on one replica (m).
        """
        return (
            micro_batches * self.per_micro_batch.time_s(run_s)
            + self.per_step.time_s(run_s)
            + self.exposed.time_s(run_s)
        )

    def unhidden_s(
        self, run_s: Mapping[CollectiveOp, float], piece_s: Mapping[CollectiveOp, float], micro_batches: int
    ) -> float:
        """Seconds of the step's collectives that no compute hides: the ``exposed`` runs and the
        ``edges`` pieces, once a step or once a micro-batch (``edges_every_micro_batch``).

        Args:
            run_s: seconds of one run of each op over all the bytes, piece by piece.
            piece_s: seconds of one piece of each op.
            micro_batches: micro-batches per step on one replica (m).
        """
        edges = micro_batches if self.edges_every_micro_batch else 1
        return self.exposed.time_s(run_s) + edges * self.edges.time_s(piece_s)


WITHOUT_PIPELINE: Final = {
    # One all-reduce of the accumulated gradients, bucket by bucket in the last backward; the
    # last bucket fills when the backward ends.
    ZeroStage.NONE: StepCollectives(
        per_micro_batch=Collectives(),
        per_step=Collectives(all_reduce=1),
        unit_by_unit=False,
        window=OverlapWindow.LAST_BACKWARD,
        edges=Collectives(all_reduce=1),
    ),
    # One reduce-scatter of the accumulated gradients, one all-gather of the updated weights;
    # the last bucket's reduction and the first bucket's gather wait.
    ZeroStage.OPTIMIZER: StepCollectives(
        per_micro_batch=Collectives(),
        per_step=Collectives(reduce_scatter=1, all_gather=1),
        unit_by_unit=False,
        window=OverlapWindow.LAST_BACKWARD,
        edges=Collectives(reduce_scatter=1, all_gather=1),
    ),
    # Every micro-batch's gradients reduce-scattered in its backward; the weights gathered once.
    # Every backward waits for its last unit's reduction.
    ZeroStage.GRADIENTS: StepCollectives(
        per_micro_batch=Collectives(reduce_scatter=1),
        per_step=Collectives(all_gather=1),
        unit_by_unit=True,
        window=OverlapWindow.EVERY_BACKWARD,
        edges=Collectives(reduce_scatter=1),
        edges_every_micro_batch=True,
    ),
    # Weights gathered for every forward and backward, prefetched behind all the compute; every
    # micro-batch waits for its first unit's gather and its last unit's reduction.
    ZeroStage.PARAMETERS: StepCollectives(
        per_micro_batch=Collectives(reduce_scatter=1, all_gather=2),
        per_step=Collectives(),
        unit_by_unit=True,
        window=OverlapWindow.ALL_COMPUTE,
        edges=Collectives(reduce_scatter=1, all_gather=1),
        edges_every_micro_batch=True,
    ),
}
"""What each ZeRO stage runs in a step where no pipeline defers the reduction."""


def step_collectives(layout: Layout, micro_batches: int, flushes: int = 1) -> StepCollectives:
    """What ZeRO runs over the data-parallel group in one step (module docstring):
    ``WITHOUT_PIPELINE``, or under a pipeline that defers ZeRO 2-3's reduction one reduce-scatter
    after the last backward, hidden by nothing, and one all-gather (ZeRO-2) or m + 1, one for
    every backward and one for the first forward, behind all the compute (ZeRO-3). A step run as
    f pipeline schedules (``TrainingSpec.pipeline_flushes``: torchtitan's and AutoModel's FSDP)
    reduces after each schedule's last backward (torch's pipeline stages sync gradients there),
    and ZeRO-3 gathers for each schedule's first forward: f reductions, m + f gathers. ZeRO 0-1
    reduce once a step as without flushes.

    Args:
        layout: ZeRO stage and degrees (whether a pipeline defers the reduction).
        micro_batches: micro-batches per step on one replica (m).
        flushes: pipeline schedules per step (f).

    Returns:
        The collectives per micro-batch and per step, whether unit by unit, and their window.
    """
    zero = layout.zero_stage
    if not defers_gradient_reduction(layout):
        return WITHOUT_PIPELINE[zero]
    if not zero.shards_parameters:
        return StepCollectives(
            per_micro_batch=Collectives(),
            per_step=Collectives(),
            unit_by_unit=True,
            window=OverlapWindow.NONE,
            exposed=Collectives(reduce_scatter=flushes, all_gather=1),
        )
    return StepCollectives(
        per_micro_batch=Collectives(),
        per_step=Collectives(all_gather=micro_batches + flushes),
        unit_by_unit=True,
        window=OverlapWindow.ALL_COMPUTE,
        exposed=Collectives(reduce_scatter=flushes),
        edges=Collectives(all_gather=1),
    )


class ShardGroupKind(StrEnum):
    """Which groups of a stage's data-parallel ranks a collective runs over."""

    SHARDING = "sharding"
    """The ranks that shard the states together: the whole data-parallel group, or a sharding
    group of ``Layout.sharding_group_size`` consecutive ranks."""
    REPLICAS = "replicas"
    """The d / g ranks, one per sharding group, that hold the same shard (HSDP's replicas)."""
    SECONDARY = "secondary"
    """``Layout.secondary_partition_size`` consecutive ranks (hpZ's secondary partition)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupCollectives:
    """What one rank runs over one kind of group in a step, on ``byte_share`` of the bytes."""

    over: ShardGroupKind
    collectives: StepCollectives
    byte_share: float = 1.0
    """Of the parameters' (or gradients') bytes each run moves: 1, or 1/g for the replicas, which
    all-reduce one shard."""


def dense_group_collectives(layout: Layout, micro_batches: int, flushes: int = 1) -> tuple[GroupCollectives, ...]:
    """The dense parameters' collectives of one step (``step_collectives``) split over the groups
    they run on. Sharding in groups of g (HSDP; Zhao et al. 2023, PyTorch FSDP, sec. 3.2.2): ZeRO's
    collectives run within the group, and the accumulated gradient shard (1/g of the bytes) is
    all-reduced across the d / g replicas once a step, unit by unit in the last backward (FSDP2
    with ``set_requires_all_reduce`` off but for the last micro-batch), the last unit's at the
    window's edge; a pipeline's deferred reduction all-reduces after it, exposed. A secondary
    partition (hpZ; Wang et al. 2023, ZeRO++, sec. 3.2): ZeRO-3's backward gathers, one a
    micro-batch, run within it instead; the forward's, and the first of them at the window's
    edge, stay over the sharding group."""
    plan = step_collectives(layout, micro_batches, flushes)
    parts = [GroupCollectives(over=ShardGroupKind.SHARDING, collectives=plan)]
    secondary = layout.secondary_partition_size
    if secondary is not None and layout.zero_stage.shards_parameters and layout.dense_replicas > 1:
        per_micro_batch = plan.per_micro_batch
        sharding = replace(plan, per_micro_batch=replace(per_micro_batch, all_gather=per_micro_batch.all_gather - 1))
        backward = StepCollectives(
            per_micro_batch=Collectives(all_gather=1),
            per_step=Collectives(),
            unit_by_unit=plan.unit_by_unit,
            window=plan.window,
        )
        parts = [
            GroupCollectives(over=ShardGroupKind.SHARDING, collectives=sharding),
            GroupCollectives(over=ShardGroupKind.SECONDARY, collectives=backward),
        ]
    g = layout.sharding_group_size
    if g is not None:
        reduced = plan.per_micro_batch.reduce_scatter or plan.per_step.reduce_scatter
        replicas = StepCollectives(
            per_micro_batch=Collectives(),
            per_step=Collectives(all_reduce=1 if reduced else 0),
            unit_by_unit=plan.unit_by_unit,
            window=plan.window,
            exposed=Collectives(all_reduce=plan.exposed.reduce_scatter),
            edges=Collectives(all_reduce=plan.edges.reduce_scatter),
        )
        parts.append(GroupCollectives(over=ShardGroupKind.REPLICAS, collectives=replicas, byte_share=1 / g))
    return tuple(parts)
