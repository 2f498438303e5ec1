"""rope_theta and rope_scaling read from Hugging Face configs as transformers means them, the longest
sequence each model then allows, and a longer one refused at the CLI (exit 2, one line).

Configs are written with the keys of the named checkpoint's config.json (long lists shortened
where they change no length).
"""

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli import app
from planner.files.models import load_model, model_from_dict
from planner.schemas import RopeType
from planner.schemas.errors import SchemaError

# meta-llama/Llama-3.1-8B config.json.
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
# microsoft/Phi-3-mini-128k-instruct config.json (its 48 long and short factors shortened to 3).
PHI3_MINI_128K = {
    "architectures": ["Phi3ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "embd_pdrop": 0.0,
    "eos_token_id": 32000,
    "hidden_act": "silu",
    "hidden_size": 3072,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "model_type": "phi3",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096,
    "pad_token_id": 32000,
    "resid_pdrop": 0.0,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"long_factor": [1.08, 1.11, 1.14], "short_factor": [1.0, 1.0, 1.0], "type": "longrope"},
    "rope_theta": 10000.0,
    "sliding_window": 262144,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.2",
    "use_cache": True,
    "vocab_size": 32064,
}
# Qwen/Qwen3-8B config.json with the YaRN its model card adds for 131072 tokens.
QWEN3_8B_YARN = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
# lmsys/vicuna-7b-v1.5-16k config.json: Llama 2 7B with linear interpolation x 4.
VICUNA_16K = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 4.0, "type": "linear"},
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}
# google/gemma-3-4b-pt's text_config: linear x 8 on the full-attention layers, 128K context.
GEMMA3_TEXT = {
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2560,
    "intermediate_size": 10240,
    "max_position_embeddings": 131072,
    "model_type": "gemma3_text",
    "num_attention_heads": 8,
    "num_hidden_layers": 34,
    "num_key_value_heads": 4,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "rope_theta": 1000000.0,
    "sliding_window": 1024,
    "vocab_size": 262208,
}


def test_llama31_reads_its_llama3_scaling_and_allows_131072() -> None:
    model = model_from_dict(LLAMA31_8B, name="Llama-3.1-8B")
    assert model.rope_theta == 500000.0
    assert model.rope_scaling is not None and model.rope_scaling.known_type is RopeType.LLAMA3
    assert (model.rope_scaling.factor, model.rope_scaling.original_max_position_embeddings) == (8.0, 8192)
    assert (model.rope_scaling.low_freq_factor, model.rope_scaling.high_freq_factor) == (1.0, 4.0)
    assert model.max_seq_len == 131072
    assert model == load_model("llama3-8b").model_copy(update={"name": "Llama-3.1-8B"})


def test_phi3_longrope_keeps_its_top_level_original_length() -> None:
    model = model_from_dict(PHI3_MINI_128K, name="phi3")
    assert model.rope_scaling is not None and model.rope_scaling.rope_type == "longrope"
    assert model.rope_scaling.original_max_position_embeddings == 4096
    assert model.max_seq_len == 131072


def test_su_is_longrope() -> None:
    config = {**PHI3_MINI_128K, "rope_scaling": {**PHI3_MINI_128K["rope_scaling"], "type": "su"}}  # type: ignore[dict-item]
    model = model_from_dict(config, name="phi3")
    assert model.rope_scaling is not None and model.rope_scaling.known_type is RopeType.LONGROPE


def test_qwen3_yarn_reaches_original_times_factor() -> None:
    model = model_from_dict(QWEN3_8B_YARN, name="qwen3-8b")
    assert model.rope_theta == 1e6 and model.max_seq_len == 32768 * 4
    assert model_from_dict({**QWEN3_8B_YARN, "rope_scaling": None}, name="qwen3-8b").max_seq_len == 40960


def test_deepseek_v3_preset_keeps_the_configs_yarn() -> None:
    model = load_model("deepseek-v3")
    assert model.rope_scaling is not None and model.rope_scaling.known_type is RopeType.YARN
    assert (model.rope_scaling.mscale, model.rope_scaling.beta_fast) == (1.0, 32)
    assert model.max_seq_len == 4096 * 40 == model.max_position_embeddings


def test_linear_and_dynamic_multiply_the_trained_length() -> None:
    assert model_from_dict(VICUNA_16K, name="vicuna").max_seq_len == 16384
    dynamic = {**VICUNA_16K, "rope_scaling": {"type": "dynamic", "factor": 2.0}}
    assert model_from_dict(dynamic, name="vicuna").max_seq_len == 8192


