"""Measured operations other than plain GEMMs: one record type per kind of op, with named fields.

A record says what was timed (its op and the named sizes of that op) and how long it took.
Ops with a backward carry ``fwd_time_s`` and ``fwd_bwd_time_s``; ops timed once carry ``time_s``.
On disk a record is a JSON object whose ``op`` says which type it is, e.g.
``{"op": "tp_layer", "dtype": "bf16", "fwd_time_s": ..., "fwd_bwd_time_s": ..., "spread": ...,
"model": "tiny-gpt", "tensor_parallel_degree": 2, "micro_batch_size": 4, "seq_len": 128,
"sequence_parallel": true}``.

Version 1 of the cluster profile kept these sizes in a positional ``shape`` whose meaning depended
on the op; ``record_from_v1`` names them (``V1_SHAPES``).
"""

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from planner.schemas._base import FrozenModel
from planner.schemas.enums import AttentionKernel, DType, ZeroStage
from planner.schemas.errors import SchemaError


class OpKind(StrEnum):
    """The operations the profiler times besides plain GEMMs."""

    ATTENTION = "attention"
    LAYERNORM = "layernorm"
    ELEMENTWISE = "elementwise"
    LAYER = "layer"
    MOE_LAYER = "moe_layer"
    TP_LAYER = "tp_layer"
    OUTPUT_LAYER = "output_layer"
    OPTIMIZER = "optimizer"
    PIPELINE_SLOT = "pipeline_slot"
    SHARDED_UNIT = "sharded_unit"


class _Measured(FrozenModel):
    """What every record starts with: which op (each record type narrows it), in which precision."""

    op: OpKind
    dtype: DType


class _ForwardBackward(_Measured):
    """Timings of an op with a backward: the forward alone, and forward + backward."""

    fwd_time_s: float = Field(gt=0)
    fwd_bwd_time_s: float = Field(gt=0)
    spread: float = Field(default=0.0, ge=0, description="Interquartile range / median of the repeats.")


class _TimedOnce(_Measured):
    """The timing of an op without a backward."""

    time_s: float = Field(gt=0)
    spread: float = Field(default=0.0, ge=0, description="Interquartile range / median of the repeats.")


def attention_forward_flop(batch: int, heads: int, seq_len: int, head_size: int, *, causal: bool) -> float:
    """Forward FLOPs of scaled-dot-product attention as the FlashAttention papers count them:
    4 s^2 d per head and sequence over the full s x s, half of it under a causal mask."""
    return (2.0 if causal else 4.0) * batch * heads * seq_len**2 * head_size


class AttentionRecord(_ForwardBackward):
    """Scaled-dot-product attention on (batch, heads, sequence, head size) inputs, causal or with
    every query attending every key (``causal``)."""

    op: Literal[OpKind.ATTENTION] = OpKind.ATTENTION
    batch_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    seq_len: int = Field(ge=1)
    head_size: int = Field(ge=1)
    kernel: AttentionKernel = Field(
        default=AttentionKernel.FLASH,
        description="The fused kernel timed: what the profiler's SDPA ran (flash), or a preset's published kernel.",
    )
    causal: bool = Field(
        default=True,
        description="Whether the timed attention had a causal mask; False: no mask, as ring attention's "
        "off-diagonal blocks run (schema version 9).",
    )

    @property
    def forward_flop(self) -> float:
        """The timed forward's FLOPs (``attention_forward_flop``)."""
        return attention_forward_flop(
            self.batch_size, self.num_attention_heads, self.seq_len, self.head_size, causal=self.causal
        )


class LayerNormRecord(_ForwardBackward):
    """LayerNorm over ``num_elements`` elements (sequence x hidden)."""

    op: Literal[OpKind.LAYERNORM] = OpKind.LAYERNORM
    num_elements: int = Field(ge=1)


class ElementwiseRecord(_TimedOnce):
    """An elementwise add of two ``num_elements`` vectors into a third: memory bandwidth."""

    op: Literal[OpKind.ELEMENTWISE] = OpKind.ELEMENTWISE
    num_elements: int = Field(ge=1)


class LayerRecord(_ForwardBackward):
    """One of the model's own layers on one tensor-parallel rank, at one micro-batch size.

    ``layer``: the local layer of one tensor-parallel rank (its share of the heads and the MLP),
    without collectives; a dense MLP also for a mixture-of-experts model. ``moe_layer`` (schema
    version 3): an MoE model's layer as the runtime builds it, router and every expert on the
    rank (expert-parallel degree 1), tensor-parallel degree 1. ``tp_layer``: the runtime's real
    tensor-parallel layer, collectives included, sequence parallel or not. ``output_layer``: the
    final norm, head and loss, split over the vocabulary under tensor parallelism, sequence
    parallel or not.
    """

    op: Literal[OpKind.LAYER, OpKind.MOE_LAYER, OpKind.TP_LAYER, OpKind.OUTPUT_LAYER]
    model: str = Field(description="The name of the model whose layer was timed.")
    tensor_parallel_degree: int = Field(ge=1)
    micro_batch_size: int = Field(ge=1)
    seq_len: int = Field(ge=1, description="The full sequence length, also when sequence parallelism splits it.")
    sequence_parallel: bool | None = Field(
        default=None, description="tp_layer and output_layer; None for layer and moe_layer."
    )

    @model_validator(mode="after")
    def _check_sequence_parallel(self) -> Self:
        local = self.op in (OpKind.LAYER, OpKind.MOE_LAYER)
        if (self.sequence_parallel is None) != local:
            raise SchemaError(
                f"a {self.op} record {'has no' if local else 'needs a'} sequence_parallel "
                f"(got {self.sequence_parallel!r}); only tp_layer and output_layer records say it"
            )
        return self


