"""Layout: one candidate way of splitting a model over a cluster.

The rank order, stages, chunks and the vocabulary layers' place are ``schemas.geometry``'s;
which device runs each rank is ``device_map``'s.
"""

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from planner.schemas.device_map import IDENTITY, DeviceMap
from planner.schemas.enums import (
    ContextParallelKind,
    Recompute,
    RecomputeModule,
    Schedule,
    VocabularyLayout,
    ZeroStage,
)
from planner.schemas.errors import InfeasibleConfigError, SchemaError
from planner.schemas.model import ModelSpec
from planner.schemas.routing import ExpertPlacement

DEFAULT_RECOMPUTE_MODULES: tuple[RecomputeModule, ...] = (RecomputeModule.CORE_ATTN,)
"""Megatron-Core's default ``recompute_modules``: what selective recomputation meant before it
named its modules (plan schema 9 and older)."""


_CANONICAL_MODULE_SETS: Mapping[tuple[RecomputeModule, ...], tuple[RecomputeModule, ...]] = MappingProxyType(
    {
        modules: DEFAULT_RECOMPUTE_MODULES if modules == DEFAULT_RECOMPUTE_MODULES else modules
        for modules in (
            tuple(m for i, m in enumerate(RecomputeModule) if mask >> i & 1)
            for mask in range(1, 2 ** len(RecomputeModule))
        )
    }
)
"""Every non-empty set of modules, in the order ``Layout.recompute_modules`` stores them, to the one
tuple that stores it: a layout holding that very tuple needs no check (the search builds many)."""


