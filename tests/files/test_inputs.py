"""Loaders of models and clusters: presets, Hugging Face configs, profile files and their errors."""

import json
import logging
from importlib import resources
from pathlib import Path

import pytest
import yaml

from cost_models.params import active_params, total_params
from planner.files import cluster_presets
from planner.files.cluster_presets import cluster_preset, list_cluster_presets
from planner.files.clusters import load_cluster, save_cluster
from planner.files.models import list_model_presets, load_model, model_from_dict
from planner.schemas import (
    Activation,
    ClusterProfile,
    CollectiveOp,
    DType,
    NormKind,
    Placement,
    PositionEmbedding,
)
from planner.schemas.errors import SchemaError

# meta-llama/Meta-Llama-3-8B config.json, as published, with every key Hugging Face writes.
LLAMA3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}


# --- model presets --------------------------------------------------------------------------------


def test_the_promised_model_presets_exist() -> None:
    expected = {"gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "tiny-gpt", "tiny-moe"}
    assert expected <= set(list_model_presets())


@pytest.mark.parametrize("name", list_model_presets())
def test_every_model_preset_loads(name: str) -> None:
    model = load_model(name)
    assert model.name == name
    assert total_params(model) > 0


@pytest.mark.parametrize(
    ("name", "total", "active"),
    [
        ("llama3-8b", 8.03e9, 8.03e9),  # model card: 8.03B
        ("llama3-70b", 70.6e9, 70.6e9),  # model card: 70.6B
        ("llama3-405b", 405.8e9, 405.8e9),  # model card: 405.8B
        ("mixtral-8x7b", 46.7e9, 12.9e9),  # Mixtral paper: 46.7B total, 12.9B active
        ("gpt3-175b", 174.6e9, 174.6e9),  # SC21 eq. 2 with V = 50257, s = 2048
    ],
)
def test_preset_parameter_counts_match_the_published_ones(name: str, total: float, active: float) -> None:
    model = load_model(name)
    assert total_params(model) == pytest.approx(total, rel=0.005)
    assert active_params(model) == pytest.approx(active, rel=0.005)


def test_tiny_models_are_tiny_and_divisible_for_local_runs() -> None:
    gpt, moe = load_model("tiny-gpt"), load_model("tiny-moe")
    assert gpt.hidden_act is Activation.GELU and gpt.norm_type is NormKind.LAYERNORM
    assert gpt.position_embedding_type is PositionEmbedding.ABSOLUTE and gpt.tie_word_embeddings
    assert moe.hidden_act.gated and moe.norm_type is NormKind.RMSNORM
    assert (moe.num_local_experts, moe.num_experts_per_tok, moe.kv_heads) == (4, 2, 2)
    assert total_params(gpt) < 1.5e6 and total_params(moe) < 3e6


def test_gpt3_preset_is_a_gpt_block() -> None:
    gpt3 = load_model("gpt3-175b")
    assert gpt3.norm_type is NormKind.LAYERNORM and gpt3.attention_bias and gpt3.mlp_bias
    assert gpt3.position_embedding_type is PositionEmbedding.ABSOLUTE
    assert (gpt3.hidden_dropout, gpt3.attention_dropout, gpt3.max_position_embeddings) == (0.1, 0.1, 2048)


# --- Hugging Face configs -------------------------------------------------------------------------


def test_a_real_llama_config_json_loads_and_equals_the_preset(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="planner"):
        model = model_from_dict(LLAMA3_8B_CONFIG, name="llama3-8b")
    # The preset is Llama 3.1 8B: Llama 3 8B's shapes with a 128K context (tests/planner/test_hf_config_rope.py).
    assert model == load_model("llama3-8b").model_copy(update={"max_position_embeddings": 8192, "rope_scaling": None})
    assert model.max_seq_len == 8192
    assert model.norm_type is NormKind.RMSNORM and model.position_embedding_type is PositionEmbedding.ROPE
    assert "torch_dtype" in caplog.text  # ignored knowingly, not silently


def test_a_config_json_file_is_named_after_its_folder(tmp_path: Path) -> None:
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA3_8B_CONFIG))
    model = load_model(str(folder / "config.json"))
    assert model.name == "Meta-Llama-3-8B"
    assert total_params(model) == total_params(load_model("llama3-8b"))


def test_a_yaml_model_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "small.yml"
    path.write_text(yaml.safe_dump({**LLAMA3_8B_CONFIG, "num_hidden_layers": 2}))
    model = load_model(str(path))
    assert (model.name, model.num_hidden_layers) == ("small", 2)


def test_gpt2_style_keys_map_to_dropouts_and_layernorm() -> None:
    raw = {
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "vocab_size": 50257,
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.1,
        "attn_pdrop": 0.2,
        "embd_pdrop": 0.1,
    }
    model = model_from_dict(raw, name="gpt2-like")
    assert model.norm_type is NormKind.LAYERNORM
    assert (model.hidden_dropout, model.attention_dropout) == (0.1, 0.2)


