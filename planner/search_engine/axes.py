"""The search space's axes, declared once: the axes of a layout, each with its validity rule.

``AXES`` is the only statement of what a search may choose. The exhaustive strategy iterates it
(``SearchSpace.groups``); Optuna samples it, one parameter per axis (``optuna_search``). An axis
offers its choices given the values already chosen for the axes it depends on, so every
combination they produce is a layout the cost models can price (memory fit aside):

- tp divides the query and key/value heads and the MLP width and is at most one node's devices
  (tensor parallelism across nodes is never worth its traffic; raise ``max_tensor_parallel``
  to include it); pp divides what tp leaves of the world and is at most the layer count; cp
  (context parallelism) divides what tp and pp leave, each rank keeping at least
  ``min_context_share_tokens`` of every sequence (whether it pays, at short sequences it does not,
  is the cost model's to say); dp is the rest.
- The kind of context parallelism (cp > 1): the ring, where 2 cp divides the sequence, with the
  fused attention kernel; the all-to-all (DeepSpeed-Ulysses), where cp divides the sequence and a
  tensor-parallel rank's query heads.
- etp (expert tensor parallelism, MoE models only): t, every expert split over the tensor-parallel
  group as attention is, or 1 under t > 1, every expert whole on its rank (MoE parallel folding),
  where sequence parallelism can be on (it then is: each rank routes its own share of the sequence).
- ep (expert parallelism, MoE models only) divides the number of experts and the data axis's
  dp x cp ranks, or with etp 1 under t > 1 the stage's dp x cp x tp ranks.
- The micro-batch size divides the per-replica batch, and a pipeline gets at least pp micro-batches.
- Schedules: 1F1B, and interleaved when pp divides the micro-batch count, with every v whose
  pp x v chunks each get a layer.
- Sequence parallelism needs tp > 1 dividing each rank's share of the sequence (s / cp).
- The vocabulary layers pinned to the first and last stage, or split over the pipeline ranks
  (Vocabulary Parallelism) when there are two or more stages under 1F1B.
- ZeRO stages that can differ (``zero_stages_for``): over one data-axis rank (dp cp = 1) nothing is sharded, so
  only the lowest stage; under a pipeline ZeRO 2-3 hold what ZeRO-1 holds and take longer
  (cost_models.pipeline.defers_gradient_reduction), so none above ZeRO-1.
- Sharding in groups of one node's data-parallel ranks (HSDP) under ZeRO 1-3 without expert
  parallelism, and ZeRO-3's secondary partition over one node's (hpZ) without a pipeline, where
  the group spans more than a node (``Layout.sharding_group_size``, ``secondary_partition_size``).
- Recompute comes last, in increasing order of time (and decreasing memory): the exhaustive
  strategy's pruning relies on it (``groups``), and Optuna tries it in that order instead of
  sampling it. Its values (``RecomputeChoice``) are none, selective of the attention core,
  full, and between the last two, selective of more modules (``DENSE_RECOMPUTE_MODULES``,
  ``MOE_RECOMPUTE_MODULES``: ones of Megatron-Core's ``--recompute-modules`` the runtime
  runs; the others on request): each set
  holds the one before, so each drops at least as much memory and re-runs at least as much as
  the one before (``cost_models.activations.dropped_bytes``), and the order holds.

Constraints (``SearchSpace.constrained``: ``--tp 8``, ``--pp 1-16``, ``--zero-stage 1,3`` ...) narrow
an axis to the values given, before anything is enumerated or sampled; a constraint on tp may
ask for tensor parallelism across nodes.

The layer split starts even; refiners improve it on the finalists (``refiner``). A new axis
is one more ``Axis`` in ``AXES``.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from planner.schemas import (
    DEFAULT_RECOMPUTE_MODULES,
    ContextParallelKind,
    Recompute,
    Schedule,
    VocabularyLayout,
    ZeroStage,
)
from planner.schemas.choices import Choice, RecomputeChoice
from planner.schemas.geometry import splits_for_all_to_all, splits_into_context_chunks
from planner.search_engine.space_inputs import SpaceInputs

Assignment = Mapping[str, Choice]
"""Values chosen so far, by axis name."""


def as_int(chosen: Assignment, name: str) -> int:
    """The value of a whole-number axis."""
    value = chosen[name]
    assert isinstance(value, int), f"axis {name} holds {value!r}"
    return value


def divisors(n: int) -> list[int]:
    """Divisors of n in increasing order."""
    small = [i for i in range(1, int(n**0.5) + 1) if n % i == 0]
    return sorted({*small, *(n // i for i in small)})


@dataclass(frozen=True, slots=True, kw_only=True)
class Axis:
    """One choice a search makes, and which values are valid given the choices before it."""

    name: str
    """Short name (tp, pp, ...): the key in an assignment and the stem of Optuna's parameter names."""
    field: str
    """The Layout field it sets (the recompute axis's ``RecomputeChoice`` also sets ``recompute_modules``)."""
    depends_on: tuple[str, ...] = ()
    """Earlier axes whose values the valid choices depend on; the rule sees only those."""
    rule: Callable[[SpaceInputs, Assignment], Sequence[Choice]]
    """The valid values, in search order, given the space and the values of ``depends_on``."""
    tried_in_full: bool = False
    """A sampling strategy evaluates every valid value of this axis in one trial and keeps the
    fastest that fits, instead of sampling it: for axes whose values are cheap to compare and
    change little else (the vocabulary layout; the sharding groups, which change only the
    data-parallel collectives and the model states)."""

    rule_constrains: bool = False
    """The rule narrows the values to the space's constraint on this axis itself, where it
    applies (the kind of context parallelism: a constraint on it leaves cp 1, whose kind is
    stored as the ring, alone)."""

    def choices(self, space: SpaceInputs, chosen: Assignment) -> Sequence[Choice]:
        """The valid values of this axis once ``chosen`` holds (at least) the axes it depends on,
        narrowed to what the space's constraint on it allows (``SearchSpace.constraints``; a
        recompute mode allows each of its ``RecomputeChoice``s)."""
        valid = self.rule(space, {name: chosen[name] for name in self.depends_on})
        allowed = None if self.rule_constrains else space.allowed(self.name)
        if allowed is None:
            return valid
        return [v for v in valid if v in allowed or (isinstance(v, RecomputeChoice) and v.recompute in allowed)]

    def parameter_name(self, choices: Sequence[Choice]) -> str:
        """The name of a sampler's parameter for this axis offering ``choices``, e.g.
        ``micro_batch_size|1,2,4``.

        Optuna requires one name to always offer the same choices. Naming the choices rather than
        the values of ``depends_on`` meets that too, and lets every context that offers the same
        choices share what the sampler learned: TPE then comes closer to the exhaustive optimum
        in the same trials than with names after the dependencies' values.
        """
        return f"{self.name}|" + ",".join(str(c) for c in choices)


