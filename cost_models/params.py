"""Parameter counts of a decoder transformer, whole and per tensor-parallel rank.

For a GPT block (LayerNorm, biases, 4h GELU MLP, learned positions, tied embeddings) the total
reproduces Narayanan et al. (SC21) eq. 2, P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12lh)), plus the
final LayerNorm (2h) that the equation leaves out. What one rank of a pipeline stage holds
(``stage_params``) follows Megatron-LM's placement. Units: parameters (elements).
"""

import functools
import itertools
from dataclasses import dataclass

from cost_models.layout_validity import check_stage
from planner.schemas import Layout, ModelSpec, NormKind, PositionEmbedding
from planner.schemas.geometry import (
    chunk_layers,
    chunk_stage,
    chunks_of_stage,
    embedding_chunk,
    output_chunk,
    stage_layers,
    vocabulary_share,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerParams:
    """Parameters of one transformer layer on one tensor-parallel rank."""

    attention: float
    """Attention projections (and biases, q/k norms), the head-split part divided by the
    tensor-parallel group, MLA's down-projections and their norms replicated."""
    mlp: float
    """Dense MLP, or all routed experts this rank holds, split over expert parallelism and (unless
    the experts are whole on each rank) tensor parallelism."""
    router: float
    """MoE gate, replicated."""
    norms: float
    """The two norms, replicated over the tensor-parallel group."""
    shared: float = 0.0
    """Shared experts of an MoE layer, split over the tensor-parallel group, and their gate."""

    @property
    def total(self) -> float:
        """All parameters of the layer on this rank."""
        return self.attention + self.mlp + self.router + self.norms + self.shared


def norm_params(model: ModelSpec) -> int:
    """One norm: LayerNorm has weight and bias (2h), RMSNorm a weight (h)."""
    return 2 * model.hidden_size if model.norm_type is NormKind.LAYERNORM else model.hidden_size


def attention_params(model: ModelSpec) -> int:
    """Standard: q and o are h x (a*hd), k and v h x (kv*hd) each (grouped-query attention),
    plus Qwen3's q/k RMSNorm weights (hd each). MLA (transformers' ``DeepseekV3Attention``):
    q = h x a*dqk, or q_a (h x rq) + its RMSNorm (rq) + q_b (rq x a*dqk); kv_a h x (rkv + dr) +
    its RMSNorm (rkv); kv_b rkv x a*(dn + dv); o (a*dv) x h; attention_bias on q_a, kv_a and o."""
    h, a = model.hidden_size, model.num_attention_heads
    if model.is_mla:
        rkv, rope = model.kv_lora_rank or 0, model.qk_rope_head_dim or 0
        q_dim, v_dim = a * model.qk_head_size, a * model.v_head_size
        rq = model.q_lora_rank
        query = h * q_dim if rq is None else h * rq + rq + rq * q_dim
        kv = h * (rkv + rope) + rkv + rkv * (a * (model.qk_nope_head_dim or 0) + v_dim)
        biases = ((rq or 0) + rkv + rope + h) if model.attention_bias else 0
        return query + kv + v_dim * h + biases
    q_dim, kv_dim = a * model.head_size, model.kv_heads * model.head_size
    weights = 2 * h * q_dim + 2 * h * kv_dim
    qkv_bias = model.attention_bias if model.qkv_bias is None else model.qkv_bias
    biases = (q_dim + 2 * kv_dim if qkv_bias else 0) + (h if model.attention_bias else 0)
    return weights + biases + attention_replicated_params(model)


def attention_replicated_params(model: ModelSpec) -> int:
    """Attention parameters every tensor-parallel rank holds whole: MLA's down-projections
    (q_a, kv_a), their norms and biases (Megatron-Core's MLA keeps them duplicated), and Qwen3's
    per-head q/k norm weights."""
    h = model.hidden_size
    if model.is_mla:
        rq, rkv, rope = model.q_lora_rank or 0, model.kv_lora_rank or 0, model.qk_rope_head_dim or 0
        biases = (rq + rkv + rope) if model.attention_bias else 0
        return h * rq + rq + h * (rkv + rope) + rkv + biases
    return 2 * model.head_size if model.qk_norm else 0


def _mlp_params(model: ModelSpec, width: int) -> int:
    h, matrices = model.hidden_size, 3 if model.hidden_act.gated else 2
    biases = ((matrices - 1) * width + h) if model.mlp_bias else 0
    return matrices * h * width + biases


def dense_mlp_params(model: ModelSpec) -> int:
    """The MLP of a dense layer, f = intermediate_size wide: gated SwiGLU has 3 h x f matrices, GELU 2."""
    return _mlp_params(model, model.ffn_size)


def expert_mlp_params(model: ModelSpec) -> int:
    """One routed expert, moe_intermediate_size (else f) wide."""
    return _mlp_params(model, model.expert_ffn_size)


def shared_expert_params(model: ModelSpec) -> int:
    """Shared experts of one MoE layer as one MLP (``ModelSpec.shared_ffn_size``), plus Qwen2-MoE's
    h x 1 gate; 0 without shared experts."""
    if not model.shared_ffn_size:
        return 0
    return _mlp_params(model, model.shared_ffn_size) + (model.hidden_size if model.has_shared_expert_gate else 0)


def router_params(model: ModelSpec) -> int:
    """MoE gate of one MoE layer: E x h (DeepSeek-V3's e_score_correction_bias is a buffer, not a
    parameter); none for a dense model."""
    return model.hidden_size * model.num_local_experts if model.is_moe else 0


def layer_params(
    model: ModelSpec,
    *,
    tensor_parallel_degree: int = 1,
    expert_parallel_degree: int = 1,
    moe: bool | None = None,
    experts_per_rank: int | None = None,
    expert_tensor_parallel_degree: int | None = None,
) -> LayerParams:
    """One layer's parameters on one rank: matrices split by t, experts split by ep (and by
    ``expert_tensor_parallel_degree``, t when None; 1 keeps each expert whole), norms replicated.

    ``moe`` says which kind of layer (``ModelSpec.is_moe_layer``); None means the model's MoE
    layer if it has any, else its dense layer. ``experts_per_rank``: the experts a rank hosts
    when a placement gives it replica slots (``ExpertPlacement.slots_per_rank``); None: E / ep.
    """
    t = tensor_parallel_degree
    replicated = attention_replicated_params(model)
    attention = (attention_params(model) - replicated) / t + replicated
    norms = 2 * norm_params(model)
    if not (model.is_moe if moe is None else moe):
        return LayerParams(attention=attention, mlp=dense_mlp_params(model) / t, router=0, norms=norms)
    experts_here = experts_per_rank or model.num_local_experts / expert_parallel_degree
    etp = t if expert_tensor_parallel_degree is None else expert_tensor_parallel_degree
    gate = model.hidden_size if model.has_shared_expert_gate else 0
    return LayerParams(
        attention=attention,
        mlp=experts_here * expert_mlp_params(model) / etp,
        router=router_params(model),
        norms=norms,
        shared=(shared_expert_params(model) - gate) / t + gate,
    )


def embedding_params(model: ModelSpec) -> int:
    """Token embedding V x h, plus learned positions when the model has them."""
    positions = (
        model.max_position_embeddings * model.hidden_size
        if model.position_embedding_type is PositionEmbedding.ABSOLUTE
        else 0
    )
    return model.vocab_size * model.hidden_size + positions


def output_params(model: ModelSpec) -> int:
    """Final norm plus the output projection h x V when it is not tied to the embedding."""
    head = 0 if model.tie_word_embeddings else model.vocab_size * model.hidden_size
    return norm_params(model) + head


def total_params(model: ModelSpec) -> int:
    """Every parameter of the model, as transformers builds it (DeepSeek-V3's multi-token
    prediction layers, which transformers leaves out, are not counted)."""
    common = attention_params(model) + 2 * norm_params(model)
    moe_layers = model.num_moe_layers
    moe_layer = model.num_local_experts * expert_mlp_params(model) + shared_expert_params(model) + router_params(model)
    dense_layers = model.num_hidden_layers - moe_layers
    layers = model.num_hidden_layers * common + dense_layers * dense_mlp_params(model) + moe_layers * moe_layer
    return layers + embedding_params(model) + output_params(model)


def active_params(model: ModelSpec) -> int:
    """Parameters one token passes through: only the top-k routed experts of each MoE layer."""
    inactive = (model.num_local_experts - model.num_experts_per_tok) * expert_mlp_params(model)
    return total_params(model) - model.num_moe_layers * inactive


def stage_moe_layers(model: ModelSpec, layout: Layout) -> tuple[int, ...]:
    """MoE layers held by each pipeline rank (``ModelSpec.is_moe_layer`` over its chunks' layers);
    the rest of ``geometry.stage_layers`` are dense. Memoized on the split (layouts share a few)."""
    p, v = layout.pipeline_parallel_degree, layout.virtual_stages
    return _moe_layers_per_stage(model, chunk_layers(model, layout), p, v)


@functools.lru_cache(maxsize=1024)
def _moe_layers_per_stage(
    model: ModelSpec, per_chunk: tuple[int, ...], stages: int, chunks_per_stage: int
) -> tuple[int, ...]:
    first = (0, *itertools.accumulate(per_chunk))  # each chunk's first layer, then the end
    return tuple(
        sum(model.moe_layers_in(range(first[c], first[c + 1])) for c in chunks_of_stage(stages, chunks_per_stage, s))
        for s in range(stages)
    )


def partially_recomputed(model: ModelSpec, layout: Layout) -> tuple[tuple[int, int], ...]:
    """Per pipeline rank, (dense, MoE) layers it recomputes in full under ``Layout.recompute_layers``
    (the stage's first ones; its others keep everything); (0, 0) each without it, where the
    layout's ``recompute`` applies to every layer."""
    if layout.recompute_layers is None:
        return ((0, 0),) * layout.pipeline_parallel_degree
    first = (0, *itertools.accumulate(chunk_layers(model, layout)))  # one chunk per stage (the layout checks)
    moe = [model.moe_layers_in(range(first[s], first[s] + r)) for s, r in enumerate(layout.recompute_layers)]
    return tuple((r - m, m) for r, m in zip(layout.recompute_layers, moe, strict=True))


def activation_offloaded(model: ModelSpec, layout: Layout) -> tuple[int, int]:
    """(dense, MoE) layers whose activations ``Layout.activation_offload_layers`` keeps on the host:
    the model's first ones (the layout has one stage then)."""
    layers = layout.activation_offload_layers
    moe = model.moe_layers_in(range(layers)) if layers else 0
    return layers - moe, moe


@dataclass(frozen=True, slots=True, kw_only=True)
class StageParams:
    """Parameters one rank of a pipeline stage holds, before ZeRO sharding."""

    dense: float
    """Parameters replicated over the whole data-parallel group (ZeRO shards them over d)."""
    expert: float
    """MoE expert parameters, replicated over the ``Layout.expert_data_parallel_degree`` ranks
    (d / ep, or d t / ep folded), which ZeRO shards them over."""
    largest_unit: float
    """Parameters of the largest module ZeRO-3 gathers at once (a layer's sharded part, the
    embedding or the output layer)."""
    largest_layer_unit: float = 0.0
    """The largest transformer layer's unit (what an FP8 weight gather gathers in FP8)."""
    largest_vocabulary_unit: float = 0.0
    """The larger of the embedding's and the output layer's units (gathered in the training
    precision under any FP8 recipe)."""
    largest_reduced_unit: float = 0.0
    """Parameters of the largest unit whose gradients ZeRO 2-3 reduce while the backward still
    runs: a layer, or the final norm with the output layer (not the embedding, nor a tied output
    layer in its unit: reduced last, after every activation is freed)."""
    embedding_share: float
    """Share of the word embedding's rows the stage holds (``geometry.vocabulary_share``): 1 on
    the embedding's stage when pinned, 1/p everywhere when split over the pipeline."""
    output_share: float
    """Share of the output layer's rows (and of its and the loss's work) the stage holds."""
    units: int = 1
    """Modules sharded and gathered one at a time under ZeRO 2-3: one per transformer layer, one
    for the embedding and one for the final norm with the output layer the stage holds (a tied
    output layer shares its embedding's), as torchtitan wraps them and our runtime
    (``runtime.data_parallel.vocabulary_units``); each costs its own collectives."""

    @property
    def holds_embedding(self) -> bool:
        """Whether the stage holds the whole input embedding (``geometry.holds_embedding``)."""
        return self.embedding_share == 1.0

    @property
    def holds_output_layer(self) -> bool:
        """Whether the stage holds the whole final norm, output layer and loss
        (``geometry.holds_output_layer``)."""
        return self.output_share == 1.0

    @property
    def total(self) -> float:
        """All parameters on the rank."""
        return self.dense + self.expert


def stage_params(model: ModelSpec, layout: Layout, stage: int) -> StageParams:
    """Parameters one rank of pipeline stage ``stage`` holds (``all_stage_params``).

    Its transformer layers (``stage_layers``, of which ``stage_moe_layers`` are MoE) split over t
    and, for routed experts, over ep and the expert-tensor-parallel degree (t, or 1 with the
    experts folded: ``Layout.folds_experts``); the stage
    holding the embedding (``geometry.holds_embedding``) the word embedding split over t
    (vocabulary-parallel) plus learned positions, replicated; the stage holding the output layer
    the final norm and the output layer split over t. With tied embeddings a stage that holds the
    output layer but not the embedding keeps its own copy of the embedding matrix (Megatron-LM);
    where one stage holds both, the one copy serves both. With the vocabulary split over the
    pipeline every stage holds V/p rows of each (not split over t: ``cost_models.vocabulary``),
    one set of rows serving both when tied, the first stage the positions, the last the norm.

    Raises:
        SchemaError: ``stage`` is not a pipeline rank of ``layout``.
    """
    check_stage(layout, stage)
    return all_stage_params(model, layout)[stage]


@functools.lru_cache(maxsize=256)
def all_stage_params(model: ModelSpec, layout: Layout) -> tuple[StageParams, ...]:
    """``stage_params`` of every pipeline rank, in pipeline order: what the stages share (their
    layers, the vocabulary layers' stages) worked out once. Memoized: memory, time, the optimizer
    and the estimate each ask for the same layout in turn (inputs are immutable)."""
    ep = layout.expert_parallel_degree if model.is_moe else 1
    t = layout.tensor_parallel_degree
    experts_sharded = layout.expert_data_parallel_degree > 1
    vocabulary_t = 1 if layout.vocabulary_layout.over_pipeline else t
    first, last = chunk_stage(layout, embedding_chunk(layout)), chunk_stage(layout, output_chunk(layout))
    slots = layout.expert_placement.slots_per_rank if layout.expert_placement is not None else None
    return tuple(
        _stage_params(
            model,
            t,
            ep,
            layout.expert_tensor_degree,
            experts_sharded,
            layers,
            moe,
            *vocabulary_share(layout, stage),
            vocabulary_t,
            first == stage,
            last == stage,
            slots,
        )
        for stage, (layers, moe) in enumerate(
            zip(stage_layers(model, layout), stage_moe_layers(model, layout), strict=True)
        )
    )


@functools.lru_cache(maxsize=4096)
def _stage_params(
    model: ModelSpec,
    t: int,
    ep: int,
    etp: int,
    experts_sharded: bool,
    layers_here: int,
    moe_here: int,
    embedding_share: float,
    output_share: float,
    vocabulary_t: int,
    first: bool,
    last: bool,
    slots: int | None,
) -> StageParams:
    """``stage_params`` of what it reads of the layout: t, ep, the expert-tensor-parallel degree,
    whether more than one rank holds the same experts (d / ep, or d t / ep folded), the stage's
    layers and MoE layers, its shares of the vocabulary layers and the tensor-parallel ranks that
    split their rows (t pinned, 1 split over the pipeline), whether it is the first (learned
    positions) and the last stage (final norm), and the expert slots per rank of its placement
    (None: E / ep). Memoized on those: the many layouts of a search that differ in anything else
    (micro-batch, ZeRO, recompute, ...) share it."""
    dense_here = layers_here - moe_here
    units: list[float] = []
    dense = 0.0
    if dense_here:
        dense_layer = layer_params(model, tensor_parallel_degree=t, moe=False)
        dense += dense_here * dense_layer.total
        units.append(dense_layer.total)
    expert_per_layer = 0.0
    if moe_here:
        moe_layer = layer_params(
            model,
            tensor_parallel_degree=t,
            expert_parallel_degree=ep,
            moe=True,
            experts_per_rank=slots,
            expert_tensor_parallel_degree=etp,
        )
        expert_per_layer = moe_layer.mlp
        dense += moe_here * (moe_layer.total - expert_per_layer)
        # Experts one rank alone holds (d / ep = 1, or d t / ep folded) are not sharded: ZeRO-3 gathers none.
        experts_gathered = expert_per_layer if experts_sharded else 0.0
        units.append(moe_layer.total - expert_per_layer + experts_gathered)
    word_embedding = model.vocab_size * model.hidden_size / vocabulary_t
    positions = embedding_params(model) - model.vocab_size * model.hidden_size
    embedding = embedding_share * word_embedding + (positions if first else 0.0)
    reduced = layer_unit = max(units, default=0.0)  # the layers'; the embedding's unit is reduced last
    if embedding:
        dense += embedding
        units.append(embedding)
    # A tied output layer reuses the embedding rows held on the same rank.
    head = output_share * word_embedding if not (model.tie_word_embeddings and embedding_share) else 0.0
    output = head + (norm_params(model) if last else 0.0)
    if output_share:
        dense += output
        units.append(output)
        reduced = max(reduced, output)
    return StageParams(
        dense=dense,
        expert=moe_here * expert_per_layer,
        largest_unit=max(units, default=0.0),
        largest_layer_unit=layer_unit,
        largest_vocabulary_unit=max(embedding, output if output_share else 0.0),
        largest_reduced_unit=reduced,
        embedding_share=embedding_share,
        output_share=output_share,
        units=max(1, layers_here + (1 if embedding else 0) + (1 if head else 0)),
    )
