"""Parameter counts and model FLOPs against the published formulas (SC21 eq. 2; Korthikanti et al.)."""

import sys
from pathlib import Path

import pytest

from cost_models.layer_work import model_flops_per_sequence
from cost_models.params import active_params, layer_params, total_params
from planner.schemas import ModelSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from sc21 import SC21_TABLE1, SEQ_LEN, VOCAB, Sc21Run


@pytest.mark.parametrize("run", SC21_TABLE1, ids=lambda r: r.name)
def test_sc21_parameter_count_matches_eq2(run: Sc21Run) -> None:
    l, h = run.layers, run.hidden
    eq2 = 12 * l * h**2 * (1 + 13 / (12 * h) + (VOCAB + SEQ_LEN) / (12 * l * h))
    # Eq. 2 leaves out the final LayerNorm (2h).
    assert total_params(run.model()) == pytest.approx(eq2 + 2 * h, rel=1e-12)


@pytest.mark.parametrize("run", SC21_TABLE1, ids=lambda r: r.name)
def test_sc21_parameter_count_matches_its_name(run: Sc21Run) -> None:
    scale = {"B": 1e9, "T": 1e12}[run.name[-1]]
    assert total_params(run.model()) == pytest.approx(float(run.name[:-1]) * scale, rel=0.05)


@pytest.mark.parametrize("run", SC21_TABLE1, ids=lambda r: r.name)
def test_model_flops_match_korthikanti_appendix(run: Sc21Run) -> None:
    l, h, s, v = run.layers, run.hidden, SEQ_LEN, VOCAB
    expected = 72 * s * l * h**2 * (1 + s / (6 * h) + v / (12 * h * l))
    assert model_flops_per_sequence(run.model(), s) == pytest.approx(expected, rel=1e-12)


def test_gqa_swiglu_layer_by_hand() -> None:
    # h 64, 4 heads of 16, 2 kv heads: q,o 64x64, k,v 64x32; SwiGLU f 128: 3 x 64 x 128; 2 RMSNorms 64.
    m = ModelSpec(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=10,
        hidden_act="silu",
        tie_word_embeddings=False,
    )
    lp = layer_params(m)
    assert lp.attention == 2 * 64 * 64 + 2 * 64 * 32
    assert lp.mlp == 3 * 64 * 128
    assert lp.norms == 2 * 64
    # + embedding 10 x 64, untied head 64 x 10, final norm 64.
    assert total_params(m) == lp.total + 640 + 640 + 64
    half = layer_params(m, tensor_parallel_degree=2)
    assert half.attention == lp.attention / 2 and half.norms == lp.norms


def test_moe_active_params_count_top_k_experts() -> None:
    m = ModelSpec(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=10,
        hidden_act="silu",
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    expert = 3 * 64 * 128
    assert total_params(m) - active_params(m) == 2 * 2 * expert
    sharded = layer_params(m, expert_parallel_degree=2)
    assert sharded.mlp == 2 * expert and sharded.router == 64 * 4
