"""Parameter counts of a decoder transformer, whole and per tensor-parallel rank.

For a GPT block (LayerNorm, biases, 4h GELU MLP, learned positions, tied embeddings) the total
reproduces Narayanan et al. (SC21) eq. 2, P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12lh)), plus the
final LayerNorm (2h) that the equation leaves out. What one rank of a pipeline stage holds
(``stage_params``) follows Megatron-LM's placement. Units: parameters (elements).
"""

import functools
from dataclasses import dataclass

from cost_models.validate import check_stage
from planner.schemas import Layout, ModelSpec, NormKind, PositionEmbedding
from planner.schemas.geometry import holds_embedding, holds_output_layer, stage_layers


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerParams:
    """Parameters of one transformer layer on one tensor-parallel rank."""

    attention: float
    """q, k, v, output projections (and biases), split over the tensor-parallel group."""
    mlp: float
    """Dense MLP, or all experts this rank holds, split over tensor and expert parallelism."""
    router: float
    """MoE gate, replicated."""
    norms: float
    """The two norms, replicated over the tensor-parallel group."""

    @property
    def total(self) -> float:
        """All parameters of the layer on this rank."""
        return self.attention + self.mlp + self.router + self.norms


def norm_params(model: ModelSpec) -> int:
    """One norm: LayerNorm has weight and bias (2h), RMSNorm a weight (h)."""
    return 2 * model.hidden_size if model.norm_type is NormKind.LAYERNORM else model.hidden_size


def attention_params(model: ModelSpec) -> int:
    """q and o are h x (a*hd); k and v are h x (kv*hd) each (grouped-query attention)."""
    h, q_dim, kv_dim = (
        model.hidden_size,
        model.num_attention_heads * model.head_size,
        model.kv_heads * model.head_size,
    )
    weights = 2 * h * q_dim + 2 * h * kv_dim
    biases = (q_dim + 2 * kv_dim + h) if model.attention_bias else 0
    return weights + biases


def expert_mlp_params(model: ModelSpec) -> int:
    """One MLP (one expert): gated SwiGLU has 3 h x f matrices, GELU 2."""
    h, f = model.hidden_size, model.ffn_size
    matrices = 3 if model.hidden_act.gated else 2
    biases = ((matrices - 1) * f + h) if model.mlp_bias else 0
    return matrices * h * f + biases


def router_params(model: ModelSpec) -> int:
    """MoE gate: h x E; none for a dense model."""
    return model.hidden_size * model.num_local_experts if model.is_moe else 0


def layer_params(model: ModelSpec, *, tensor_parallel_degree: int = 1, expert_parallel_degree: int = 1) -> LayerParams:
    """One layer's parameters on one rank: matrices split by t, experts split by ep, norms replicated."""
    t = tensor_parallel_degree
    experts_here = model.num_local_experts / expert_parallel_degree if model.is_moe else 1
    return LayerParams(
        attention=attention_params(model) / t,
        mlp=experts_here * expert_mlp_params(model) / t,
        router=router_params(model),
        norms=2 * norm_params(model),
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
    """Every parameter of the model."""
    per_layer = (
        attention_params(model)
        + model.num_local_experts * expert_mlp_params(model)
        + router_params(model)
        + 2 * norm_params(model)
    )
    return model.num_hidden_layers * per_layer + embedding_params(model) + output_params(model)


def active_params(model: ModelSpec) -> int:
    """Parameters one token passes through: only top-k experts of each MoE layer."""
    inactive = (model.num_local_experts - model.num_experts_per_tok) * expert_mlp_params(model)
    return total_params(model) - model.num_hidden_layers * inactive


@dataclass(frozen=True, slots=True, kw_only=True)
class StageParams:
    """Parameters one rank of a pipeline stage holds, before ZeRO sharding."""

    dense: float
    """Parameters replicated over the whole data-parallel group (ZeRO shards them over d)."""
    expert: float
    """MoE expert parameters, replicated over d / ep ranks (ZeRO shards them over d / ep)."""
    largest_unit: float
    """Parameters of the largest module ZeRO-3 gathers at once (a layer's sharded part, the
    embedding or the output layer)."""
    holds_embedding: bool
    """Whether the stage holds the input embedding (``geometry.holds_embedding``)."""
    holds_output_layer: bool
    """Whether the stage holds the final norm, the output layer and the loss
    (``geometry.holds_output_layer``)."""
    units: int = 1
    """Modules sharded and gathered one at a time under ZeRO 2-3: one per transformer layer, and
    one for the embedding, final norm and output layer the stage holds (FSDP's wrapping of each
    block and the root, as torchtitan does); each costs its own collectives."""

    @property
    def total(self) -> float:
        """All parameters on the rank."""
        return self.dense + self.expert


@functools.lru_cache(maxsize=8192)
def stage_params(model: ModelSpec, layout: Layout, stage: int) -> StageParams:
    """Parameters one rank of pipeline stage ``stage`` holds (memoized: memory, time and the
    optimizer all ask, and the inputs are immutable).

    Its transformer layers (``stage_layers``) split over t and, for experts, over ep; the stage
    holding the embedding (``geometry.holds_embedding``) the word embedding split over t
    (vocabulary-parallel) plus learned positions, replicated; the stage holding the output layer
    the final norm and the output layer split over t. With tied embeddings a stage that holds the
    output layer but not the embedding keeps its own copy of the embedding matrix (Megatron-LM);
    where one stage holds both, the one copy serves both.

    Raises:
        SchemaError: ``stage`` is not a pipeline rank of ``layout``.
    """
    check_stage(layout, stage)
    t = layout.tensor_parallel_degree
    ep = layout.expert_parallel_degree if model.is_moe else 1
    layer = layer_params(model, tensor_parallel_degree=t, expert_parallel_degree=ep)
    layers_here = stage_layers(model, layout)[stage]
    expert_per_layer = layer.mlp if model.is_moe else 0.0
    dense = layers_here * (layer.total - expert_per_layer)
    # Experts replicated over d / ep = 1 ranks are not sharded, so ZeRO-3 gathers none of them.
    experts_gathered = expert_per_layer if layout.data_parallel_degree // ep > 1 else 0.0
    units = [layer.total - expert_per_layer + experts_gathered] if layers_here else []
    word_embedding = model.vocab_size * model.hidden_size / t
    embedding_here, output_here = holds_embedding(layout, stage), holds_output_layer(layout, stage)
    if embedding_here:
        embedding = word_embedding + (embedding_params(model) - model.vocab_size * model.hidden_size)
        dense += embedding
        units.append(embedding)
    if output_here:
        head = word_embedding if (not model.tie_word_embeddings or not embedding_here) else 0.0
        dense += norm_params(model) + head
        units.append(norm_params(model) + head)
    return StageParams(
        dense=dense,
        expert=layers_here * expert_per_layer,
        largest_unit=max(units, default=0.0),
        holds_embedding=embedding_here,
        holds_output_layer=output_here,
        units=max(1, layers_here + (1 if embedding_here or output_here else 0)),
    )