def recompute_modules_of(modules: Iterable[RecomputeModule | str]) -> tuple[RecomputeModule, ...]:
    """``modules`` as ``Layout.recompute_modules`` stores them: in ``RecomputeModule``'s order,
    without repeats, the one tuple of that set (``_CANONICAL_MODULE_SETS``).

    Raises:
        SchemaError: a name that is no module, or no module at all.
    """
    given = {_coerce(RecomputeModule, m, "recompute_modules") for m in modules}
    if not given:
        raise SchemaError(
            "recompute_modules is empty, which under recompute='selective' recomputes nothing; name a module "
            "(e.g. core_attn) or use recompute='none'"
        )
    return _CANONICAL_MODULE_SETS[tuple(m for m in RecomputeModule if m in given)]


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Parallel degrees, memory savers and the pipeline schedule of a candidate."""

    data_parallel_degree: int
    """Model replicas (d)."""
    tensor_parallel_degree: int
    """Ranks that split every layer's matrices (t)."""
    pipeline_parallel_degree: int
    """Pipeline stages (p)."""
    micro_batch_size: int
    """Sequences per micro-batch (b)."""
    context_parallel_degree: int = 1
    """Ranks that split every sequence (cp): each holds 1/cp of a micro-batch's tokens, and
    attention spans them as ``context_parallel_kind`` says. They hold the same weights, so gradients are
    reduced and ZeRO shards over the d cp ranks (``dense_replicas``), as Megatron-Core's data-
    and context-parallel group."""
    context_parallel_kind: ContextParallelKind = ContextParallelKind.RING
    """How attention spans the cp ranks' shares (``ContextParallelKind``): the ring passes
    key/value blocks around them, on the zig-zag split; the all-to-all (DeepSpeed-Ulysses) trades
    the sequence split for a head split around the attention core, on a contiguous split. Stored
    as ring when cp is 1."""
    expert_parallel_degree: int = 1
    """Ranks that split the experts of an MoE layer: of a data-parallel group (divides d cp), or
    with the experts whole on every rank (``expert_tensor_parallel_degree`` 1) of a stage's d cp t
    ranks (divides d cp t)."""
    expert_tensor_parallel_degree: int | None = None
    """Ranks that split each routed expert's matrices (ETP): None (or t), the tensor-parallel
    group, as attention; 1, every expert whole on its rank while attention keeps t ("MoE parallel
    folding", Megatron-Core's ``--expert-tensor-parallel-size 1``; ``schemas.geometry``). 1 with
    t > 1 needs sequence parallelism. Stored as None when it equals t."""
    zero_stage: ZeroStage = ZeroStage.NONE
    """What data-parallel ranks shard: 1 optimizer states, 2 also gradients, 3 also weights."""
    sharding_group_size: int | None = None
    """ZeRO shards within groups of this many consecutive data-parallel ranks and replicates
    across the d / g groups, whose shards' gradients are then all-reduced (HSDP: FSDP2 on a
    (replicate, shard) mesh; Megatron-LM's partial distributed optimizer). None: the whole
    data-parallel group (stored as None when it equals d)."""
    secondary_partition_size: int | None = None
    """ZeRO-3: after the forward each unit's weights stay sharded over groups of this many
    consecutive ranks, from which the backward gathers them (ZeRO++'s hierarchical partition,
    hpZ; FSDP2's ``reshard_after_forward=<int>``). None: the backward gathers over the sharding
    group, as the forward does."""
    recompute: Recompute = Recompute.NONE
    """Activation recomputation."""
    recompute_modules: tuple[RecomputeModule, ...] = DEFAULT_RECOMPUTE_MODULES
    """What selective recomputation re-runs (``RecomputeModule``; Megatron-Core's
    ``--recompute-modules``): by default the attention core alone, Korthikanti et al.'s selective
    recompute. Stored in ``RecomputeModule``'s order without repeats, and as the default when
    ``recompute`` is not selective (none keeps everything, full re-runs every module), so that
    equal layouts compare equal."""
    recompute_layers: tuple[int, ...] | None = None
    """Under full recompute, how many layers of each pipeline stage recompute, in pipeline order:
    the stage's first ones (Megatron-LM's ``--recompute-method block``); its others keep their
    activations, as without recompute. A stage holding more micro-batches in flight (the first,
    under 1F1B) gains more memory from each. None: every layer recomputes. One model chunk per stage."""
    optimizer_offload_fraction: float = 0.0
    """Of the optimizer states each rank holds (its ZeRO shard, or all of its own without ZeRO),
    the fraction kept in host memory and stepped by the host's CPUs: the rank's gradients for it
    go down and its updated weights come back each step (Megatron-LM's ``--optimizer-cpu-offload
    --optimizer-offload-fraction``, DeepSpeed's ``offload_optimizer`` with its ``ratio``). 0:
    every state on the device."""
    parameter_offload: bool = False
    """ZeRO-3: keep each rank's shard of the weights and gradients in host memory too, beside all its
    optimizer states (``optimizer_offload_fraction`` 1): every unshard copies the shard up before
    gathering it, every reduced gradient shard goes down, and the host's CPUs step (FSDP2's
    ``CPUOffloadPolicy``, torchtitan's ``enable_cpu_offload``, DeepSpeed's ``offload_param``).
    Needs ZeRO-3 over several replicas without a pipeline."""
    activation_offload_layers: int = 0
    """How many transformer layers, the model's first, keep what their backward needs in host
    memory between their forward and their backward: each micro-batch copies it down in the
    forward and back up in the backward (Megatron-LM's ``--cpu-offloading-num-layers``, torch's
    ``save_on_cpu``). As Megatron-Core runs it: without a pipeline and without recompute, and
    fewer than the model's layers (``layout_validity``). 0: every activation on the device."""
    sequence_parallel: bool = False
    """Shard LayerNorm/dropout activations along the sequence over the tensor-parallel group."""
    schedule: Schedule = Schedule.ONE_F_ONE_B
    """Pipeline schedule."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank (v); above 1 only with the interleaved schedule."""
    layer_split: tuple[int, ...] | None = None
    """Transformer layers per model chunk in pipeline order (p * v entries); None splits evenly."""
    vocabulary_layout: VocabularyLayout = VocabularyLayout.PINNED
    """Where the embedding, output layer and loss sit (schemas.geometry)."""
    expert_placement: ExpertPlacement | None = None
    """Which experts each expert-parallel rank hosts in each MoE layer (``schemas.routing``);
    None places them in contiguous blocks: expert e of E on rank e // (E / ep)."""
    device_map: DeviceMap = field(default_factory=lambda: IDENTITY)
    """Which device runs each rank; the identity by default."""

    def __post_init__(self) -> None:
        for name in (
            "data_parallel_degree",
            "tensor_parallel_degree",
            "pipeline_parallel_degree",
            "micro_batch_size",
            "context_parallel_degree",
            "expert_parallel_degree",
            "virtual_stages",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SchemaError(f"{name}={value!r} must be a whole number >= 1")
        object.__setattr__(self, "zero_stage", _coerce(ZeroStage, self.zero_stage, "zero_stage"))
        object.__setattr__(self, "recompute", _coerce(Recompute, self.recompute, "recompute"))
        self._store_recompute_modules()
        object.__setattr__(self, "schedule", _coerce(Schedule, self.schedule, "schedule"))
        kind = _coerce(ContextParallelKind, self.context_parallel_kind, "context_parallel_kind")
        if self.context_parallel_degree == 1:  # no kind without context parallelism: equal layouts compare equal
            kind = ContextParallelKind.RING
        object.__setattr__(self, "context_parallel_kind", kind)
        object.__setattr__(
            self, "vocabulary_layout", _coerce(VocabularyLayout, self.vocabulary_layout, "vocabulary_layout")
        )
        if isinstance(self.device_map, dict):  # read from a file
            object.__setattr__(self, "device_map", DeviceMap(**self.device_map))
        self.device_map.check(self.world_size)
        if isinstance(self.expert_placement, dict):  # read from a file
            object.__setattr__(self, "expert_placement", ExpertPlacement(**self.expert_placement))
        if self.expert_placement is not None and self.expert_placement.num_ranks != self.expert_parallel_degree:
            raise SchemaError(
                f"expert_placement places experts on {self.expert_placement.num_ranks} ranks, but "
                f"expert_parallel_degree={self.expert_parallel_degree}; give one entry per expert-parallel rank"
            )
        if self.virtual_stages > 1 and self.schedule is not Schedule.INTERLEAVED:
            raise SchemaError(
                f"virtual_stages={self.virtual_stages} needs schedule='interleaved', not {self.schedule!s}"
            )
        if self.schedule is Schedule.INTERLEAVED and self.pipeline_parallel_degree < 2:
            raise SchemaError("schedule='interleaved' needs pipeline_parallel_degree >= 2")
        if self.vocabulary_layout.over_pipeline and (
            self.pipeline_parallel_degree < 2 or self.schedule is not Schedule.ONE_F_ONE_B
        ):
            raise SchemaError(
                f"vocabulary_layout={self.vocabulary_layout!s} splits the vocabulary over the pipeline ranks: it needs "
                "pipeline_parallel_degree >= 2 and schedule='1f1b' (Vocabulary Parallelism's schedule); use 'pinned' "
                "otherwise"
            )
        if self.sequence_parallel and self.tensor_parallel_degree == 1:
            raise SchemaError("sequence_parallel needs tensor_parallel_degree > 1; turn it off or raise tp")
        self._check_expert_tensor_parallel()
        self._check_sharding_groups()
        if self.expert_ranks % self.expert_parallel_degree:
            over = "data x tensor_parallel_degree" if self.folds_experts else "data_parallel_degree"
            over = over.replace("data", "data x context", 1) if self.context_parallel_degree > 1 else over
            raise SchemaError(
                f"expert_parallel_degree={self.expert_parallel_degree} must divide {over}={self.expert_ranks}"
            )
        if self.layer_split is not None:
            object.__setattr__(self, "layer_split", tuple(self.layer_split))
            if len(self.layer_split) != self.num_chunks:
                raise SchemaError(
                    f"layer_split has {len(self.layer_split)} entries; it needs "
                    f"pipeline_parallel_degree x virtual_stages = {self.num_chunks}"
                )
            if any(not isinstance(n, int) or n < 0 for n in self.layer_split):
                raise SchemaError(f"layer_split={self.layer_split} must hold whole numbers >= 0")
        self._check_recompute_layers()
        self._check_optimizer_offload()
        self._check_activation_offload()

    def _check_activation_offload(self) -> None:
        layers = self.activation_offload_layers
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 0:
            raise SchemaError(
                f"activation_offload_layers={layers!r} must be a whole number of layers >= 0 (0: none offloaded)"
            )
        if layers and not self.can_offload_activations:
            raise SchemaError(
                f"activation_offload_layers={layers} offloads what layers keep for their backward, as Megatron-Core "
                f"does without a pipeline and without recompute, but pipeline_parallel_degree="
                f"{self.pipeline_parallel_degree}, recompute={self.recompute!s}; plan pp1 with recompute none, or "
                "drop the activation offload"
            )

    def _check_optimizer_offload(self) -> None:
        fraction = self.optimizer_offload_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0.0 <= fraction <= 1.0:
            raise SchemaError(
                f"optimizer_offload_fraction={fraction!r} must be a number from 0 (no offload) to 1 (every "
                "optimizer state in host memory)"
            )
        object.__setattr__(self, "optimizer_offload_fraction", float(fraction))
        if not self.parameter_offload:
            return
        if not self.offloads_weights_possible:
            raise SchemaError(
                f"parameter_offload keeps ZeRO-3's weight shards on the host, but zero_stage={int(self.zero_stage)}, "
                f"{self.dense_replicas} replica(s), pipeline_parallel_degree={self.pipeline_parallel_degree}; it needs "
                "zero_stage=3 over more than one replica without a pipeline"
            )
        if fraction != 1.0:
            raise SchemaError(
                f"parameter_offload steps the optimizer on the host, but optimizer_offload_fraction={fraction:g}; "
                "set it to 1 (every optimizer state on the host)"
            )

    def _check_recompute_layers(self) -> None:
        layers = self.recompute_layers
        if layers is None:
            return
        object.__setattr__(self, "recompute_layers", tuple(layers))
        if self.recompute is not Recompute.FULL:
            raise SchemaError(
                f"recompute_layers={list(layers)} counts the layers full recompute re-runs, but recompute="
                f"{self.recompute!s}; set recompute='full' or drop recompute_layers"
            )
        if self.virtual_stages > 1:
            raise SchemaError(
                f"recompute_layers counts layers per stage of one model chunk, but virtual_stages="
                f"{self.virtual_stages}; drop recompute_layers or plan one chunk per stage"
            )
        if len(layers) != self.pipeline_parallel_degree:
            raise SchemaError(
                f"recompute_layers has {len(layers)} entries; it needs one per pipeline stage "
                f"(pipeline_parallel_degree={self.pipeline_parallel_degree})"
            )
        if any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in layers):
            raise SchemaError(f"recompute_layers={list(layers)} must hold whole numbers >= 0")

    def _store_recompute_modules(self) -> None:
        modules = self.recompute_modules
        if self.recompute is not Recompute.SELECTIVE:
            object.__setattr__(self, "recompute_modules", DEFAULT_RECOMPUTE_MODULES)
            return
        try:
            if _CANONICAL_MODULE_SETS.get(modules) is modules:
                return  # stored already (the search builds many layouts of a few sets)
        except TypeError:  # unhashable: a list, read from a file
            pass
        if isinstance(modules, str | RecomputeModule) or not isinstance(modules, tuple | list | set | frozenset):
            raise SchemaError(f"recompute_modules={modules!r} must be a list of modules, e.g. ['layernorm', 'moe']")
        object.__setattr__(self, "recompute_modules", recompute_modules_of(modules))

    @property
    def can_offload_activations(self) -> bool:
        """Whether its layers' activations may be offloaded (``activation_offload_layers``):
        Megatron-Core offloads them without a pipeline and without recompute."""
        return self.pipeline_parallel_degree == 1 and self.recompute is Recompute.NONE

    def recomputes(self, module: RecomputeModule) -> bool:
        """Whether the backward re-runs ``module`` of every layer that has it: under full
        recomputation every module, under selective those of ``recompute_modules``."""
        if self.recompute is Recompute.FULL:
            return True
        return self.recompute is Recompute.SELECTIVE and module in self.recompute_modules

    @property
    def recomputes_attention_core(self) -> bool:
        """Whether the attention core (and with it a context-parallel exchange) runs again in the
        backward: ``recomputes(CORE_ATTN)``."""
        return self.recomputes(RecomputeModule.CORE_ATTN)

    def _check_sharding_groups(self) -> None:
        d, g, s = self.dense_replicas, self.sharding_group_size, self.secondary_partition_size
        over = "data_parallel_degree" if self.context_parallel_degree == 1 else "data x context_parallel_degree"
        for name, size in (("sharding_group_size", g), ("secondary_partition_size", s)):
            if size is not None and (not isinstance(size, int) or size < 1 or d % size):
                raise SchemaError(f"{name}={size!r} must divide {over}={d}; give a divisor or None")
        if g == d:  # the default, stored one way so that equal layouts compare equal
            object.__setattr__(self, "sharding_group_size", g := None)
        if g is not None and not self.zero_stage.shards_optimizer_states:
            raise SchemaError(f"sharding_group_size={g} needs a ZeRO stage (1-3) to shard within the group")
        if g is not None and self.expert_parallel_degree > 1:
            raise SchemaError(
                f"sharding_group_size={g} with expert_parallel_degree={self.expert_parallel_degree} is not modelled "
                "yet; shard over the whole data-parallel group (None) or drop expert parallelism"
            )
        if s is None:
            return
        if self.zero_stage is not ZeroStage.PARAMETERS:
            raise SchemaError(f"secondary_partition_size={s} needs zero_stage=3 (it partitions the gathered weights)")
        if (g or d) % s or s == (g or d):
            raise SchemaError(
                f"secondary_partition_size={s} must divide the sharding group ({g or d} ranks) and be smaller; "
                "give a smaller divisor or None"
            )
        if self.pipeline_parallel_degree > 1:
            raise SchemaError(
                f"secondary_partition_size={s} with a pipeline (pipeline_parallel_degree="
                f"{self.pipeline_parallel_degree}) is not modelled yet; use it without a pipeline or drop it"
            )

    @property
    def dense_replicas(self) -> int:
        """Ranks of a stage and tensor shard that hold the same dense weights: d cp (the data
        axis of ``schemas.geometry``'s mesh). Dense gradients are reduced over them."""
        return self.data_parallel_degree * self.context_parallel_degree

    @property
    def shards_over_replicas(self) -> bool:
        """Whether ZeRO-2/3 shard the dense states (FSDP in the runtime): over one replica there is
        nothing to shard, and the layout is priced and run as ZeRO-0/1."""
        return self.zero_stage.shards_gradients and self.dense_replicas > 1

    @property
    def offloads_weights_possible(self) -> bool:
        """Whether ``parameter_offload`` may be set: ZeRO-3 shards the weights over more than one
        replica, and no pipeline holds them whole (``cost_models.pipeline.defers_gradient_reduction``)."""
        return (
            self.zero_stage is ZeroStage.PARAMETERS and self.dense_replicas > 1 and self.pipeline_parallel_degree == 1
        )

    @property
    def shard_degree(self) -> int:
        """Ranks over which ZeRO shards the dense model states: ``sharding_group_size``, else d cp."""
        return self.sharding_group_size or self.dense_replicas

    @property
    def gathers_backward_over(self) -> int:
        """Ranks the backward gathers ZeRO-3's weights from: the secondary partition, else the
        sharding group."""
        return self.secondary_partition_size or self.shard_degree

    def _check_expert_tensor_parallel(self) -> None:
        etp, t = self.expert_tensor_parallel_degree, self.tensor_parallel_degree
        if etp is None:
            return
        if etp not in (1, t):
            raise SchemaError(
                f"expert_tensor_parallel_degree={etp!r} must be 1 or tensor_parallel_degree={t}; use one of them"
            )
        if etp == t:  # the default, stored one way so that equal layouts compare equal
            object.__setattr__(self, "expert_tensor_parallel_degree", None)
        elif not self.sequence_parallel:
            raise SchemaError(
                f"expert_tensor_parallel_degree=1 with tensor_parallel_degree={t} needs sequence_parallel (each "
                "rank routes its own share of the sequence); turn it on or set expert_tensor_parallel_degree to t"
            )

    @property
    def expert_tensor_degree(self) -> int:
        """Ranks that split each routed expert: ``expert_tensor_parallel_degree``, t when None."""
        etp = self.expert_tensor_parallel_degree
        return self.tensor_parallel_degree if etp is None else etp

    @property
    def folds_experts(self) -> bool:
        """Whether experts are whole on every rank while attention is split over t > 1 (ETP 1)."""
        return self.expert_tensor_parallel_degree == 1

    @property
    def expert_ranks(self) -> int:
        """Ranks of one stage over which expert parallelism and expert data parallelism split:
        d cp, or d cp t when the experts are folded (``folds_experts``)."""
        return self.dense_replicas * (self.tensor_parallel_degree if self.folds_experts else 1)

    @property
    def expert_data_parallel_degree(self) -> int:
        """Ranks of a stage that hold the same experts (expert-data-parallel group): d cp / ep,
        or d cp t / ep folded. Expert gradients and ZeRO's expert shards are over them."""
        return self.expert_ranks // self.expert_parallel_degree

    @property
    def world_size(self) -> int:
        """Ranks the layout occupies: d * cp * t * p."""
        return self.dense_replicas * self.tensor_parallel_degree * self.pipeline_parallel_degree

    @property
    def num_chunks(self) -> int:
        """Model chunks over the whole pipeline: p * v."""
        return self.pipeline_parallel_degree * self.virtual_stages

    def describe(self) -> str:
        """A compact one-line summary for tables and logs."""
        parts = [
            f"dp{self.data_parallel_degree}",
            f"tp{self.tensor_parallel_degree}",
            f"pp{self.pipeline_parallel_degree}",
        ]
        if self.context_parallel_degree > 1:
            a2a = self.context_parallel_kind is ContextParallelKind.ALL_TO_ALL
            parts.append(f"cp{self.context_parallel_degree}" + ("a2a" if a2a else ""))
        if self.expert_parallel_degree > 1:
            parts.append(f"ep{self.expert_parallel_degree}")
        if self.folds_experts:
            parts.append("etp1")
        parts += [f"mb{self.micro_batch_size}", f"zero{int(self.zero_stage)}"]
        if self.sharding_group_size is not None:
            parts.append(f"hsdp{self.sharding_group_size}")
        if self.secondary_partition_size is not None:
            parts.append(f"hpz{self.secondary_partition_size}")
        modules = "" if self.recompute_modules == DEFAULT_RECOMPUTE_MODULES else ":" + "+".join(self.recompute_modules)
        parts.append(f"rc-{self.recompute}{modules}")
        if self.recompute_layers is not None:
            parts[-1] += "[" + ",".join(map(str, self.recompute_layers)) + "]"
        if self.parameter_offload:
            parts.append("param-offload")
        elif self.optimizer_offload_fraction > 0:
            parts.append(f"opt-offload{self.optimizer_offload_fraction:g}")
        if self.activation_offload_layers:
            parts.append(f"act-offload{self.activation_offload_layers}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.pipeline_parallel_degree > 1:
            sched = str(self.schedule)
            parts.append(f"{sched}x{self.virtual_stages}" if self.virtual_stages > 1 else sched)
        if self.vocabulary_layout.over_pipeline:
            parts.append(str(self.vocabulary_layout))
        if self.expert_placement is not None:
            parts.append("placed-experts")
        if not self.device_map.is_identity:
            parts.append("mapped")
        return " ".join(parts)


def check_experts(model: ModelSpec, layout: Layout) -> None:
    """Raise InfeasibleConfigError unless ``layout``'s expert parallelism and placement fit
    ``model``'s experts: ep > 1 only for a mixture of experts, ep divides its experts, and a
    placement places its MoE layers and experts. (What a layout needs of a model beyond that
    needs the cluster too: ``cost_models.layout_validity``.)"""
    ep, ranks, experts = layout.expert_parallel_degree, layout.expert_ranks, model.num_local_experts
    if ep > 1 and not model.is_moe:
        raise InfeasibleConfigError(
            f"expert_parallel_degree={ep} needs a mixture-of-experts model, but {model.name!r} is dense; set it to 1"
        )
    if layout.folds_experts and not model.is_moe:
        raise InfeasibleConfigError(
            f"expert_tensor_parallel_degree=1 needs a mixture-of-experts model, but {model.name!r} is dense; "
            "leave it unset"
        )
    if experts % ep:
        over = "data_parallel_degree" if not layout.folds_experts else "data x tensor_parallel_degree"
        choices = [n for n in range(1, experts + 1) if math.gcd(experts, ranks) % n == 0]
        raise InfeasibleConfigError(
            f"expert_parallel_degree={ep} does not divide the {experts} experts of {model.name!r}; use an ep that "
            f"divides both {experts} and {over}={ranks}: {', '.join(map(str, choices))}"
        )
    _check_recompute_modules(model, layout)
    placement = layout.expert_placement
    if placement is not None and (placement.num_layers, placement.num_experts) != (
        model.num_moe_layers,
        experts,
    ):
        raise InfeasibleConfigError(
            f"expert_placement places {placement.num_experts} experts in {placement.num_layers} MoE layers, but "
            f"{model.name!r} has {experts} experts in {model.num_moe_layers} MoE layers; place the model's own "
            "experts (from a routing trace of this model)"
        )


def _check_recompute_modules(model: ModelSpec, layout: Layout) -> None:
    """Raise InfeasibleConfigError if ``layout`` recomputes a module no layer of ``model`` has:
    moe_act and moe need MoE layers, mlp dense ones (Megatron-Core applies each where it exists)."""
    moe_layers = model.num_moe_layers
    has = {
        RecomputeModule.MOE_ACT: moe_layers > 0,
        RecomputeModule.MOE: moe_layers > 0,
        RecomputeModule.MLP: moe_layers < model.num_hidden_layers,
    }
    missing = [m for m in layout.recompute_modules if not has.get(m, True)]
    if layout.recompute is Recompute.SELECTIVE and missing:
        kind = "dense" if missing[0] is RecomputeModule.MLP else "mixture-of-experts"
        raise InfeasibleConfigError(
            f"recompute module {missing[0]!s} recomputes {kind} layers, but {model.name!r} has none; leave it out "
            f"(its layers: {model.num_hidden_layers - moe_layers} dense, {moe_layers} MoE)"
        )


_E = TypeVar("_E", ZeroStage, Recompute, RecomputeModule, Schedule, VocabularyLayout, ContextParallelKind)


def _coerce(enum: type[_E], value: Any, name: str) -> _E:
    if type(value) is enum:  # as the search builds them: nothing to convert
        return value
    try:
        return enum(value)
    except ValueError as e:
        allowed = ", ".join(repr(m.value) for m in enum)
        raise SchemaError(f"{name}={value!r} is not one of {allowed}") from e