def test_explicit_keys_win_over_hints() -> None:
    raw = {**LLAMA3_8B_CONFIG, "norm_type": "layernorm", "position_embedding_type": "absolute"}
    model = model_from_dict(raw, name="explicit")
    assert model.norm_type is NormKind.LAYERNORM
    assert model.position_embedding_type is PositionEmbedding.ABSOLUTE


def test_two_norm_hints_without_norm_type_are_refused() -> None:
    with pytest.raises(SchemaError, match="norm_type"):
        model_from_dict({**LLAMA3_8B_CONFIG, "layer_norm_eps": 1e-5}, name="both")


def test_qwen_moe_keys_map_to_experts_and_their_width() -> None:
    raw = {**LLAMA3_8B_CONFIG, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 1408}
    model = model_from_dict(raw, name="qwen-moe-like")
    assert (model.num_local_experts, model.num_experts_per_tok) == (8, 2)
    # The expert width is its own; intermediate_size stays the dense layers' width.
    assert (model.expert_ffn_size, model.ffn_size) == (1408, 14336)


def test_deepseek_keys_map_to_experts_shared_experts_dense_layers_and_mla() -> None:
    raw = {
        **LLAMA3_8B_CONFIG,
        "n_routed_experts": 16,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 512,
        "n_shared_experts": 2,
        "first_k_dense_replace": 3,
        "n_group": 4,
        "topk_group": 2,
        "q_lora_rank": None,
        "kv_lora_rank": 128,
        "qk_rope_head_dim": 32,
        "qk_nope_head_dim": 64,
        "v_head_dim": 64,
        "num_nextn_predict_layers": 1,
    }
    model = model_from_dict(raw, name="deepseek-like")
    assert (model.num_local_experts, model.shared_ffn_size, model.num_moe_layers) == (16, 1024, 32 - 3)
    assert [model.is_moe_layer(i) for i in range(4)] == [False, False, False, True]
    assert model.is_mla and model.q_lora_rank is None and (model.qk_head_size, model.v_head_size) == (96, 64)
    assert model.mlp_widths == (512, 1024, 14336)


def test_qwen_layer_keys_choose_the_moe_layers() -> None:
    raw = {**LLAMA3_8B_CONFIG, "num_experts": 8, "mlp_only_layers": [0, 5], "decoder_sparse_step": 2}
    model = model_from_dict(raw, name="qwen-sparse-step")
    assert [i for i in range(8) if model.is_moe_layer(i)] == [1, 3, 7]
    assert model_from_dict({**raw, "mlp_only_layers": None}, name="null").mlp_only_layers == ()
    with pytest.raises(SchemaError, match=r"mlp_only_layers=.*list of whole numbers"):
        model_from_dict({**raw, "mlp_only_layers": [1.5]}, name="bad")


def test_model_type_says_what_qwen_has_without_a_key() -> None:
    qwen3 = model_from_dict({**LLAMA3_8B_CONFIG, "model_type": "qwen3_moe", "num_experts": 4}, name="q3")
    qwen2 = model_from_dict({**LLAMA3_8B_CONFIG, "model_type": "qwen2_moe", "num_experts": 4}, name="q2")
    assert (qwen3.qk_norm, qwen3.qkv_bias, qwen2.qk_norm, qwen2.qkv_bias) == (True, None, False, True)


def test_mla_without_its_head_widths_and_experts_without_moe_layers_are_refused() -> None:
    with pytest.raises(SchemaError, match=r"kv_lora_rank=64 .*qk_rope_head_dim and v_head_dim"):
        model_from_dict({**LLAMA3_8B_CONFIG, "kv_lora_rank": 64}, name="half-mla")
    with pytest.raises(SchemaError, match="no MoE layer"):
        model_from_dict({**LLAMA3_8B_CONFIG, "num_experts": 4, "first_k_dense_replace": 32}, name="all-dense")
    with pytest.raises(SchemaError, match="n_group=3 does not divide num_local_experts=8"):
        model_from_dict({**LLAMA3_8B_CONFIG, "num_experts": 8, "n_group": 3}, name="groups")


def test_a_misspelled_key_is_refused_with_a_suggestion() -> None:
    raw = {k: v for k, v in LLAMA3_8B_CONFIG.items() if k != "hidden_size"} | {"hiden_size": 4096}
    expected = r"unknown key 'hiden_size' in my-model; did you mean 'hidden_size'\?"
    with pytest.raises(SchemaError, match=expected):
        model_from_dict(raw, name="my-model")