def test_gemma3_states_its_scaled_length() -> None:
    model = model_from_dict(GEMMA3_TEXT, name="gemma-3-4b")
    assert model.rope_scaling is not None and model.rope_scaling.scaled_max_position_embeddings
    assert model.max_seq_len == 131072  # not 131072 x 8
    # transformers 5 writes it per layer type; the full-attention layers' scaling counts.
    v5 = {key: value for key, value in GEMMA3_TEXT.items() if key not in ("rope_scaling", "rope_theta")}
    v5["rope_parameters"] = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
    assert model_from_dict(v5, name="gemma-3-4b") == model


def test_transformers_5_rope_parameters_give_theta_and_scaling() -> None:
    config = {key: value for key, value in QWEN3_8B_YARN.items() if key not in ("rope_scaling", "rope_theta")}
    config["rope_parameters"] = {**QWEN3_8B_YARN["rope_scaling"], "rope_theta": 1000000.0}  # type: ignore[dict-item]
    assert model_from_dict(config, name="qwen3-8b") == model_from_dict(QWEN3_8B_YARN, name="qwen3-8b")
    default = {**config, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
    read = model_from_dict(default, name="qwen3-8b")
    assert (read.rope_scaling, read.rope_theta, read.max_seq_len) == (None, 5e5, 40960)


def test_an_unknown_rope_type_is_kept_and_named(caplog: pytest.LogCaptureFixture) -> None:
    config = {**VICUNA_16K, "max_position_embeddings": 32768, "rope_scaling": {"type": "mrope", "mrope_section": [16]}}
    with caplog.at_level(logging.WARNING, logger="planner"):
        model = model_from_dict(config, name="qwen2-vl")
    assert model.rope_scaling is not None and model.rope_scaling.rope_type == "mrope"
    assert model.max_seq_len == 32768
    assert "'mrope' is not one the planner knows" in caplog.text


@pytest.mark.parametrize(
    ("scaling", "needle"),
    [
        ({"factor": 4.0}, "rope_scaling needs a rope_type"),
        ({"type": "linear", "factor": "4"}, "rope_scaling.factor='4' must be a number"),
        ({"rope_type": "yarn"}, "needs a factor"),
        ({"rope_type": "linear", "factor": 0.5}, "factor"),
        ([4.0], "must be a mapping"),
    ],
)
def test_bad_rope_scaling_is_refused(scaling: object, needle: str) -> None:
    with pytest.raises(SchemaError, match=needle):
        model_from_dict({**VICUNA_16K, "rope_scaling": scaling}, name="vicuna")


# --- at the CLI -----------------------------------------------------------------------------------

ESTIMATE = ["estimate", "-c", "dgx-h100:1", "--global-batch-size", "8", "--dp", "1", "--tp", "8"]


@pytest.mark.parametrize(
    ("model", "seq_len", "needles"),
    [
        ("gpt3-175b", 4096, ("seq_len=4096", "2048 tokens", "learned absolute positions", "at most 2048")),
        ("llama3-8b", 2**20, ("seq_len=1048576", "131072 tokens", "factor: 128, original_max_position_embeddings")),
    ],
)
def test_a_sequence_longer_than_the_model_allows_exits_2_with_one_line(
    model: str, seq_len: int, needles: tuple[str, ...]
) -> None:
    args = [*ESTIMATE, "-m", model, "--seq-len", str(seq_len)]
    proc = subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr


def test_a_model_file_with_stretched_rope_scaling_plans_a_million_tokens(tmp_path: Path) -> None:
    preset = Path(__file__).parents[2] / "planner" / "presets" / "models" / "llama3-8b.yaml"
    config = yaml.safe_load(preset.read_text())
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 128, "original_max_position_embeddings": 8192}
    path = tmp_path / "llama3-8b-1m.yaml"
    path.write_text(yaml.safe_dump(config))
    assert load_model(str(path)).max_seq_len == 2**20
    result = CliRunner().invoke(app, [*ESTIMATE, "-m", str(path), "--seq-len", str(2**20), "--format", "json"])
    assert result.exit_code == 0, result.output
    within = CliRunner().invoke(app, [*ESTIMATE, "-m", "llama3-8b", "--seq-len", "131072", "--format", "json"])
    assert within.exit_code == 0, within.output
