"""Behaviour pinned by golden files written before the restructuring: the plans the search
chooses for published configurations, and plan files of older schema versions that still load and
estimate as they did. Regenerate only with --update-golden, and say why in the commit."""

import json
from pathlib import Path

import pytest

from cost_models.estimate import estimate
from planner import api
from planner.files.plans import cluster_sha256, load_plan
from planner.schemas import Kernels, TrainingSpec
from planner.schemas.settings import SearchSettings

GOLDEN = Path(__file__).resolve().parent / "golden"
SEARCHES = {
    "gpt3-175b@dgx-a100-80g:128": ("gpt3-175b", "dgx-a100-80g:128", 1536, 2048),
    "llama3-70b@dgx-h100:8": ("llama3-70b", "dgx-h100:8", 512, 8192),
    "llama3-8b@dgx-h100:2": ("llama3-8b", "dgx-h100:2", 256, 4096),
}
OLD_PLANS = (
    "plan_v1_llama3_70b.json",
    "plan_v1_mixtral_search.json",
    "plan_v2_tiny_moe_ep4.json",
    "plan_v3_mixtral_folded_capacity.json",
    "plan_v4_llama3_70b_interleaved.json",
    "plan_v5_llama3_8b_tp2.json",
    "plan_v6_llama3_8b_zero3_eager.json",
    "plan_v9_tiny_moe_selective.json",
)


def _ranked(model: str, cluster: str, batch: int, seq_len: int) -> list[dict[str, object]]:
    # fused kernels: the default before stacks, with which the golden plans were chosen
    training = TrainingSpec(global_batch_size=batch, seq_len=seq_len, kernels=Kernels.FUSED)
    plans = api.search(model, cluster, training, SearchSettings(top_k=3))
    return [
        {
            "layout": p.layout.describe(),
            "layer_split": list(p.layout.layer_split) if p.layout.layer_split else None,
            "step_time_s": p.estimate.step_time_s,
            "peak_memory_bytes": p.estimate.peak_memory_bytes,
        }
        for p in plans
    ]


@pytest.mark.parametrize("case", sorted(SEARCHES))
def test_search_chooses_the_golden_plans(case: str, update_golden: bool) -> None:
    path = GOLDEN / "search_choices.json"
    got = _ranked(*SEARCHES[case])
    recorded = json.loads(path.read_text()) if path.exists() else {}
    if update_golden:
        path.write_text(json.dumps({**recorded, case: got}, indent=2, sort_keys=True) + "\n")
        return
    want = recorded[case]
    assert [g["layout"] for g in got] == [w["layout"] for w in want]
    assert [g["layer_split"] for g in got] == [w["layer_split"] for w in want]
    for g, w in zip(got, want, strict=True):
        assert g["step_time_s"] == pytest.approx(w["step_time_s"], rel=1e-9)
        assert g["peak_memory_bytes"] == pytest.approx(w["peak_memory_bytes"], rel=1e-9)


@pytest.mark.parametrize("name", OLD_PLANS)
def test_an_older_plan_loads_and_estimates_as_it_did(name: str, update_golden: bool) -> None:
    plan = load_plan(GOLDEN / name)
    cluster = api.load_cluster(plan.cluster.spec)
    again = estimate(plan.model, plan.training, cluster, plan.layout)
    if update_golden:  # a changed cost model or preset: the file keeps its version and form, with today's estimate
        raw = json.loads((GOLDEN / name).read_text())
        raw["estimate"] = plan.model_copy(update={"estimate": again}).model_dump(mode="json")["estimate"]
        raw["cluster"]["sha256"] = cluster_sha256(cluster)
        (GOLDEN / name).write_text(json.dumps(raw, indent=2) + "\n")
        return
    assert _flat(again.to_json_dict()) == pytest.approx(_flat(plan.estimate.to_json_dict()), rel=1e-9)


def _flat(value: object, prefix: str = "") -> dict[str, object]:
    """Nested dicts and lists as one mapping of paths to leaves, for an approximate comparison."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}.{key}").items()}
    if isinstance(value, list | tuple):
        return {k: v for i, item in enumerate(value) for k, v in _flat(item, f"{prefix}[{i}]").items()}
    return {prefix: value}
