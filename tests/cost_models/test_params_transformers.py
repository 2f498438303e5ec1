"""Our parameter count equals transformers' own for configs that transformers writes.

Each config is built with transformers' config class, serialized as ``save_pretrained`` would
(``to_json_string``), read through our config.json loader, and counted by ``total_params``; the
reference is the model transformers instantiates from the same config on the meta device (no
memory, no initialization), counted parameter by parameter (tied weights once).
"""

import json
from importlib import resources
from typing import Any

import pytest
import yaml

from cost_models.params import active_params, total_params
from planner.files.models import load_model, model_from_dict

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

_SMALL = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 320,
    "max_position_embeddings": 128,
}

CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {**_SMALL, "num_hidden_layers": 2, "num_key_value_heads": 2, "intermediate_size": 96}),
    "llama-tied-biases": (
        "LlamaConfig",
        {
            **_SMALL,
            "num_hidden_layers": 2,
            "intermediate_size": 96,
            "tie_word_embeddings": True,
            "attention_bias": True,
            "mlp_bias": True,
        },
    ),
    "mixtral": (
        "MixtralConfig",
        {
            **_SMALL,
            "num_hidden_layers": 3,
            "num_key_value_heads": 2,
            "intermediate_size": 80,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
        },
    ),
    "qwen2-moe": (
        "Qwen2MoeConfig",
        {
            **_SMALL,
            "num_hidden_layers": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 112,
            "moe_intermediate_size": 48,
            "shared_expert_intermediate_size": 72,
            "num_experts": 6,
            "num_experts_per_tok": 2,
            "mlp_only_layers": [1],
            "decoder_sparse_step": 1,
        },
    ),
    "qwen2-moe-sparse-step": (
        "Qwen2MoeConfig",
        {
            **_SMALL,
            "num_hidden_layers": 4,
            "intermediate_size": 112,
            "moe_intermediate_size": 48,
            "shared_expert_intermediate_size": 72,
            "num_experts": 4,
            "num_experts_per_tok": 1,
            "decoder_sparse_step": 2,
        },
    ),
    "qwen3-moe": (
        "Qwen3MoeConfig",
        {
            **_SMALL,
            "num_hidden_layers": 3,
            "num_key_value_heads": 2,
            "head_dim": 24,
            "intermediate_size": 112,
            "moe_intermediate_size": 40,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "tie_word_embeddings": False,
        },
    ),
    # Gemma: gate, up and down under its GELU (Gemma 2 and 3 add two norms a layer, not modelled).
    "gemma": ("GemmaConfig", {**_SMALL, "num_hidden_layers": 2, "num_key_value_heads": 2, "intermediate_size": 96}),
    "gpt2": ("GPT2Config", {"n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 128, "vocab_size": 320}),
    "gpt-bigcode-multi-query": (
        "GPTBigCodeConfig",
        {"n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 128, "vocab_size": 320, "multi_query": True},
    ),
    # Falcon under parallel_attn has one LayerNorm a layer; the planner counts two.
    "falcon-multi-query": (
        "FalconConfig",
        {
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "vocab_size": 320,
            "parallel_attn": False,
        },
    ),
    "falcon-new-decoder": (
        "FalconConfig",
        {
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "vocab_size": 320,
            "new_decoder_architecture": True,
            "num_kv_heads": 2,
        },
    ),
    "llama4-text-interleaved": (
        "Llama4TextConfig",
        {
            **_SMALL,
            "num_hidden_layers": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 48,
            "intermediate_size_mlp": 96,
            "num_local_experts": 4,
            "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 2,
        },
    ),
    "deepseek-v2-no-q-lora": (
        "DeepseekV2Config",
        {
            **_SMALL,
            "num_hidden_layers": 3,
            "intermediate_size": 120,
            "moe_intermediate_size": 32,
            "n_routed_experts": 8,
            "n_shared_experts": 2,
            "num_experts_per_tok": 2,
            "first_k_dense_replace": 1,
            "n_group": 4,
            "topk_group": 2,
            "q_lora_rank": None,
            "kv_lora_rank": 24,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 16,
            "v_head_dim": 12,
        },
    ),
    "deepseek-v3": (
        "DeepseekV3Config",
        {
            **_SMALL,
            "num_hidden_layers": 4,
            "intermediate_size": 120,
            "moe_intermediate_size": 32,
            "n_routed_experts": 8,
            "n_shared_experts": 1,
            "num_experts_per_tok": 3,
            "first_k_dense_replace": 2,
            "n_group": 2,
            "topk_group": 1,
            "q_lora_rank": 40,
            "kv_lora_rank": 24,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 16,
            "v_head_dim": 12,
            "attention_bias": True,
            "num_nextn_predict_layers": 1,
        },
    ),
}


def _hf_config_dict(class_name: str, kwargs: dict[str, Any]) -> tuple[Any, dict[str, object]]:
    config = getattr(transformers, class_name)(**kwargs)
    return config, json.loads(config.to_json_string())


def _hf_count(config: Any) -> tuple[int, Any]:
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters()), model


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_total_params_equal_transformers_count_on_the_meta_device(name: str) -> None:
    class_name, kwargs = CONFIGS[name]
    config, raw = _hf_config_dict(class_name, kwargs)
    ours = model_from_dict(raw, name=name)
    expected, _ = _hf_count(config)
    assert total_params(ours) == expected


def test_active_params_count_the_top_k_experts_of_each_moe_layer() -> None:
    """Active = total minus the unrouted experts' weights, counted from transformers' own tensors."""
    class_name, kwargs = CONFIGS["deepseek-v3"]
    config, raw = _hf_config_dict(class_name, kwargs)
    ours = model_from_dict(raw, name="deepseek-v3")
    total, model = _hf_count(config)
    experts = [m for m in model.modules() if type(m).__name__.endswith("NaiveMoe") or hasattr(m, "gate_up_proj")]
    per_layer_expert_params = sum(p.numel() for p in experts[0].parameters())
    unrouted = (kwargs["n_routed_experts"] - kwargs["num_experts_per_tok"]) / kwargs["n_routed_experts"]
    assert len(experts) == ours.num_moe_layers == 2
    assert active_params(ours) == total - len(experts) * per_layer_expert_params * unrouted


@pytest.mark.parametrize(
    ("preset", "class_name", "published_total", "published_active"),
    [
        # DeepSeek-V3 technical report, sec. 4.2: 671B total, 37B activated (MTP module apart).
        ("deepseek-v3", "DeepseekV3Config", 671e9, 37e9),
        # Qwen3-235B-A22B model card: 235B total, 22B activated.
        ("qwen3-235b-a22b", "Qwen3MoeConfig", 235e9, 22e9),
        # Mixtral paper, Table 1: 46.7B total, 12.9B active.
        ("mixtral-8x7b", "MixtralConfig", 46.7e9, 12.9e9),
    ],
)
def test_presets_count_as_transformers_builds_them_and_as_published(
    preset: str, class_name: str, published_total: float, published_active: float
) -> None:
    """The full-size preset on the meta device (about 2 s for DeepSeek-V3's 671B), and the
    published figures to their stated precision."""
    raw = yaml.safe_load((resources.files("planner") / "presets" / "models" / f"{preset}.yaml").read_text())
    config = getattr(transformers, class_name)(**{k: v for k, v in raw.items() if k != "model_type"})
    expected, _ = _hf_count(config)
    ours = load_model(preset)
    assert total_params(ours) == expected
    assert total_params(ours) == pytest.approx(published_total, rel=0.005)
    assert active_params(ours) == pytest.approx(published_active, rel=0.03)
