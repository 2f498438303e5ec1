"""Layout geometry: the rank order, stages and model chunks, micro-batches, and where the
vocabulary layers sit. Stated once here; the cost models, the runtime, the profiler and the
exports all read it.

Rank order: a (pipeline, data, tensor) mesh with the tensor axis fastest,
rank = stage * (D * t) + replica * t + shard, so a tensor-parallel group is t consecutive ranks
(one node, when it fits) and a data-parallel group is strided by t. Which device runs each rank
is the layout's ``DeviceMap`` (identity by default).

The data axis holds the D = d cp ranks of a stage and tensor shard that hold the same weights
(``Layout.dense_replicas``). Context parallelism splits it into (batch, cp), cp fastest
(``CONTEXT_MESH_AXES``, Megatron-Core's order tp, cp, dp, pp): replica = row_block * cp + ctx,
where ``row_block`` says which d-th of the batch the rank trains on and ``ctx`` which share of
each sequence (``context_chunks``). Without context parallelism (cp 1) the data axis is the d
replicas. Gradients are reduced, and ZeRO shards, over the whole data axis.

Expert parallelism splits the data axis into (edp, ep), ep fastest: an expert-parallel group is
ep consecutive replicas (g * ep .. g * ep + ep - 1), and the replicas at the same place of every
group (edp of them, strided by ep) hold the same experts. The dense mesh and rank order are
unchanged by it. With the experts folded (``Layout.folds_experts``: expert tensor parallelism 1
under t > 1, Megatron-Core's MoE parallel folding) the MoE layers split a stage's d t ranks
instead, in their rank order (``stage_rank`` = replica * t + shard, the tensor axis fastest): an
expert-parallel group is ep consecutive stage ranks (g * ep .. g * ep + ep - 1), and the stage
ranks at the same place of every group (d t / ep of them, strided by ep) hold the same experts.

Model chunks: p * v of them in pipeline order; pipeline rank ``s`` holds chunks s, s + p, ...
(Megatron-LM's interleaved schedule). Vocabulary layers: the token ids enter the pipeline at the
first chunk and its hidden states leave it at the last (``embedding_chunk``, ``output_chunk``).
Pinned (``VocabularyLayout.PINNED``), the input embedding sits with the first chunk and the final
norm, output layer and loss with the last. Split over the pipeline (``VOCAB_1``, ``VOCAB_2``),
every pipeline rank holds the rows ``vocabulary_rows`` of the embedding and of the output layer,
and the last rank the final norm and the loss's reduction.
"""

import functools
from enum import StrEnum

from planner.schemas.enums import Schedule
from planner.schemas.layout import Layout
from planner.schemas.model import ModelSpec


class MeshAxis(StrEnum):
    """Axes of a layout's device mesh, in mesh order (slowest first)."""

    PP = "pp"
    DP = "dp"
    """The d cp ranks holding the same weights (d replicas, each sequence split over cp)."""
    TP = "tp"


MESH_AXES: tuple[MeshAxis, ...] = (MeshAxis.PP, MeshAxis.DP, MeshAxis.TP)
"""The mesh's axes, slowest first: the rank order of every layout."""


class ExpertMeshAxis(StrEnum):
    """The two axes the MoE layers split a stage's expert ranks into, slowest first."""

    EDP = "edp"
    """Ranks holding the same experts, one per expert-parallel group (``Layout.expert_data_parallel_degree``)."""
    EP = "ep"
    """Ranks of one expert-parallel group, exchanging tokens (ep)."""


EXPERT_MESH_AXES: tuple[MeshAxis | ExpertMeshAxis, ...] = (
    MeshAxis.PP,
    ExpertMeshAxis.EDP,
    ExpertMeshAxis.EP,
    MeshAxis.TP,
)
"""The expert mesh's axes, slowest first: the dense mesh with its data axis split, or, with the
experts folded, its (data, tensor) axes split and a tensor axis of size 1."""


