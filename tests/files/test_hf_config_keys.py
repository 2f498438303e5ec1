"""Hugging Face configs of other families read as those models mean them (planner.files.hf_config).

Each config below is written with the real keys of the published config.json (values of the
named checkpoint; keys the planner ignores kept, so that none is taken for a typo). Parameter
counts are worked by hand in the comments.
"""

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from cost_models.params import active_params, total_params
from planner.files.clusters import load_cluster
from planner.files.models import load_model, model_from_dict
from planner.schemas import Activation, NormKind, PositionEmbedding
from planner.schemas.errors import SchemaError

# google/gemma-2-9b config.json.
GEMMA2_9B = {
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "sliding_window_size": 4096,
    "torch_dtype": "float32",
    "transformers_version": "4.42.0.dev0",
    "use_cache": True,
    "vocab_size": 256000,
}

# tiiuae/falcon-7b config.json (transformers' Falcon spelling).
FALCON_7B = {
    "alibi": False,
    "apply_residual_connection_post_layernorm": False,
    "architectures": ["FalconForCausalLM"],
    "attention_dropout": 0.0,
    "bias": False,
    "bos_token_id": 11,
    "eos_token_id": 11,
    "hidden_dropout": 0.0,
    "hidden_size": 4544,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "falcon",
    "multi_query": True,
    "new_decoder_architecture": False,
    "num_attention_heads": 71,
    "num_hidden_layers": 32,
    "parallel_attn": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.27.4",
    "use_cache": True,
    "vocab_size": 65024,
}

# tiiuae/falcon-40b config.json.
FALCON_40B = {
    **{k: v for k, v in FALCON_7B.items() if k != "multi_query"},
    "hidden_size": 8192,
    "new_decoder_architecture": True,
    "num_attention_heads": 128,
    "num_hidden_layers": 60,
    "num_kv_heads": 8,
}

# openai-community/gpt2 config.json.
GPT2 = {
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1,
    "bos_token_id": 50256,
    "embd_pdrop": 0.1,
    "eos_token_id": 50256,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "resid_pdrop": 0.1,
    "summary_activation": None,
    "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True,
    "summary_type": "cls_index",
    "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "vocab_size": 50257,
}

# meta-llama/Llama-4-Scout-17B-16E config.json (vision_config shortened to some of its keys).
LLAMA4_SCOUT_TEXT = {
    "attention_bias": False,
    "attention_chunk_size": 8192,
    "attention_dropout": 0.0,
    "attn_scale": 0.1,
    "attn_temperature_tuning": True,
    "bos_token_id": 200000,
    "eos_token_id": [200001, 200007, 200008],
    "floor_scale": 8192,
    "for_llm_compressor": False,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "interleave_moe_layer_step": 1,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "max_position_embeddings": 10485760,
    "model_type": "llama4_text",
    "moe_layers": None,
    "no_rope_layers": [],
    "num_attention_heads": 40,
    "num_experts_per_tok": 1,
    "num_hidden_layers": 48,
    "num_key_value_heads": 8,
    "num_local_experts": 16,
    "output_router_logits": False,
    "pad_token_id": 200018,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 16.0, "rope_type": "llama3"},
    "rope_theta": 500000.0,
    "router_aux_loss_coef": 0.001,
    "router_jitter_noise": 0.0,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_qk_norm": True,
    "vocab_size": 202048,
}
LLAMA4_SCOUT = {
    "architectures": ["Llama4ForConditionalGeneration"],
    "boi_token_index": 200080,
    "eoi_token_index": 200081,
    "image_token_index": 200092,
    "model_type": "llama4",
    "text_config": LLAMA4_SCOUT_TEXT,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0.dev0",
    "vision_config": {"hidden_size": 1408, "num_hidden_layers": 34, "model_type": "llama4_vision_model"},
}

# google-bert/bert-base-uncased config.json.
BERT_BASE = {
    "architectures": ["BertForMaskedLM"],
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 768,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "model_type": "bert",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "type_vocab_size": 2,
    "vocab_size": 30522,
}

