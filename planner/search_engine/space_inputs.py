"""What a search space is made of: the model, the training setup, the cluster's size and the
options that bound each axis (``SpaceInputs``), with the questions the axis rules ask of them (the
values a constraint allows an axis, the recompute module sets, the ZeRO stages worth telling
apart). ``space.SearchSpace`` adds the enumeration over the axes (``axes.AXES``); the rules read
only these inputs, so the declaration of the axes needs no search space.
"""

from dataclasses import dataclass

from planner.schemas import (
    DEFAULT_RECOMPUTE_MODULES,
    ModelSpec,
    Recompute,
    RecomputeModule,
    Schedule,
    TrainingSpec,
    VocabularyLayout,
    ZeroStage,
)
from planner.schemas.choices import Choice, RecomputeChoice
from planner.schemas.layout import recompute_modules_of

DENSE_RECOMPUTE_MODULES: tuple[RecomputeModule, ...] = recompute_modules_of(
    (RecomputeModule.CORE_ATTN, RecomputeModule.MLP)
)
"""The module set selective recomputation also tries for a dense model (after the attention core
alone): the MLP too (Megatron-Core's ``--recompute-modules mlp``), whose two GEMMs run again in
the backward while its input and the widest activations (the up projection and its activation,
f wide against the attention's h) are not kept. Llama 3 405B on 8,192 H100s (the Llama 3 paper's
layout, ``benchmarks/validate_h100.py``) does not fit without recompute and fits with this set:
without it the search had only full recompute there, further from the published step time."""

MOE_RECOMPUTE_MODULES: tuple[RecomputeModule, ...] = recompute_modules_of(
    (RecomputeModule.CORE_ATTN, RecomputeModule.MOE)
)
"""The module set selective recomputation also tries for an MoE model (after the attention core
alone): the whole MoE block, dispatch and combine included (the Megatron MoE Model Zoo's ``moe``;
with the dense MLPs too, ``mlp``, where the model has dense layers, as Megatron-LM's DeepSeek-V3
example recomputes both). The attention core rides along: under FlashAttention it costs nothing
(``cost_models.timing``), and it keeps each set a superset of the one before.

Only modules the planner's own runtime checkpoints are searched by default, as with every other
choice a search makes: Megatron-Core's output-discarding ones (``layernorm``, ``moe_act``: its
MoE README's ``layernorm moe_act``, no GEMM again) have no torch counterpart there
(``schemas.runtime_support``), so a search that picked them returned plans ``planner run``
refused (a dry run, run as the runtime runs it, traced more than the devices hold).
``--recompute-modules layernorm,moe_act`` prices them for a Megatron stack."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SpaceInputs:
    """The choices a search may make for one model, training setup and cluster size: what bounds
    each axis (``axes.AXES``); ``space.SearchSpace`` enumerates them."""

    model: ModelSpec
    training: TrainingSpec
    world_size: int
    devices_per_node: int
    zero_stages: tuple[ZeroStage, ...] = tuple(ZeroStage)
    recompute: tuple[Recompute, ...] = tuple(Recompute)
    """In increasing order of time (and decreasing memory): strategies rely on it."""
    recompute_module_sets: tuple[tuple[RecomputeModule, ...], ...] | None = None
    """The module sets selective recomputation tries, each holding the one before (the order
    above relies on it); None: the attention core alone, then ``DENSE_RECOMPUTE_MODULES`` for a
    dense model or ``MOE_RECOMPUTE_MODULES`` for an MoE one (``module_sets``)."""
    schedules: tuple[Schedule, ...] = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)
    sequence_parallel: tuple[bool, ...] = (True, False)
    vocabulary_layouts: tuple[VocabularyLayout, ...] = (VocabularyLayout.PINNED, VocabularyLayout.VOCAB_2)
    """Where the vocabulary layers may go (``schemas.geometry``). Algorithm 1 (``VOCAB_1``) is
    priced but not searched by default: it holds one more micro-batch in flight than Algorithm 2
    and waits on one more barrier, so the cost model never prefers it (the paper measured the two
    within 0.5% MFU of each other, Algorithm 2 with less memory)."""
    max_tensor_parallel: int | None = None
    """Largest tensor-parallel degree; None means one node's devices."""
    max_virtual_stages: int = 8
    """Largest number of model chunks per pipeline rank for the interleaved schedule."""
    max_micro_batch_size: int = 64
    min_context_share_tokens: int = 2048
    """Fewest tokens of a sequence a context-parallel rank may hold (s / cp) unless cp is
    constrained: below it a ring step's attention block (two chunks of s / (2 cp)) and its k/v
    send are too small to keep the kernel and the links busy, and the search would price many
    layouts to find what the cost model says anyway (at 2k tokens a rank, cp 1)."""
    constraints: tuple[tuple[str, frozenset[Choice]], ...] = ()
    """Values some axes may take, by axis name (``constrained``): each such axis offers only
    the valid values among them (``Axis.choices``)."""
    hierarchical_sharding: bool = True
    """Whether ZeRO may shard in node-sized groups (HSDP) and keep ZeRO-3's weights after the
    forward over a node-sized secondary partition (hpZ), where the data-parallel group spans
    more than a node."""

    def module_sets(self) -> tuple[tuple[RecomputeModule, ...], ...]:
        """The module sets selective recomputation tries: ``recompute_module_sets``, else those a
        constraint on the recompute axis names (``RecomputeChoice``s of selective, as
        ``--recompute-modules`` gives one), else the defaults (``recompute_module_sets``)."""
        if self.recompute_module_sets is not None:
            return self.recompute_module_sets
        named = sorted(
            (
                recompute_modules_of(c.modules)
                for c in self.allowed("recompute") or ()
                if isinstance(c, RecomputeChoice)
            ),
            key=lambda modules: (len(modules), modules),
        )
        if named:
            return tuple(named)
        if not self.model.is_moe:
            return (DEFAULT_RECOMPUTE_MODULES, DENSE_RECOMPUTE_MODULES)
        dense = self.model.num_moe_layers < self.model.num_hidden_layers
        block = recompute_modules_of((*MOE_RECOMPUTE_MODULES, RecomputeModule.MLP)) if dense else MOE_RECOMPUTE_MODULES
        return (DEFAULT_RECOMPUTE_MODULES, block)

    def allowed(self, name: str) -> frozenset[Choice] | None:
        """The values the constraints allow axis ``name``; None when it is not constrained."""
        return next((values for axis, values in self.constraints if axis == name), None)

    def zero_stages_for(self, dp: int, pp: int) -> tuple[ZeroStage, ...]:
        """The allowed ZeRO stages that give ``dp`` replicas of ``pp`` stages different layouts
        (``axes`` module docstring); the lowest allowed one where none of them would."""
        if dp == 1:
            return (min(self.zero_stages),)
        if pp > 1:
            return tuple(z for z in self.zero_stages if z <= ZeroStage.OPTIMIZER) or (min(self.zero_stages),)
        return self.zero_stages