def _tp(space: SpaceInputs, _: Assignment) -> list[int]:
    m = space.model
    asked = space.allowed("tp")  # a constraint may ask for tensor parallelism across nodes
    t_max = space.max_tensor_parallel or max([space.devices_per_node, *(asked or ())])
    return [
        t
        for t in divisors(space.world_size)
        if t <= t_max and not (m.num_attention_heads % t or m.kv_heads % t or any(w % t for w in m.mlp_widths))
    ]


def _pp(space: SpaceInputs, chosen: Assignment) -> list[int]:
    return [p for p in divisors(space.world_size // as_int(chosen, "tp")) if p <= space.model.num_hidden_layers]


def _cp(space: SpaceInputs, chosen: Assignment) -> list[int]:
    """Context-parallel ranks: divide what tp and pp leave of the world, leave each rank at least
    ``min_context_share_tokens`` of every sequence (unless a constraint asks for more ranks), and
    run at least one kind the space allows (``_context_kinds``). Whether it pays is the cost
    model's to say."""
    tp = as_int(chosen, "tp")
    rest = space.world_size // (tp * as_int(chosen, "pp"))
    s = space.training.seq_len
    floor = 1 if space.allowed("cp") else space.min_context_share_tokens
    return [c for c in divisors(rest) if c == 1 or (s // c >= floor and _context_kinds(space, tp, c))]


def _context_kinds(space: SpaceInputs, tp: int, cp: int) -> list[ContextParallelKind]:
    """The kinds of context parallelism that can run cp ranks beside tp, among those the space
    allows: the ring where 2 cp divides the sequence (the zig-zag split,
    ``geometry.splits_into_context_chunks``), with the fused attention kernel it runs block by
    block; the all-to-all where cp divides the sequence and a tensor-parallel rank's query heads
    (``geometry.splits_for_all_to_all``)."""
    s, allowed = space.training.seq_len, space.allowed("cp_kind")
    kinds = []
    if splits_into_context_chunks(s, cp) and space.training.attention_kernel.fused:
        kinds.append(ContextParallelKind.RING)
    if splits_for_all_to_all(s, space.model.num_attention_heads // tp, cp):
        kinds.append(ContextParallelKind.ALL_TO_ALL)
    return [k for k in kinds if allowed is None or k in allowed]


def _cp_kind(space: SpaceInputs, chosen: Assignment) -> list[ContextParallelKind]:
    """Ring without context parallelism (its stored kind, whatever a constraint on the kind
    says); else the kinds ``_context_kinds`` allows."""
    cp = as_int(chosen, "cp")
    if cp == 1:
        return [ContextParallelKind.RING]
    return _context_kinds(space, as_int(chosen, "tp"), cp)


def _dp(space: SpaceInputs, chosen: Assignment) -> tuple[int]:
    return (space.world_size // (as_int(chosen, "tp") * as_int(chosen, "pp") * as_int(chosen, "cp")),)


def _local_seq_len(space: SpaceInputs, chosen: Assignment) -> int:
    """Tokens of each sequence one rank holds: s / cp."""
    return space.training.seq_len // as_int(chosen, "cp")


def _etp(space: SpaceInputs, chosen: Assignment) -> tuple[int, ...]:
    """t; and 1 for an MoE model under t > 1 where sequence parallelism can be on."""
    tp = as_int(chosen, "tp")
    if not space.model.is_moe or tp == 1 or True not in space.sequence_parallel or _local_seq_len(space, chosen) % tp:
        return (tp,)
    return (tp, 1)


def _ep(space: SpaceInputs, chosen: Assignment) -> list[int]:
    """Expert-parallel ranks split the experts of a replica group, or folded (etp 1 under tp > 1)
    of a stage's dp x tp ranks: ep divides those and the expert count."""
    if not space.model.is_moe:
        return [1]
    data_axis = as_int(chosen, "dp") * as_int(chosen, "cp")
    ranks = data_axis * (as_int(chosen, "tp") if as_int(chosen, "etp") < as_int(chosen, "tp") else 1)
    return [e for e in divisors(ranks) if space.model.num_local_experts % e == 0]


def _micro_batch_size(space: SpaceInputs, chosen: Assignment) -> list[int]:
    dp, pp = as_int(chosen, "dp"), as_int(chosen, "pp")
    if space.training.global_batch_size % dp:
        return []
    per_replica, flushes = space.training.global_batch_size // dp, space.training.pipeline_flushes
    # Fewer micro-batches than stages (in each of the step's pipeline schedules, which split the
    # step's evenly) would idle most of the pipeline, and torch's schedules refuse it.
    return [
        b
        for b in divisors(per_replica)
        if b <= space.max_micro_batch_size
        and (pp == 1 or ((per_replica // b) % flushes == 0 and per_replica // b // flushes >= pp))
    ]


def _schedule(space: SpaceInputs, chosen: Assignment) -> list[Schedule]:
    pp = as_int(chosen, "pp")
    if pp == 1:
        return [Schedule.ONE_F_ONE_B]
    # one of the step's pipeline schedules (TrainingSpec.pipeline_flushes) at a time
    step = space.training.global_batch_size // (as_int(chosen, "dp") * as_int(chosen, "micro_batch_size"))
    micro_batches = step // space.training.pipeline_flushes
    if micro_batches < pp:
        return []
    out: list[Schedule] = [s for s in (Schedule.ONE_F_ONE_B, Schedule.GPIPE) if s in space.schedules]
    if Schedule.INTERLEAVED in space.schedules and micro_batches % pp == 0 and _interleavings(space, pp):
        out.append(Schedule.INTERLEAVED)
    return out


def _virtual_stages(space: SpaceInputs, chosen: Assignment) -> list[int]:
    if chosen["schedule"] is Schedule.INTERLEAVED:
        return _interleavings(space, as_int(chosen, "pp"))
    return [1]


def _interleavings(space: SpaceInputs, pp: int) -> list[int]:
    """Chunks per pipeline rank above one such that every one of the pp x v chunks gets a layer."""
    return [v for v in range(2, space.max_virtual_stages + 1) if pp * v <= space.model.num_hidden_layers]


def _sequence_parallel(space: SpaceInputs, chosen: Assignment) -> list[bool]:
    tp = as_int(chosen, "tp")
    if tp == 1:
        return [False]
    if as_int(chosen, "etp") < tp:  # folded experts route each rank's own share of the sequence
        return [True]
    return [sp for sp in space.sequence_parallel if not (sp and _local_seq_len(space, chosen) % tp)]


def _vocabulary(space: SpaceInputs, chosen: Assignment) -> list[VocabularyLayout]:
    """Pinned always; split over the pipeline with two or more stages under 1F1B."""
    split = as_int(chosen, "pp") > 1 and chosen["schedule"] is Schedule.ONE_F_ONE_B
    return [v for v in space.vocabulary_layouts if split or not v.over_pipeline]


def _data_axis(chosen: Assignment) -> int:
    """Ranks holding the same weights, over which ZeRO shards: dp cp (``Layout.dense_replicas``)."""
    return as_int(chosen, "dp") * as_int(chosen, "cp")


def _zero_stage(space: SpaceInputs, chosen: Assignment) -> tuple[ZeroStage, ...]:
    return space.zero_stages_for(_data_axis(chosen), as_int(chosen, "pp"))


def _node_group(space: SpaceInputs, chosen: Assignment) -> int:
    """Data-axis ranks of one node: a node's devices over tp."""
    return max(1, space.devices_per_node // as_int(chosen, "tp"))


def _sharding_group(space: SpaceInputs, chosen: Assignment) -> list[int | None]:
    """The whole data axis (dp cp ranks); or, under ZeRO 1-3 without expert parallelism, sharding
    groups of one node's data-axis ranks when they are fewer (HSDP)."""
    g, dp = _node_group(space, chosen), _data_axis(chosen)
    zero = chosen["zero_stage"]
    assert isinstance(zero, ZeroStage)
    grouped = space.hierarchical_sharding and zero.shards_optimizer_states and as_int(chosen, "ep") == 1
    return [None, g] if grouped and 1 < g < dp and dp % g == 0 else [None]


def _secondary_partition(space: SpaceInputs, chosen: Assignment) -> list[int | None]:
    """None; or, under ZeRO-3 without a pipeline, a secondary partition of one node's
    data-parallel ranks when the sharding group spans more (hpZ)."""
    s, group = _node_group(space, chosen), chosen["sharding_group"] or _data_axis(chosen)
    assert isinstance(group, int)
    ok = space.hierarchical_sharding and chosen["zero_stage"] is ZeroStage.PARAMETERS and as_int(chosen, "pp") == 1
    return [None, s] if ok and 1 < s < group and group % s == 0 else [None]


def _recompute(space: SpaceInputs, _: Assignment) -> list[RecomputeChoice]:
    """The space's recompute modes in order, selective as each of ``space.recompute_module_sets``."""
    out = []
    for mode in space.recompute:
        sets = space.module_sets() if mode is Recompute.SELECTIVE else (DEFAULT_RECOMPUTE_MODULES,)
        out += [RecomputeChoice(mode, modules) for modules in sets]
    return out


AXES: tuple[Axis, ...] = (
    Axis(name="tp", field="tensor_parallel_degree", rule=_tp),
    Axis(name="pp", field="pipeline_parallel_degree", depends_on=("tp",), rule=_pp),
    Axis(name="cp", field="context_parallel_degree", depends_on=("tp", "pp"), rule=_cp),
    Axis(name="dp", field="data_parallel_degree", depends_on=("tp", "pp", "cp"), rule=_dp),
    Axis(name="etp", field="expert_tensor_parallel_degree", depends_on=("tp", "cp"), rule=_etp),
    Axis(name="ep", field="expert_parallel_degree", depends_on=("tp", "dp", "cp", "etp"), rule=_ep),
    Axis(
        name="cp_kind",
        field="context_parallel_kind",
        depends_on=("tp", "cp"),
        rule=_cp_kind,
        tried_in_full=True,
        rule_constrains=True,
    ),
    Axis(name="micro_batch_size", field="micro_batch_size", depends_on=("dp", "pp"), rule=_micro_batch_size),
    Axis(name="schedule", field="schedule", depends_on=("dp", "pp", "micro_batch_size"), rule=_schedule),
    Axis(name="virtual_stages", field="virtual_stages", depends_on=("pp", "schedule"), rule=_virtual_stages),
    Axis(name="sequence_parallel", field="sequence_parallel", depends_on=("tp", "cp", "etp"), rule=_sequence_parallel),
    Axis(
        name="vocabulary",
        field="vocabulary_layout",
        depends_on=("pp", "schedule"),
        rule=_vocabulary,
        tried_in_full=True,
    ),
    Axis(name="zero_stage", field="zero_stage", depends_on=("dp", "pp", "cp"), rule=_zero_stage),
    Axis(
        name="sharding_group",
        field="sharding_group_size",
        depends_on=("tp", "dp", "cp", "ep", "zero_stage"),
        rule=_sharding_group,
        tried_in_full=True,
    ),
    Axis(
        name="secondary_partition",
        field="secondary_partition_size",
        depends_on=("tp", "pp", "dp", "cp", "zero_stage", "sharding_group"),
        rule=_secondary_partition,
        tried_in_full=True,
    ),
    Axis(name="recompute", field="recompute", rule=_recompute),
)
"""Every axis of the search, in the order they are chosen (each after those it depends on).
Recompute stays last: ``SearchSpace.groups`` groups by it, and Optuna tries it in order."""

DEGREE_AXES = ("tp", "pp", "cp", "dp", "etp", "ep")
"""The leading axes, the parallel degrees: ``SearchSpace.blocks``."""