class ShardingMeshAxis(StrEnum):
    """The two axes ZeRO's groups split the data axis into (HSDP; a secondary partition), slowest first."""

    REPLICATE = "dp_replicate"
    """Groups of consecutive data-parallel ranks, one rank per group holding the same shard."""
    SHARD = "dp_shard"
    """Ranks of one group, sharing the states out (consecutive data-parallel ranks)."""


SHARDING_MESH_AXES: tuple[MeshAxis | ShardingMeshAxis, ...] = (
    MeshAxis.PP,
    ShardingMeshAxis.REPLICATE,
    ShardingMeshAxis.SHARD,
    MeshAxis.TP,
)
"""A sharding mesh's axes, slowest first: the dense mesh with its data axis split into groups of
consecutive ranks; data-parallel rank ``replica`` is (replica // size, replica % size), so the
rank order is the dense mesh's."""


class ContextMeshAxis(StrEnum):
    """The two axes context parallelism splits the data axis into, slowest first."""

    BATCH = "dp_batch"
    """Ranks training on different rows of the batch (d of them, strided by cp)."""
    CP = "cp"
    """Ranks of one context-parallel group, each holding a share of the same sequences (cp
    consecutive data-axis ranks)."""


CONTEXT_MESH_AXES: tuple[MeshAxis | ContextMeshAxis, ...] = (
    MeshAxis.PP,
    ContextMeshAxis.BATCH,
    ContextMeshAxis.CP,
    MeshAxis.TP,
)
"""The context mesh's axes, slowest first: the dense mesh with its data axis split into
(batch, cp); data-axis rank ``replica`` is (replica // cp, replica % cp), so the rank order is
the dense mesh's."""


def context_mesh_shape(layout: Layout) -> tuple[int, int, int, int]:
    """Sizes of the context mesh's axes in ``CONTEXT_MESH_AXES`` order: (p, d, cp, t)."""
    p, _, t = mesh_shape(layout)
    return p, layout.data_parallel_degree, layout.context_parallel_degree, t


def context_coordinates(layout: Layout, replica: int) -> tuple[int, int]:
    """(row block, context rank) of data-axis rank ``replica``: which d-th of the batch it
    trains on and which share of each sequence it holds."""
    return divmod(replica, layout.context_parallel_degree)


def context_chunks(context_parallel_degree: int, context_rank: int) -> tuple[int, int]:
    """The two of a sequence's 2 cp equal chunks that context rank ``context_rank`` holds:
    (r, 2 cp - 1 - r). Under causal attention a token attends to those before it, so pairing an
    early chunk with a late one gives every rank the same work (the zig-zag split of
    Megatron-Core's and torchtitan's context parallelism)."""
    cp = context_parallel_degree
    if not 0 <= context_rank < cp:
        raise ValueError(f"context_rank={context_rank} must be in 0..{cp - 1}")
    return context_rank, 2 * cp - 1 - context_rank


def splits_into_context_chunks(seq_len: int, context_parallel_degree: int) -> bool:
    """Whether the zig-zag split can cut a sequence of ``seq_len`` tokens into the 2 cp equal
    chunks that ``context_chunks`` hands out: whether 2 cp divides ``seq_len``."""
    return seq_len % (2 * context_parallel_degree) == 0


def splits_for_all_to_all(seq_len: int, query_heads: int, context_parallel_degree: int) -> bool:
    """Whether all-to-all context parallelism (DeepSpeed-Ulysses) over ``context_parallel_degree``
    ranks can run: cp equal contiguous chunks of a sequence of ``seq_len`` tokens, and
    ``query_heads`` (a tensor-parallel rank's) shared out evenly, 1/cp to each rank."""
    return seq_len % context_parallel_degree == 0 and query_heads % context_parallel_degree == 0