def test_a_missing_required_key_is_named() -> None:
    raw = {k: v for k, v in LLAMA3_8B_CONFIG.items() if k != "hidden_size"}
    with pytest.raises(SchemaError, match="missing required key 'hidden_size'"):
        model_from_dict(raw, name="no-width")


def test_an_invalid_value_names_the_key_the_value_and_what_is_expected() -> None:
    with pytest.raises(SchemaError) as info:
        model_from_dict({**LLAMA3_8B_CONFIG, "hidden_act": "quick_gelu", "vocab_size": 0}, name="bad")
    message = str(info.value)
    assert "hidden_act='quick_gelu'" in message and "'silu'" in message
    assert "vocab_size=0" in message and "greater than or equal to 1" in message
    assert isinstance(info.value.__cause__, Exception)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("hidden_size", True, "a whole number"),
        ("hidden_size", "4096", "a whole number"),
        ("tie_word_embeddings", "no", "true or false"),
        ("attention_dropout", "0.1", "a number"),
    ],
)
def test_values_of_the_wrong_type_are_refused_not_coerced(key: str, value: object, expected: str) -> None:
    with pytest.raises(SchemaError, match=f"{key}={value!r} must be {expected}"):
        model_from_dict({**LLAMA3_8B_CONFIG, key: value}, name="typed")


def test_heads_not_divisible_by_kv_heads_are_refused() -> None:
    expected = "num_attention_heads=32 must be a multiple of num_key_value_heads=6"
    with pytest.raises(SchemaError, match=expected):
        model_from_dict({**LLAMA3_8B_CONFIG, "num_key_value_heads": 6}, name="odd-gqa")


# --- model files and names ------------------------------------------------------------------------


def test_an_unknown_model_lists_the_presets_and_the_file_suffixes() -> None:
    with pytest.raises(SchemaError) as info:
        load_model("llama-9000")
    assert "llama3-8b" in str(info.value) and ".json" in str(info.value) and ".yml" in str(info.value)


def test_a_missing_model_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match=r"does not exist.*llama3-8b"):
        load_model(str(tmp_path / "missing.json"))


def test_malformed_json_and_yaml_name_the_file_and_line(tmp_path: Path) -> None:
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{\n  "hidden_size": 128,\n  oops\n}')
    with pytest.raises(SchemaError, match=r"bad\.json: malformed JSON at line 3"):
        load_model(str(bad_json))
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("hidden_size: 128\nvocab_size: [1, 2\nnum_hidden_layers: 2\n")
    with pytest.raises(SchemaError, match=r"bad\.yaml: malformed YAML at line \d+"):
        load_model(str(bad_yaml))
    not_a_mapping = tmp_path / "list.yaml"
    not_a_mapping.write_text("- 1\n- 2\n")
    with pytest.raises(SchemaError, match="top level must be a mapping"):
        load_model(str(not_a_mapping))


# --- cluster presets ------------------------------------------------------------------------------


def test_the_promised_cluster_presets_exist() -> None:
    assert {"dgx-a100-80g", "dgx-h100"} <= set(list_cluster_presets())


@pytest.mark.parametrize("name", ["dgx-a100-80g", "dgx-h100"])
@pytest.mark.parametrize("nodes", [1, 128])
def test_cluster_presets_build_and_round_trip_through_json(name: str, nodes: int) -> None:
    profile = cluster_preset(name, nodes)
    assert profile.world_size == 8 * nodes
    assert profile.intra_node_links.size == 8 and profile.inter_node_links.size == nodes
    assert profile.provenance.kind == "preset" and profile.provenance.sources
    assert ClusterProfile.model_validate_json(profile.model_dump_json()) == profile
    assert cluster_preset(name, nodes) == profile  # deterministic: the date is fixed in the file


def test_a100_preset_figures() -> None:
    device = cluster_preset("dgx-a100-80g", 1).device
    assert device.memory_bytes == 81920 * 2**20
    assert device.get_peak_flop_per_s(DType.BF16) == 312e12
    assert device.get_peak_flop_per_s(DType.FP32) == 19.5e12
    # Burst MAMF x the sustained/burst ratio of 8 busy GPUs.
    assert device.matmul.peak_fraction == pytest.approx(271.2 * 0.848 / 312)
    assert device.matmul.compute_units == 108
    assert 0.8 * 2039e9 < device.memory_bandwidth_bytes_per_s < 2039e9


def test_h100_preset_figures() -> None:
    profile = cluster_preset("dgx-h100", 2)
    assert profile.device.get_peak_flop_per_s(DType.BF16) == 989e12
    # The MAMF rate was measured at k = 13312: the long-k rate is 1 + k_overhead / 13312 above it.
    assert profile.device.matmul.peak_fraction == pytest.approx(794.5 * (1 + 140 / 13312) * 0.848 / 989)
    assert profile.device.matmul.k_overhead == 140
    assert profile.device.matmul.compute_units == 132
    assert profile.intra_node_links.link(0, 7).bandwidth_bytes_per_s == 370e9
    assert profile.inter_node_links.link(0, 1).bandwidth_bytes_per_s == pytest.approx(48e9)