# google-t5/t5-small config.json.
T5_SMALL = {
    "architectures": ["T5ForConditionalGeneration"],
    "d_ff": 2048,
    "d_kv": 64,
    "d_model": 512,
    "decoder_start_token_id": 0,
    "dropout_rate": 0.1,
    "eos_token_id": 1,
    "initializer_factor": 1.0,
    "is_encoder_decoder": True,
    "layer_norm_epsilon": 1e-06,
    "model_type": "t5",
    "n_positions": 512,
    "num_heads": 8,
    "num_layers": 6,
    "pad_token_id": 0,
    "relative_attention_num_buckets": 32,
    "vocab_size": 32128,
}


# --- 1. gated GELU --------------------------------------------------------------------------------


def test_gemma_gelu_is_a_gated_mlp_of_three_matrices() -> None:
    model = model_from_dict(GEMMA2_9B, name="gemma-2-9b")
    assert model.hidden_act is Activation.GEGLU and model.hidden_act.gated
    # Per layer: q 3584 x 4096, k and v 3584 x 2048 each, o 4096 x 3584 = 44,040,192; MLP gate, up,
    # down 3 x 3584 x 14336 = 154,140,672; two RMSNorm weights 7,168: 198,188,032. x 42 =
    # 8,323,897,344, + tied embedding 256000 x 3584 = 917,504,000 + final norm 3,584 = 9,241,404,928
    # (Google: 9.24B; Gemma 2's two extra norms a layer, 301,056, are not counted).
    assert total_params(model) == 9_241_404_928


def test_gemma3_text_model_normalizes_q_and_k_heads() -> None:
    text = {**GEMMA2_9B, "model_type": "gemma3_text"}
    model = model_from_dict({"model_type": "gemma3", "text_config": text, "vision_config": {}}, name="gemma-3")
    assert model.qk_norm and model.hidden_act is Activation.GEGLU


def test_a_llama_mlp_under_gelu_stays_gated() -> None:
    raw = {**GEMMA2_9B, "model_type": "llama", "hidden_act": "gelu", "hidden_activation": None}
    assert model_from_dict(raw, name="llama-gelu").hidden_act is Activation.GEGLU


def test_gelu_keeps_two_matrices_outside_gemma() -> None:
    raw = {**GEMMA2_9B, "model_type": "gpt_neox"}
    assert model_from_dict(raw, name="neox-like").hidden_act is Activation.GELU_TANH


_ACTIVATION_KEYS = ("hidden_act", "hidden_activation", "activation_function", "activation")