def sharding_mesh_shape(layout: Layout, group_size: int) -> tuple[int, int, int, int]:
    """Sizes of the sharding mesh's axes in ``SHARDING_MESH_AXES`` order for groups of
    ``group_size`` consecutive data-axis ranks (a divisor of D = d cp): (p, D / group_size, group_size, t)."""
    p, d, t = mesh_shape(layout)
    if group_size < 1 or d % group_size:
        raise ValueError(f"group_size={group_size} must divide the data axis's {d} ranks")
    return p, d // group_size, group_size, t


def expert_mesh_shape(layout: Layout) -> tuple[int, int, int, int]:
    """Sizes of the expert mesh's axes in ``EXPERT_MESH_AXES`` order: (p, D / ep, ep, t), or
    (p, D t / ep, ep, 1) with the experts folded (each expert whole on its rank); D = d cp."""
    p, _, t = mesh_shape(layout)
    ep = layout.expert_parallel_degree
    return p, layout.expert_data_parallel_degree, ep, 1 if layout.folds_experts else t


def expert_rank_of(layout: Layout, stage: int, group: int, place: int, shard: int = 0) -> int:
    """Global rank of expert-mesh coordinate (stage, expert-parallel group, place in it, tensor
    shard): the expert mesh is the dense mesh's rank order reshaped, so
    stage * D t + (group * ep + place) * t' + shard, t' = t (the replica is group * ep + place),
    or 1 folded (the stage rank is group * ep + place; ``shard`` is then 0); D = d cp."""
    _, _, ep, shards = expert_mesh_shape(layout)
    _, d, t = mesh_shape(layout)
    return stage * d * t + (group * ep + place) * shards + shard


def expert_axis_stride(layout: Layout, axis: ExpertMeshAxis) -> int:
    """Ranks between neighbours along an expert-mesh axis: t' for ep, ep t' for edp (t' = t, or
    1 folded)."""
    _, _, ep, shards = expert_mesh_shape(layout)
    return shards if axis is ExpertMeshAxis.EP else ep * shards


def stage_rank(layout: Layout, replica: int, shard: int) -> int:
    """Place of mesh coordinate (replica, shard) among its stage's D t ranks: replica * t + shard."""
    return replica * layout.tensor_parallel_degree + shard


def mesh_shape(layout: Layout) -> tuple[int, int, int]:
    """Sizes of the mesh's axes in ``MESH_AXES`` order: (p, D, t), D = d cp."""
    return layout.pipeline_parallel_degree, layout.dense_replicas, layout.tensor_parallel_degree


def rank_of(layout: Layout, stage: int, replica: int, shard: int) -> int:
    """Global rank of mesh coordinate (stage, replica, shard); ``replica`` is a data-axis rank
    (0..d cp - 1)."""
    _, d, t = mesh_shape(layout)
    return stage * d * t + stage_rank(layout, replica, shard)


def axis_stride(layout: Layout, axis: MeshAxis) -> int:
    """Ranks between neighbours along ``axis``: D * t for pp, t for dp, 1 for tp (D = d cp)."""
    _, d, t = mesh_shape(layout)
    return {MeshAxis.PP: d * t, MeshAxis.DP: t, MeshAxis.TP: 1}[axis]


def coordinates(layout: Layout, rank: int) -> tuple[int, int, int]:
    """Mesh coordinate (stage, replica, shard) of ``rank``; ``replica`` is a data-axis rank."""
    _, d, t = mesh_shape(layout)
    stage, rest = divmod(rank, d * t)
    replica, shard = divmod(rest, t)
    return stage, replica, shard


def chunk_layers(model: ModelSpec, layout: Layout) -> tuple[int, ...]:
    """Transformer layers of each model chunk in pipeline order (p * v entries).

    Uses the layout's explicit split, else splits evenly and gives the remainder to the
    chunks after the first, which also holds the embedding.
    """
    if layout.layer_split is not None:
        return layout.layer_split
    return _even_split(model.num_hidden_layers, layout.num_chunks)


