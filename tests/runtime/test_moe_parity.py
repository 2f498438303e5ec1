"""Mixture of experts: routing by hand-worked values, placement tables, and expert-parallel layouts
that train like the single-process reference (losses within the dense parity tests' 1e-5; SGD,
float32 on CPU): ep 2 and 4, ZeRO-1/2/3, a per-layer non-contiguous placement, tp x dp x ep and
pp x dp x ep. One 4-rank launch checks every layout (each launch costs seconds)."""

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from harness import run_ranks
from moe_training import (
    BATCH,
    MOE,
    SEQ,
    STEPS,
    TOLERANCE,
    batch,
    layout_of,
    moe_trainer,
    reference_routing,
    train_losses,
    train_reference,
)

from planner.inputs import load_model
from planner.schemas import DeviceMap, DType, Layout
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.layout import check_experts
from planner.schemas.routing import ExpertPlacement
from runtime.expert_parallel import PlacementTable, check_placement, placement_table
from runtime.model import Decoder, MoE, local_experts, route
from runtime.routing_trace import gather_routing, record_routing, save_routing_trace


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


SHUFFLED: PlacementTable = (((0, 3), (1, 2)), ((2, 1), (3, 0)), ((1, 2), (0, 3)), ((3, 0), (2, 1)))
"""Every layer its own non-contiguous placement over ep=2, experts out of order within a rank."""

MIXED = [
    dict(data_parallel_degree=4, expert_parallel_degree=2),
    dict(data_parallel_degree=4, expert_parallel_degree=4, zero_stage=1),
]
"""Layouts trained in bf16 mixed precision (within bf16 rounding, 1e-3, as the dense test)."""

PLACED = ExpertPlacement(slots=(((1, 2), (0, 3)), ((0, 3), (1, 2)), ((2, 1), (3, 0)), ((1, 2), (0, 3))))
"""A plan's placement (schemas.routing), not contiguous, differing by layer."""

REPLICATED: PlacementTable = (((0, 1, 2), (0, 3)), ((1, 3), (2, 0, 3)), ((0, 1), (2, 3)), ((3, 2, 1), (0, 1)))
"""Some layers with an expert on both ranks (and uneven counts), one layer without replicas."""

UNEVEN: PlacementTable = (((0, 1, 2), (3,)), ((1,), (0, 2, 3)), ((3, 2), (1, 0)), ((2, 0, 3), (1,)))
"""Ranks hosting different numbers of experts in some layers."""

LAYOUTS: list[tuple[dict[str, Any], PlacementTable | None]] = [
    (dict(data_parallel_degree=4, expert_parallel_degree=2), None),
    (dict(data_parallel_degree=4, expert_parallel_degree=4, micro_batch_size=2), None),
    (dict(data_parallel_degree=4, expert_parallel_degree=2, zero_stage=1, expert_placement=PLACED), None),
    (dict(data_parallel_degree=4, expert_parallel_degree=2), SHUFFLED),
    (dict(data_parallel_degree=4, expert_parallel_degree=2), UNEVEN),
    (dict(data_parallel_degree=4, expert_parallel_degree=2, zero_stage=1), REPLICATED),
    (dict(data_parallel_degree=2, tensor_parallel_degree=2, expert_parallel_degree=2, zero_stage=3), REPLICATED),
    (dict(data_parallel_degree=2, tensor_parallel_degree=2, expert_parallel_degree=2), None),
    (dict(data_parallel_degree=4, expert_parallel_degree=2, zero_stage=3), None),
    # a DeviceMap listing the ep and edp axes' devices out of order (ordered groups, runtime.mesh)
    (dict(data_parallel_degree=4, expert_parallel_degree=2, device_map=DeviceMap(devices=(3, 1, 0, 2))), None),
    (dict(data_parallel_degree=2, tensor_parallel_degree=2, expert_parallel_degree=2, sequence_parallel=True), None),
    (dict(data_parallel_degree=2, tensor_parallel_degree=2, expert_parallel_degree=2, zero_stage=2), None),
    (dict(data_parallel_degree=2, pipeline_parallel_degree=2, expert_parallel_degree=2), None),
    (dict(data_parallel_degree=2, pipeline_parallel_degree=2, zero_stage=1), None),
]


TRACED = [
    dict(data_parallel_degree=2, pipeline_parallel_degree=2, expert_parallel_degree=2),
    dict(data_parallel_degree=2, tensor_parallel_degree=2, expert_parallel_degree=2, recompute="full"),
]
"""Layouts whose first step's routing trace is compared with the reference's routing."""

