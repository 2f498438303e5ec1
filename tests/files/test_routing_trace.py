"""Routing traces: the file format, its checks, the summary and the synthetic generator."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from planner.files.models import load_model
from planner.files.routing_trace import load_routing_stats, read_trace, summarize, synthetic_trace, write_trace
from planner.schemas.errors import SchemaError

MIXTRAL = load_model("mixtral-8x7b")  # 32 MoE layers of 8 experts, top-2


def _mixtral_trace(tokens: int = 50) -> np.ndarray:
    return synthetic_trace(tokens=tokens, layers=32, num_experts=8, experts_per_token=2, skew=1.0, affinity=0.5, seed=3)


def test_a_written_trace_reads_back(tmp_path: Path) -> None:
    ids = _mixtral_trace()
    write_trace(tmp_path / "t.npz", ids, 8, "mixtral-8x7b")
    got, experts, name = read_trace(tmp_path / "t.npz", MIXTRAL)
    assert (got == ids).all() and experts == 8 and name == "mixtral-8x7b"
    stats = load_routing_stats(tmp_path / "t.npz", MIXTRAL)
    assert stats.num_layers == 32 and stats.routed_tokens == 50 and stats.experts_per_token == 2


def test_the_summary_is_the_hand_worked_counts() -> None:
    # Two tokens, two layers, top-2 of 3 experts: token 0 -> {0, 1} then {1, 2}; token 1 -> {0, 2} then {2, 0}.
    stats = summarize(np.array([[[0, 1], [1, 2]], [[0, 2], [2, 0]]]), 3, "hand")
    assert stats.expert_tokens.tolist() == [[2, 1, 1], [1, 1, 2]]
    # Pairs (layer-0 expert, layer-1 expert): token 0 gives 0-1, 0-2, 1-1, 1-2; token 1 gives 0-2, 0-0, 2-2, 2-0.
    assert stats.coactivation_matrix(0).tolist() == [[1, 1, 2], [0, 1, 1], [1, 0, 1]]
    assert stats.coactivation_matrix(0).sum() == 2 * 2 * 2  # k^2 pairs per token


def _save(path: Path, **arrays: object) -> Path:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


REPEATS = np.concatenate([np.tile([3, 1], (2, 32, 1)), [[[1, 2]] * 31 + [[5, 5]]] * 2])


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"num_experts": np.int64(8), "model": np.str_("m")}, "lacks \\['expert_ids'\\]"),
        ({"expert_ids": np.zeros((4, 32)), "num_experts": np.int64(8), "model": np.str_("m")}, "shape \\(4, 32\\)"),
        (
            {"expert_ids": np.full((4, 32, 2), 8), "num_experts": np.int64(8), "model": np.str_("m")},
            "span 8..8, outside 0..7",
        ),
        ({"expert_ids": np.zeros((4, 32, 2)), "num_experts": np.int64(8), "model": np.str_("m")}, "dtype float64"),
        (
            {"expert_ids": np.zeros((4, 31, 2), dtype=int), "num_experts": np.int64(8), "model": np.str_("m")},
            "has 31 MoE layers, 8 experts and top-2, but 'mixtral-8x7b' has 32 MoE layers",
        ),
        (
            {"expert_ids": np.zeros((4, 32, 2), dtype=int), "num_experts": np.int64(16), "model": np.str_("m")},
            "16 experts",
        ),
        (
            {"expert_ids": np.zeros((4, 32, 1), dtype=int), "num_experts": np.int64(8), "model": np.str_("m")},
            "top-1",
        ),
        ({"expert_ids": np.zeros((4, 32, 2), dtype=int), "num_experts": np.int64(8), "model": np.int64(3)}, "model="),
        (  # tokens 0-1 go to experts 3 and 1 in every layer; tokens 2-3 to 1 and 2, but to 5 twice in the last
            {"expert_ids": REPEATS, "num_experts": np.int64(8), "model": np.str_("m")},
            r"token 2 goes to expert 5 twice or more in MoE layer 31 \(\[5, 5\]\)",
        ),
    ],
)
def test_a_bad_trace_is_refused_naming_the_file_and_the_value(
    tmp_path: Path, arrays: dict[str, object], message: str
) -> None:
    path = _save(tmp_path / "bad.npz", **arrays)
    with pytest.raises(SchemaError, match=message) as caught:
        read_trace(path, MIXTRAL)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_a_file_that_is_not_an_npz_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "trace.npz"
    path.write_text("tokens,layer,expert\n")
    with pytest.raises(SchemaError, match=r"is not a NumPy \.npz file"):
        read_trace(path)
    with pytest.raises(SchemaError, match="does not exist"):
        read_trace(tmp_path / "missing.npz")
    # One array saved with np.save: np.load returns the array itself, not the archive of a trace.
    np.save(tmp_path / "ids.npy", _mixtral_trace())
    with pytest.raises(SchemaError, match=r"ids\.npy' is not a NumPy \.npz file"):
        read_trace(tmp_path / "ids.npy")


def test_a_trace_for_a_dense_model_is_refused(tmp_path: Path) -> None:
    write_trace(tmp_path / "t.npz", _mixtral_trace(), 8, "mixtral-8x7b")
    with pytest.raises(SchemaError, match="'tiny-gpt' has none; drop the routing trace"):
        read_trace(tmp_path / "t.npz", load_model("tiny-gpt"))


def test_the_generator_is_seeded_and_routes_k_distinct_experts() -> None:
    a = synthetic_trace(tokens=500, layers=4, num_experts=16, experts_per_token=4, skew=1.0, affinity=0.7, seed=9)
    assert (
        a == synthetic_trace(tokens=500, layers=4, num_experts=16, experts_per_token=4, skew=1.0, affinity=0.7, seed=9)
    ).all()
    assert a.shape == (500, 4, 4) and all(len(set(row)) == 4 for row in a.reshape(-1, 4).tolist())


def test_skew_concentrates_tokens_on_the_hottest_experts() -> None:
    def hottest_share(skew: float) -> float:
        ids = synthetic_trace(
            tokens=4000, layers=1, num_experts=32, experts_per_token=1, skew=skew, affinity=0.0, seed=0
        )
        return float(np.bincount(ids.ravel(), minlength=32).max() / 4000)

    assert hottest_share(0.0) < 0.06  # uniform: 1/32 = 0.031 plus noise
    # Zipf with s = 1.5 over 32 experts: the hottest gets 1 / sum_q q^-1.5 = 0.41 of the tokens.
    assert hottest_share(1.5) == pytest.approx(1 / sum(q**-1.5 for q in range(1, 33)), abs=0.03)


def test_affinity_is_the_share_of_tokens_following_their_partner() -> None:
    # top-1, uniform: a token follows its expert's partner with probability affinity, or lands on
    # the partner by chance (1/E of the rest); the partner is each expert's commonest successor.
    ids = synthetic_trace(tokens=20000, layers=2, num_experts=8, experts_per_token=1, skew=0.0, affinity=0.6, seed=1)
    together = summarize(ids, 8, "a").coactivation_matrix(0)
    followed = together.max(axis=1).sum() / together.sum()
    assert followed == pytest.approx(0.6 + 0.4 / 8, abs=0.02)
    assert len(set(together.argmax(axis=1).tolist())) == 8  # the partners are a permutation


def test_bad_generator_settings_are_refused() -> None:
    with pytest.raises(SchemaError, match=r"affinity=1\.5"):
        synthetic_trace(tokens=1, layers=1, num_experts=4, experts_per_token=1, skew=1.0, affinity=1.5, seed=0)


def test_search_with_a_routing_trace_writes_a_plan_with_its_placement(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from planner.cli import app
    from planner.files.plans import load_plan
    from planner.schemas import ExpertPlacement
    from planner.schemas.routing import placement_metrics
    from planner.search_engine.expert_placement import expert_rank_nodes

    trace, out = tmp_path / "trace.npz", tmp_path / "plan.json"
    ids = _mixtral_trace(tokens=2000)
    write_trace(trace, ids, 8, "mixtral-8x7b")
    args = ["search", "-m", "mixtral-8x7b", "-c", "dgx-h100:2", "--global-batch-size", "64", "--seq-len", "1024"]
    result = CliRunner().invoke(app, [*args, "--routing-trace", str(trace), "--output", str(out)])
    assert result.exit_code == 0, result.output
    plan = load_plan(out)
    placement = plan.layout.expert_placement
    assert placement is not None and placement.num_ranks == plan.layout.expert_parallel_degree > 1
    stats = summarize(ids, 8, "mixtral-8x7b")
    nodes = expert_rank_nodes(plan.layout, plan.cluster.devices_per_node)
    base = ExpertPlacement.round_robin(8, placement.num_ranks, 32)
    ours, theirs = placement_metrics(stats, placement, nodes), placement_metrics(stats, base, nodes)
    assert ours.cross_rank_tokens < theirs.cross_rank_tokens
    # A trace of another model: one line naming the file and the fix, exit 2.
    write_trace(trace, ids[:, :4], 8, "other")
    done = subprocess.run(
        [sys.executable, "-m", "planner", *args, "--routing-trace", str(trace)], capture_output=True, text=True
    )
    assert done.returncode == 2 and str(trace) in done.stderr + done.stdout
    assert "has 4 MoE layers" in done.stderr + done.stdout and "Traceback" not in done.stderr


def test_more_replica_slots_than_any_rank_has_free_are_refused_before_the_search() -> None:
    """Mixtral's 8 experts on 16 ranks: at ep 8 a rank hosts 1 and has 7 free slots, the most any ep
    leaves; 8 would be dropped silently by every plan."""
    from planner.flows.search import check_replica_slots

    check_replica_slots(7, MIXTRAL, 16)
    with pytest.raises(SchemaError, match=r"--expert-replicas 8 is more than any rank has free.*at most E - E/ep = 7"):
        check_replica_slots(8, MIXTRAL, 16)
    with pytest.raises(SchemaError, match=r"= 6 spare slots \(ep 4\) on 4 ranks; give --expert-replicas 6 or less"):
        check_replica_slots(7, MIXTRAL, 4)