@pytest.mark.parametrize(
    "model_type",
    [
        *("llama", "llama4_text", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"),
        *("deepseek_v2", "deepseek_v3", "phi3", "olmo", "gemma", "gemma2", "gemma3_text"),
        *("gpt2", "gpt_bigcode", "falcon"),
    ],
)
def test_a_config_without_an_activation_reads_as_its_transformers_default(model_type: str) -> None:
    """A config.json that names no activation means its config class's default (Llama's SiLU,
    Gemma's tanh GELU, gated), read from transformers itself, not ModelSpec's GELU."""
    transformers = pytest.importorskip("transformers", reason="transformers (the hf extra) declares the defaults")
    config = transformers.AutoConfig.for_model(model_type)
    declared = next(getattr(config, key) for key in _ACTIVATION_KEYS if getattr(config, key, None) is not None)
    raw = {key: value for key, value in config.to_dict().items() if key not in _ACTIVATION_KEYS}
    want = Activation.GEGLU if model_type.startswith("gemma") else Activation(declared)  # Gemma's MLP is gated
    assert model_from_dict(raw, name=model_type).hidden_act is want


# --- 2. multi-query and grouped attention ---------------------------------------------------------


def test_falcon_multi_query_has_one_key_value_head() -> None:
    model = model_from_dict(FALCON_7B, name="falcon-7b")
    assert model.kv_heads == 1 and model.head_size == 64
    assert model.norm_type is NormKind.LAYERNORM and not model.attention_bias and not model.mlp_bias
    # Per layer: q 4544^2 + k, v 2 x 4544 x 64 + o 4544^2 = 41,877,504; MLP 2 x 4544 x 18176 =
    # 165,183,488; two LayerNorms 18,176: 207,079,168 x 32 = 6,626,533,376 + tied embedding
    # 65024 x 4544 = 295,469,056 + final LayerNorm 9,088 = 6,922,011,520 (TII: 7B, HF: 6.92B).
    # (transformers' Falcon-7B has one LayerNorm a layer under parallel_attn: 145,408 fewer.)
    assert total_params(model) == 6_922_011_520


def test_falcon_new_decoder_architecture_reads_num_kv_heads() -> None:
    assert model_from_dict(FALCON_40B, name="falcon-40b").kv_heads == 8


@pytest.mark.parametrize(
    ("keys", "kv_heads"),
    [
        ({"multi_query": False}, 71),  # every query head has its own
        ({}, 1),  # Falcon's default is multi-query
        ({"model_type": "RefinedWeb", "new_decoder_architecture": True, "n_head_kv": 1}, 1),
        ({"model_type": "gpt_bigcode", "multi_query": True}, 1),
        ({"model_type": "gpt_bigcode", "multi_query": False}, 71),
        ({"num_key_value_heads": 71}, 71),  # the ModelSpec key wins
    ],
)
def test_kv_heads_from_each_family_spelling(keys: dict[str, object], kv_heads: int) -> None:
    base = {k: v for k, v in FALCON_7B.items() if k not in ("multi_query", "new_decoder_architecture")}
    assert model_from_dict({**base, **keys}, name="falcon-variant").kv_heads == kv_heads


def test_falcon_alibi_and_bias_keys() -> None:
    model = model_from_dict({**FALCON_7B, "alibi": True, "bias": True}, name="falcon-rw")
    assert model.position_embedding_type is PositionEmbedding.ALIBI and model.attention_bias and model.mlp_bias


# --- 3. GPT-2 -------------------------------------------------------------------------------------


def test_gpt2_config_reads_as_gpt2() -> None:
    model = model_from_dict(GPT2, name="gpt2")
    assert (model.hidden_size, model.num_hidden_layers, model.num_attention_heads) == (768, 12, 12)
    assert (model.max_position_embeddings, model.ffn_size, model.vocab_size) == (1024, 3072, 50257)
    assert model.hidden_act is Activation.GELU_NEW and not model.hidden_act.gated
    assert model.norm_type is NormKind.LAYERNORM and model.position_embedding_type is PositionEmbedding.ABSOLUTE
    assert model.tie_word_embeddings and model.attention_bias and model.mlp_bias
    # HF GPT2LMHeadModel: 124,439,808 parameters (tokens 38,597,376, positions 786,432, 12 layers of
    # 7,087,872, final LayerNorm 1,536).
    assert total_params(model) == 124_439_808


def test_gpt2_n_inner_null_is_four_h_and_a_width_is_read() -> None:
    assert model_from_dict({**GPT2, "n_inner": None}, name="gpt2").ffn_size == 3072
    assert model_from_dict({**GPT2, "n_inner": 1000}, name="gpt2").ffn_size == 1000


# --- 4. multimodal text_config --------------------------------------------------------------------


def test_llama4_reads_its_text_model_and_says_the_vision_tower_is_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="planner"):
        model = model_from_dict(LLAMA4_SCOUT, name="llama4-scout")
    assert "text_config" in caplog.text and "vision tower left out" in caplog.text
    assert (model.hidden_size, model.num_hidden_layers, model.num_local_experts) == (5120, 48, 16)
    assert (model.expert_ffn_size, model.shared_ffn_size, model.num_moe_layers) == (8192, 8192, 48)
    assert not model.tie_word_embeddings
    # Per layer: attention 2 x 5120^2 + 2 x 5120 x 1024 = 62,914,560; 16 experts and the shared one
    # 17 x 3 x 5120 x 8192 = 2,139,095,040; router 5120 x 16 = 81,920; norms 10,240. x 48 =
    # 105,700,884,480 + embedding and output 2 x 202048 x 5120 = 2,068,971,520 + 5,120 =
    # 107,769,861,120 (Meta: 109B with the vision tower). Active: attention, one expert and the
    # shared one, router, norms 314,664,960 x 48 + 2,068,976,640 = 17,172,894,720 (Meta: 17B).
    assert total_params(model) == 107_769_861_120
    assert active_params(model) == 17_172_894_720