class OptimizerRecord(_TimedOnce):
    """One optimizer step over the ``num_parameters`` parameters of the model's own layer, held in
    ``dtype``, as the runtime steps them (``runtime.optim``: fused AdamW; bf16/fp16 weights through
    their fp32 masters, slice by slice). Before version 10 profiles held one, fp32 masters stepped
    by torch's default AdamW."""

    op: Literal[OpKind.OPTIMIZER] = OpKind.OPTIMIZER
    model: str = Field(description="The name of the model whose layer's parameters were stepped.")
    num_parameters: int = Field(ge=1)


class PipelineSlotRecord(_TimedOnce):
    """One slot of a tiny 1F1B schedule over ``num_stages`` stages: its bookkeeping and two transfers."""

    op: Literal[OpKind.PIPELINE_SLOT] = OpKind.PIPELINE_SLOT
    num_stages: int = Field(ge=2)


class ShardedUnitRecord(_TimedOnce):
    """Sharded data parallelism's (FSDP's) own time per unit and micro-batch, beyond compute and collectives."""

    op: Literal[OpKind.SHARDED_UNIT] = OpKind.SHARDED_UNIT
    zero_stage: ZeroStage
    deferred: bool = Field(description="Gradients reduced (and ZeRO-3 weights resharded) only at the last backward.")


OpRecord = Annotated[
    AttentionRecord
    | LayerNormRecord
    | ElementwiseRecord
    | LayerRecord
    | OptimizerRecord
    | PipelineSlotRecord
    | ShardedUnitRecord,
    Field(discriminator="op"),
]
"""Any measured op; its ``op`` says which record type it is."""


V1_SHAPES: Mapping[OpKind, tuple[str, ...]] = MappingProxyType(
    {
        OpKind.ATTENTION: ("batch_size", "num_attention_heads", "seq_len", "head_size"),
        OpKind.LAYERNORM: ("num_elements",),
        OpKind.ELEMENTWISE: ("num_elements",),
        OpKind.LAYER: ("tensor_parallel_degree", "micro_batch_size", "seq_len"),
        OpKind.TP_LAYER: ("tensor_parallel_degree", "micro_batch_size", "seq_len", "sequence_parallel"),
        OpKind.OUTPUT_LAYER: ("tensor_parallel_degree", "micro_batch_size", "seq_len", "sequence_parallel"),
        OpKind.OPTIMIZER: ("num_parameters",),
        OpKind.PIPELINE_SLOT: ("num_stages",),
        OpKind.SHARDED_UNIT: ("zero_stage", "deferred"),
    }
)
"""The named fields of each version-1 record's positional ``shape``, in order: the ops a
version-1 profile can hold."""
_V1_FLAGS = ("sequence_parallel", "deferred")
_TIMED_ONCE = frozenset({OpKind.ELEMENTWISE, OpKind.OPTIMIZER, OpKind.PIPELINE_SLOT, OpKind.SHARDED_UNIT})


def record_from_v1(raw: object, where: str) -> dict[str, object]:
    """A version-1 op record's JSON object as the current record's: the positional ``shape``
    named after ``V1_SHAPES`` (0/1 flags as booleans), the one timing of an op without a
    backward as ``time_s``, and an absent ``model`` left out.

    Raises:
        SchemaError: an unknown op or a shape of the wrong length, naming the record (``where``).
    """
    if not isinstance(raw, Mapping):
        raise SchemaError(f"{where}: an op record must be a mapping, not {raw!r}")
    record = {str(k): v for k, v in raw.items() if k != "shape" and not (k == "model" and v is None)}
    op = next((kind for kind in V1_SHAPES if kind == raw.get("op")), None)
    if op is None:
        kinds = ", ".join(V1_SHAPES)
        raise SchemaError(f"{where}: op {raw.get('op')!r} is not one of a version-1 profile's: {kinds}")
    names, shape = V1_SHAPES[op], raw.get("shape")
    if not isinstance(shape, list | tuple) or len(shape) != len(names):
        raise SchemaError(
            f"{where}: a version-1 {op} record's shape must be [{', '.join(names)}], got {shape!r}; "
            "profile the cluster again (planner profile) to write the current version"
        )
    for name, value in zip(names, shape, strict=True):
        record[name] = bool(value) if name in _V1_FLAGS and value in (0, 1) else value
    if op in _TIMED_ONCE:
        record["time_s"] = record.pop("fwd_time_s", None)
        if record.get("fwd_bwd_time_s", 0) is None:
            del record["fwd_bwd_time_s"]
    return record