def test_a100_collectives_reproduce_the_published_nccl_tests_times() -> None:
    """stas00/ml-engineering network/README.md: 32 KiB 43.83 us, 32 MiB 424.0 us, 16 GiB 127997 us."""
    records = {r.message_bytes: r for r in cluster_preset("dgx-a100-80g", 4).collectives}
    for size, time_us in [(32768, 43.83), (33554432, 424.0), (17179869184, 127997.0)]:
        record = records[size]
        assert (record.op, record.placement) == (CollectiveOp.ALL_REDUCE, Placement.INTRA_NODE)
        assert (record.group_size, record.members_per_node) == (8, 8)
        assert record.time_s == pytest.approx(time_us * 1e-6, rel=0.01)


def test_h100_collective_curve_is_complete_and_reaches_the_ring_bandwidth() -> None:
    records = sorted(cluster_preset("dgx-h100", 1).collectives, key=lambda r: r.message_bytes)
    assert [r.message_bytes for r in records] == [2**k for k in range(15, 35)]
    largest = records[-1]
    assert largest.message_bytes * 2 * 7 / 8 / largest.time_s == pytest.approx(370e9)


def test_every_preset_figure_must_name_a_source_or_an_assumption() -> None:
    text = (resources.files("planner") / "presets" / "clusters" / "dgx-a100-80g.yaml").read_text()
    raw = yaml.safe_load(text)
    del raw["device"]["matmul"]["launch_overhead_s"]["assumption"]
    with pytest.raises(SchemaError, match="'launch_overhead_s' names no source"):
        cluster_presets._build_cluster(raw, name="dgx-a100-80g", num_nodes=1)
    raw = yaml.safe_load(text)
    raw["device"]["peak_flop_per_s"]["bf16"]["source"] = "nowhere"
    with pytest.raises(SchemaError, match="'bf16' names source 'nowhere'"):
        cluster_presets._build_cluster(raw, name="dgx-a100-80g", num_nodes=1)


# --- load_cluster, save_cluster -------------------------------------------------------------------


def test_load_cluster_parses_name_and_nodes() -> None:
    assert load_cluster("dgx-a100-80g:16") == cluster_preset("dgx-a100-80g", 16)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("dgx-a100-80g", r"needs a node count: write dgx-a100-80g:NODES"),
        ("dgx-a100-80g:0", r"NODES='0' must be a whole number >= 1"),
        ("dgx-a100-80g:two", r"NODES='two' must be a whole number >= 1"),
        ("nope:2", r"unknown cluster preset 'nope'.*dgx-a100-80g.*dgx-h100"),
        ("nope", r"neither a preset nor an existing file.*NAME:NODES"),
    ],
)
def test_bad_cluster_specs_are_explained(spec: str, expected: str) -> None:
    with pytest.raises(SchemaError, match=expected):
        load_cluster(spec)


def test_cluster_preset_refuses_zero_nodes() -> None:
    with pytest.raises(SchemaError, match="num_nodes=0"):
        cluster_preset("dgx-h100", 0)


def test_save_and_load_a_cluster_profile_file(tmp_path: Path) -> None:
    profile = cluster_preset("dgx-h100", 3)
    path = tmp_path / "cluster.json"
    save_cluster(profile, path)
    assert json.loads(path.read_text())["num_nodes"] == 3
    assert load_cluster(str(path)) == profile


def test_a_missing_cluster_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match=r"missing\.json' does not exist.*NAME:NODES"):
        load_cluster(str(tmp_path / "missing.json"))


def test_a_malformed_cluster_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    path.write_text('{\n  "name": "x",\n  "num_nodes": ,\n}')
    with pytest.raises(SchemaError, match=r"cluster\.json: malformed JSON at line 3"):
        load_cluster(str(path))


def test_an_invalid_cluster_file_names_the_file_and_the_fields(tmp_path: Path) -> None:
    raw = json.loads(cluster_preset("dgx-a100-80g", 2).model_dump_json())
    raw["num_nodes"] = 0
    del raw["device"]["memory_bytes"]
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(SchemaError) as info:
        load_cluster(str(path))
    message = str(info.value)
    assert "cluster.json" in message and "num_nodes=0" in message
    assert "missing required key 'device.memory_bytes'" in message


def test_a_cluster_file_with_inconsistent_sizes_names_the_file(tmp_path: Path) -> None:
    raw = json.loads(cluster_preset("dgx-a100-80g", 2).model_dump_json())
    raw["num_nodes"] = 3
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(SchemaError, match=r"cluster\.json.*inter_node_links\.size=2 must equal num_nodes=3"):
        load_cluster(str(path))