@functools.lru_cache(maxsize=256)
def _even_split(layers: int, chunks: int) -> tuple[int, ...]:
    """``chunk_layers`` without an explicit split (memoized: a search asks it for every layout)."""
    base, extra = divmod(layers, chunks)
    receivers = set(range(1, extra + 1)) if extra < chunks else set(range(chunks))
    return tuple(base + (1 if c in receivers else 0) for c in range(chunks))


def accounted_split(layers: int, chunks: int, *, embedding: bool = True, loss: bool = True) -> tuple[int, ...]:
    """Transformer layers per chunk when the embedding and the loss each count as one layer of
    the split (Megatron-LM's ``account_for_embedding_in_pipeline_split`` and
    ``account_for_loss_in_pipeline_split``): L + e + l slots split evenly (Megatron requires them
    to divide; the remainder goes to the middle chunks here), the first chunk's slot taken by the
    embedding, the last chunk's by the loss."""
    slots = list(_even_split(layers + int(embedding) + int(loss), chunks))
    slots[0] -= int(embedding)
    slots[-1] -= int(loss)
    return tuple(slots)


def stage_chunks(layout: Layout, stage: int) -> tuple[int, ...]:
    """Chunks held by pipeline rank ``stage``: stage, stage + p, stage + 2p, ..."""
    return chunks_of_stage(layout.pipeline_parallel_degree, layout.virtual_stages, stage)


def chunks_of_stage(stages: int, chunks_per_stage: int, stage: int) -> tuple[int, ...]:
    """``stage_chunks`` of a pipeline of ``stages`` ranks (p) holding ``chunks_per_stage`` (v) each."""
    return tuple(stage + i * stages for i in range(chunks_per_stage))


def chunk_layer_range(model: ModelSpec, layout: Layout, chunk: int) -> range:
    """Indices of the transformer layers of model chunk ``chunk``."""
    counts = chunk_layers(model, layout)
    first = sum(counts[:chunk])
    return range(first, first + counts[chunk])


def stage_layers(model: ModelSpec, layout: Layout) -> tuple[int, ...]:
    """Transformer layers held by each pipeline rank (all its chunks).

    Memoized on the split (every stage's memory and time asks for it, for every layout a search
    checks, and layouts share a few splits).
    """
    return _stage_layers(chunk_layers(model, layout), layout.pipeline_parallel_degree, layout.virtual_stages)


@functools.lru_cache(maxsize=1024)
def _stage_layers(per_chunk: tuple[int, ...], stages: int, chunks_per_stage: int) -> tuple[int, ...]:
    return tuple(sum(per_chunk[c] for c in chunks_of_stage(stages, chunks_per_stage, s)) for s in range(stages))


def embedding_chunk(layout: Layout) -> int:
    """The model chunk whose input is the embedding's output."""
    return 0


def output_chunk(layout: Layout) -> int:
    """The model chunk whose output goes to the final norm, the output layer and the loss."""
    return layout.num_chunks - 1


def chunk_stage(layout: Layout, chunk: int) -> int:
    """The pipeline rank that holds model chunk ``chunk`` (the inverse of ``stage_chunks``)."""
    return chunk % layout.pipeline_parallel_degree


def holds_embedding(layout: Layout, stage: int) -> bool:
    """Whether pipeline rank ``stage`` holds the whole input embedding (pinned layouts only)."""
    return not layout.vocabulary_layout.over_pipeline and chunk_stage(layout, embedding_chunk(layout)) == stage


def holds_output_layer(layout: Layout, stage: int) -> bool:
    """Whether pipeline rank ``stage`` holds the whole output layer and the loss (pinned layouts only)."""
    return not layout.vocabulary_layout.over_pipeline and chunk_stage(layout, output_chunk(layout)) == stage


def tied_copy_stages(model: ModelSpec, layout: Layout) -> tuple[int, int] | None:
    """The (embedding, output layer) pipeline ranks of a tied embedding held twice, whose two
    copies' gradients are summed every step; None when there is one copy: untied, both layers on
    one rank, or the vocabulary split over the pipeline (each rank's rows serve both)."""
    if not model.tie_word_embeddings or layout.vocabulary_layout.over_pipeline:
        return None
    first, last = chunk_stage(layout, embedding_chunk(layout)), chunk_stage(layout, output_chunk(layout))
    return None if first == last else (first, last)


