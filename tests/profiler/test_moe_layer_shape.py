"""The profiler times the MoE layer that was planned: the runtime's first MoE layer (after
DeepSeek's first dense layers), experts moe_intermediate_size wide beside its shared experts;
none for a model whose layers the runtime does not build (ALiBi). A multi-head latent attention
model's timed layer is the runtime's latent attention block."""

from cost_models.params import layer_params
from planner.files.models import load_model
from planner.schemas import ModelSpec, PositionEmbedding
from profiler.ops import _moe_chunk, first_moe_layer
from runtime import builds_layers
from runtime.latent_attention import LatentAttention
from runtime.mlp import MoE, SharedExpert
from runtime.model import Block

DEEPSEEK_SHAPED = ModelSpec(
    **{
        **load_model("tiny-moe").model_dump(),
        "name": "tiny-deepseek",
        "moe_intermediate_size": 64,
        "n_shared_experts": 2,
        "first_k_dense_replace": 2,
    }
)


def test_the_timed_moe_layer_is_the_first_moe_layer_as_planned() -> None:
    assert first_moe_layer(DEEPSEEK_SHAPED) == 2
    chunk = _moe_chunk(DEEPSEEK_SHAPED)
    (block,) = chunk.layers.values()
    assert list(chunk.layers) == ["2"] and isinstance(block.mlp, MoE)
    assert isinstance(block, Block) and isinstance(block.shared_expert, SharedExpert)
    assert block.shared_expert.up.out_features == 2 * 64
    planned = layer_params(DEEPSEEK_SHAPED, moe=True)
    assert sum(p.numel() for p in block.parameters()) == planned.total


def test_no_runtime_layer_stands_for_a_model_it_does_not_build() -> None:
    alibi = DEEPSEEK_SHAPED.model_copy(update={"position_embedding_type": PositionEmbedding.ALIBI})
    assert builds_layers(DEEPSEEK_SHAPED) and not builds_layers(alibi)


def test_a_latent_attention_models_timed_layers_are_latent_attention_blocks() -> None:
    mla = ModelSpec(**{**DEEPSEEK_SHAPED.model_dump(), "kv_lora_rank": 32, "qk_rope_head_dim": 8, "v_head_dim": 32})
    assert builds_layers(mla)
    (block,) = _moe_chunk(mla).layers.values()
    assert isinstance(block, Block) and isinstance(block.attn, LatentAttention) and isinstance(block.mlp, MoE)