def test_llama4_interleaved_moe_layers_use_the_dense_width_between() -> None:
    text = {**LLAMA4_SCOUT_TEXT, "interleave_moe_layer_step": 2, "num_local_experts": 128}  # Maverick
    model = model_from_dict({**LLAMA4_SCOUT, "text_config": text}, name="llama4-maverick")
    assert model.num_moe_layers == 24 and model.is_moe_layer(1) and not model.is_moe_layer(0)
    assert model.mlp_widths == (8192, 16384)
    explicit = {**LLAMA4_SCOUT_TEXT, "moe_layers": [0, 47]}
    assert model_from_dict(explicit, name="two-moe").num_moe_layers == 2


# --- 5. encoders ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(BERT_BASE, r"is an encoder \(model_type 'bert'\)"), (T5_SMALL, r"is an encoder-decoder \(is_encoder_decoder")],
)
def test_encoders_are_refused_in_one_line(raw: dict[str, object], expected: str) -> None:
    with pytest.raises(SchemaError, match=expected) as info:
        model_from_dict(raw, name="enc")
    assert "decoder-only" in str(info.value) and "\n" not in str(info.value)


def test_the_cli_refuses_an_encoder_with_exit_code_2(tmp_path: Path) -> None:
    path = tmp_path / "bert.json"
    path.write_text(json.dumps(BERT_BASE))
    args = ["estimate", "-m", str(path), "-c", "dgx-h100:1", "--global-batch-size", "8", "--seq-len", "128"]
    proc = subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "encoder" in proc.stderr and "Traceback" not in proc.stderr


# --- 6. real keys are not typos -------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        {**LLAMA4_SCOUT_TEXT},  # intermediate_size_mlp
        {**GEMMA2_9B, "attention_out_bias": False},  # Seed-OSS
        {**GEMMA2_9B, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},  # transformers 5
    ],
)
def test_real_keys_are_not_taken_for_typos(raw: dict[str, object]) -> None:
    model_from_dict(raw, name="real")


def test_other_spellings_of_expert_keys_and_nulls_read_as_transformers_means_them() -> None:
    moe = {"num_local_experts": 8, "moe_intermediate_size": 1024, "num_experts_per_token": 2, "num_shared_experts": 1}
    model = model_from_dict({**GEMMA2_9B, **moe}, name="kimi-like")
    assert (model.num_experts_per_tok, model.shared_ffn_size) == (2, 1024)
    # transformers writes null for what it leaves unset: DeepSeek-V2's dense default config.
    dense = model_from_dict({**GEMMA2_9B, "num_experts_per_tok": None, "n_routed_experts": None}, name="v2-dense")
    assert not dense.is_moe
    with pytest.raises(SchemaError, match="hidden_size=None must be a whole number"):
        model_from_dict({**GEMMA2_9B, "hidden_size": None}, name="no-width")


def test_a_typo_is_still_refused() -> None:
    with pytest.raises(SchemaError, match="did you mean 'intermediate_size'"):
        model_from_dict({**GPT2, "intermediate_sise": 3072}, name="gpt2")


# --- 7. preset names ------------------------------------------------------------------------------


def test_preset_names_ignore_case() -> None:
    assert load_model("Llama3-8B") == load_model("llama3-8b")
    assert load_cluster("DGX-H100:2") == load_cluster("dgx-h100:2")


@pytest.mark.parametrize(
    ("load", "spec", "expected"),
    [
        (load_model, "llama3-8", "did you mean 'llama3-8b'?"),
        (load_cluster, "dgx-h10:2", "did you mean 'dgx-h100'?"),
        (load_cluster, "DGX-H10", "did you mean 'dgx-h100'?"),
        # a name that begins a preset's is that preset, not the one fewer edits away (dgx-h100)
        (load_cluster, "dgx-a100:1", "did you mean 'dgx-a100-80g'?"),
        (load_model, "llama3", "did you mean one of 'llama3-405b', 'llama3-70b', 'llama3-8b'?"),
    ],
)
def test_a_near_preset_name_is_suggested_in_one_line(load: object, spec: str, expected: str) -> None:
    assert callable(load)
    with pytest.raises(SchemaError) as info:
        load(spec)
    assert expected in str(info.value) and "\n" not in str(info.value)
