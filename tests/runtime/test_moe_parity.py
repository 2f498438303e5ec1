"""Mixture of experts: routing by hand-worked values, placement tables and the layouts and tables
the runtime refuses, a routing-trace file. The expert-parallel layouts' training on 4 ranks is
checked in test_moe_layouts_parity (one launch for every MoE layout)."""

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from moe_training import MOE, PLACED

from planner.files.models import load_model
from planner.schemas import Layout
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.layout import check_experts
from runtime.expert_parallel import PlacementTable, check_placement, placement_table
from runtime.mlp import MoE, local_experts, route
from runtime.model import Decoder
from runtime.routing_trace import save_routing_trace


def test_route_renormalizes_the_top_k_softmax() -> None:
    # softmax of (0, ln 2, ln 4) is (1, 2, 4) / 7; the top two, renormalized: (4, 2) / 6
    weights, ids = route(torch.tensor([[0.0, math.log(2), math.log(4)]]), 2)
    assert ids.tolist() == [[2, 1]]
    assert weights[0].tolist() == pytest.approx([2 / 3, 1 / 3], abs=1e-6)


def test_local_experts_sum_each_tokens_weighted_experts() -> None:
    moe = Decoder(MOE, seed=1).layers["0"].mlp
    assert isinstance(moe, MoE)
    tokens = torch.randn(5, MOE.hidden_size, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[0, 3], [1, 2], [3, 0], [2, 1], [0, 1]])
    weights = torch.rand(5, 2, generator=torch.Generator().manual_seed(1))
    out = local_experts(moe.experts, tokens, ids, weights)
    for n in range(5):
        expected = sum(weights[n, j] * moe.experts[str(int(ids[n, j]))](tokens[n]) for j in range(2))
        assert torch.allclose(out[n], expected, atol=1e-6)


def test_a_chunk_holding_some_experts_holds_the_references_values() -> None:
    whole = dict(Decoder(MOE, seed=3).named_parameters())
    part = dict(Decoder(MOE, seed=3, experts={0: (1, 3), 2: (0,)}).named_parameters())
    assert "layers.0.mlp.experts.1.up.weight" in part and "layers.0.mlp.experts.0.up.weight" not in part
    assert "layers.1.mlp.experts.0.up.weight" in part  # layers not listed hold every expert
    assert all(torch.equal(p, whole[name]) for name, p in part.items())


def _layout(ep: int, **kw: Any) -> Layout:
    return Layout(
        data_parallel_degree=4,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        expert_parallel_degree=ep,
        **kw,
    )


def test_placement_table_contiguous_or_the_layouts() -> None:
    assert placement_table(MOE, _layout(2)) == (((0, 1), (2, 3)),) * 4
    assert placement_table(MOE, _layout(4)) == (((0,), (1,), (2,), (3,)),) * 4
    assert placement_table(MOE, _layout(2, expert_placement=PLACED)) == PLACED.slots


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ((((0, 1), (2, 3)),) * 3, "3 layer"),
        ((((0, 1), (1, 3)),) * 4, "at least once"),
        ((((0, 1, 2), (3, 3)),) * 4, "no expert twice"),
        ((((0, 1, 2, 3),),) * 4, "each of the ep=2 ranks"),
    ],
)
def test_placement_tables_the_runtime_cannot_run_are_refused(table: PlacementTable, match: str) -> None:
    with pytest.raises(InfeasibleConfigError, match=match):
        check_placement(MOE, _layout(2), table)


def test_an_expert_parallel_degree_that_does_not_divide_the_experts_is_refused() -> None:
    model = MOE.model_copy(update={"num_local_experts": 6})
    with pytest.raises(InfeasibleConfigError, match="does not divide the 6 experts"):
        check_experts(model, _layout(4))  # what the trainer checks before any work


def test_expert_parallelism_of_a_dense_model_is_refused() -> None:
    with pytest.raises(InfeasibleConfigError, match="is dense; set it to 1"):
        check_experts(load_model("tiny-gpt"), _layout(2))


def test_a_routing_trace_file_holds_ids_experts_and_model(tmp_path: Path) -> None:
    ids = np.array([[[0, 3], [1, 2]], [[2, 1], [3, 0]], [[1, 0], [0, 1]]])
    save_routing_trace(tmp_path / "trace.npz", ids, MOE)
    with np.load(tmp_path / "trace.npz") as f:
        assert f["expert_ids"].tolist() == ids.tolist() and f["expert_ids"].dtype == np.int64
        assert int(f["num_experts"]) == 4 and str(f["model"]) == "tiny-moe"