def vocabulary_share(layout: Layout, stage: int) -> tuple[float, float]:
    """(embedding, output layer) shares pipeline rank ``stage`` holds of the vocabulary layers'
    weights and work: all or nothing pinned, 1/p each split over the pipeline."""
    if layout.vocabulary_layout.over_pipeline:
        share = 1.0 / layout.pipeline_parallel_degree
        return share, share
    return float(holds_embedding(layout, stage)), float(holds_output_layer(layout, stage))


def vocabulary_rows(vocab_size: int, layout: Layout, stage: int) -> range:
    """The vocabulary rows pipeline rank ``stage`` holds of the embedding and the output layer
    when they are split over the pipeline: contiguous blocks, the first V mod p one row longer;
    every row when pinned."""
    if not layout.vocabulary_layout.over_pipeline:
        return range(vocab_size)
    base, extra = divmod(vocab_size, layout.pipeline_parallel_degree)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def num_micro_batches(global_batch_size: int, layout: Layout) -> int:
    """Micro-batches per step on one data-parallel replica: B / (d b), assumed whole."""
    return global_batch_size // (layout.data_parallel_degree * layout.micro_batch_size)


def pipeline_schedules(layout: Layout, flushes: int) -> int:
    """Pipeline schedules a step runs: the training's ``pipeline_flushes`` (``flushes``) with a
    pipeline, 1 without one (the step's micro-batches then form no schedule to fill or drain)."""
    return flushes if layout.pipeline_parallel_degree > 1 else 1


def in_flight_micro_batches(layout: Layout, stage: int, micro_batches: int, *, vocabulary_warmup: bool = True) -> float:
    """Micro-batches of a whole stage's activations held at the stage's peak.

    GPipe holds all m; 1F1B holds p - r on rank r, and 1 or 2 more under a vocabulary split
    over the pipeline (``VocabularyLayout.extra_in_flight``: Vocabulary Parallelism's p + 1 and
    p + 2) unless ``vocabulary_warmup`` is False (the planner's runtime runs the passes within
    torch's own 1F1B, without that warm-up); interleaved holds its warm-up chunks plus one, each
    1/v of the stage (Megatron-LM's warm-up depth, (p - r - 1) * 2 + (v - 1) * p forward chunks
    before the first backward on rank r). Capped by what the step has.
    """
    p, v, m = layout.pipeline_parallel_degree, layout.virtual_stages, micro_batches
    if layout.schedule is Schedule.GPIPE:
        return float(m)
    if layout.schedule is Schedule.ONE_F_ONE_B:  # and a vocabulary split's extra warm-up
        extra = layout.vocabulary_layout.extra_in_flight if vocabulary_warmup else 0
        return float(min(p - stage + extra, m))
    warmup_chunks = (p - stage - 1) * 2 + (v - 1) * p
    return min(warmup_chunks + 1, m * v) / v


def stage_edge_layers(model: ModelSpec, layout: Layout, edge: int) -> tuple[tuple[int, int], ...]:
    """(dense, MoE) layers of each pipeline rank among the model's first ``edge`` and last
    ``edge`` layers (what an FP8 recipe keeps in bf16: ``TrainingSpec.fp8_bf16_layers``)."""
    if edge == 0:
        return ((0, 0),) * layout.pipeline_parallel_degree
    total = model.num_hidden_layers
    out = []
    for stage in range(layout.pipeline_parallel_degree):
        layers = [i for c in stage_chunks(layout, stage) for i in chunk_layer_range(model, layout, c)]
        edges = [i for i in layers if i < edge or i >= total - edge]
        moe = sum(1 for i in edges if model.is_moe_layer(i))
        out.append((len(edges) - moe, moe))
    return tuple(out)