MEASURED = (dict(data_parallel_degree=4, expert_parallel_degree=2), SHUFFLED)
"""A layout whose measured all-to-all traffic is compared with the reference's routing."""


def measure_traffic(kw: dict[str, Any], table: PlacementTable) -> list[dict[int, list[int]]]:
    """Pairs each data-parallel replica sent to each expert-parallel rank, by layer, in one step."""
    trainer = moe_trainer(layout_of(kw), table)
    trainer.step(*batch(0))
    sent = {int(i): block.mlp.dispatch.sent_pairs for i, block in trainer.chunks[0].layers.items()}
    everyone: list[tuple[int, dict[int, list[int]]]] = [(0, {})] * dist.get_world_size()
    dist.all_gather_object(everyone, (trainer.dp_rank, sent))
    return [layers for _, layers in sorted(everyone)]


def train_and_trace(
    layouts: list[tuple[dict[str, Any], PlacementTable | None]],
    mixed: list[dict[str, Any]],
    traced: list[dict[str, Any]],
) -> dict[str, Any]:
    """Losses of ``train``, the routing trace of each of ``traced`` over one step, and the
    traffic of ``MEASURED``."""
    traffic = measure_traffic(*MEASURED)
    traces = []
    for kw in traced:
        trainer = moe_trainer(layout_of(kw))
        record_routing(trainer)
        trainer.step(*batch(0))
        ids = gather_routing(trainer, BATCH // kw["data_parallel_degree"] * SEQ)
        traces.append(None if ids is None else ids.tolist())
    return {"losses": train(layouts, mixed), "traces": traces, "traffic": traffic}


def train(
    layouts: list[tuple[dict[str, Any], PlacementTable | None]], mixed: list[dict[str, Any]]
) -> list[list[float]]:
    """Each layout's losses for STEPS steps, fp32 then ``mixed`` in bf16 (runs on every rank)."""
    results = []
    cases = [(kw, table, DType.FP32) for kw, table in layouts] + [(kw, None, DType.BF16) for kw in mixed]
    for kw, table, dtype in cases:
        results.append(train_losses(moe_trainer(layout_of(kw), table, dtype)))
    return results


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_four_ranks_expert_parallel_layouts_match_the_reference(tmp_path: Path) -> None:
    reference, _ = train_reference()
    assert len(set(reference)) == STEPS  # the steps do update the parameters
    out = run_ranks(4, train_and_trace, LAYOUTS, MIXED, TRACED, workdir=tmp_path)
    results = out["losses"]
    for (kw, table), losses in zip(LAYOUTS, results[: len(LAYOUTS)], strict=True):
        assert losses == pytest.approx(reference, abs=TOLERANCE), (kw, table)
    for kw, losses in zip(MIXED, results[len(LAYOUTS) :], strict=True):
        assert losses == pytest.approx(reference, abs=1e-3), kw
    # the trace: every layer's top-k of every token of the step, as the reference routes them
    routed = reference_routing(0)
    assert routed.shape == (BATCH * SEQ, MOE.num_hidden_layers, MOE.num_experts_per_tok)
    for kw, trace in zip(TRACED, out["traces"], strict=True):
        assert np.array_equal(np.array(trace), routed), kw
    # the traffic: each replica's pairs (its rows' tokens x k) to the rank hosting each expert
    kw, table = MEASURED
    rows = BATCH // kw["data_parallel_degree"] * SEQ
    assert len(out["traffic"]) == kw["data_parallel_degree"]
    for replica, measured in enumerate(out["traffic"]):
        mine = routed[replica * rows : (replica + 1) * rows]
        for layer, hosts in enumerate(table):
            expected = [int(np.isin(mine[:, layer], hosted).sum()) for hosted in hosts]
            assert measured[str(layer)] == expected, (replica, layer)


def test_a_routing_trace_file_holds_ids_experts_and_model(tmp_path: Path) -> None:
    ids = np.array([[[0, 3], [1, 2]], [[2, 1], [3, 0]], [[1, 0], [0, 1]]])
    save_routing_trace(tmp_path / "trace.npz", ids, MOE)
    with np.load(tmp_path / "trace.npz") as f:
        assert f["expert_ids"].tolist() == ids.tolist() and f["expert_ids"].dtype == np.int64
        assert int(f["num_experts"]) == 4 and str(f["model"]) == "tiny-moe"
