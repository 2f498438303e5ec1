"""Every layout family trains like the single-process reference: the losses of the first steps
match within 1e-5 (SGD, so parameters stay in step exactly; float32 on CPU).

One launch per world size checks many layouts, amortizing process start-up (field notes)."""

from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from harness import PARITY_TOLERANCE, TINY_LLAMA, Setting, check_parity, reference_of, run_ranks, train_layouts

from planner.files.models import load_model
from planner.schemas import DeviceMap, DType, Layout, ModelSpec
from planner.schemas.geometry import coordinates

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(600)]

SETTING = Setting()  # batch 8, sequence 32, 3 steps
GPT = load_model("tiny-gpt")  # GELU, LayerNorm, learned positions, tied embeddings


def L(d: int, t: int, p: int, b: int, **kw: Any) -> dict[str, Any]:
    return dict(data_parallel_degree=d, tensor_parallel_degree=t, pipeline_parallel_degree=p, micro_batch_size=b, **kw)


@pytest.mark.torch_oldest  # pipelines on synthetic batches, ZeRO-2
def test_two_ranks_every_family(tmp_path: Path) -> None:
    check_parity(
        GPT,
        2,
        [
            L(2, 1, 1, 2),
            L(2, 1, 1, 1, zero_stage=1),
            L(2, 1, 1, 2, zero_stage=2),
            L(2, 1, 1, 1, zero_stage=3),
            L(1, 2, 1, 4),
            L(1, 1, 2, 2),
            L(1, 1, 2, 1, schedule="gpipe"),
            L(1, 1, 2, 1, layer_split=(1, 3)),
            L(1, 1, 2, 1, schedule="interleaved", virtual_stages=2),
        ],
        tmp_path,
    )


def test_four_ranks_combinations(tmp_path: Path) -> None:
    check_parity(
        GPT,
        4,
        [
            L(2, 2, 1, 2),
            L(2, 1, 2, 1),
            L(1, 2, 2, 1),
            L(1, 1, 4, 1, layer_split=(0, 2, 1, 1)),
            L(2, 1, 2, 1, schedule="interleaved", virtual_stages=2),
            L(2, 2, 1, 1, zero_stage=3),
            L(2, 1, 2, 1, zero_stage=2),
            L(2, 2, 1, 1, zero_stage=1),
            # a step as 2 schedules of 2 micro-batches, ZeRO-2's reduction after each
            L(2, 1, 2, 1, zero_stage=2, pipeline_flushes=2),
            # full recompute of both of the first stage's layers, of one of the second's (block method)
            L(2, 1, 2, 1, recompute="full", recompute_layers=(2, 1)),
        ],
        tmp_path,
    )


def test_four_ranks_swiglu_gqa_rope_untied(tmp_path: Path) -> None:
    check_parity(
        TINY_LLAMA,
        4,
        [L(2, 2, 1, 2), L(1, 2, 2, 1), L(2, 1, 2, 1, zero_stage=3), L(4, 1, 1, 1, zero_stage=1)],
        tmp_path,
    )


def test_eight_ranks_three_dimensions(tmp_path: Path) -> None:
    check_parity(
        GPT,
        8,
        [
            L(2, 2, 2, 1),
            L(2, 2, 2, 1, zero_stage=3),
            L(2, 2, 2, 1, schedule="interleaved", virtual_stages=2, zero_stage=2),
            L(8, 1, 1, 1),
        ],
        tmp_path,
    )


@pytest.mark.parametrize(
    "model", [pytest.param(GPT, marks=pytest.mark.torch_oldest), TINY_LLAMA], ids=lambda m: m.name
)  # the sequence-parallel collectives
def test_four_ranks_sequence_parallel_and_recompute(model: ModelSpec, tmp_path: Path) -> None:
    check_parity(
        model,
        4,
        [
            L(2, 2, 1, 2, sequence_parallel=True),
            L(1, 2, 2, 1, sequence_parallel=True),
            L(2, 2, 1, 1, sequence_parallel=True, zero_stage=3),
            L(2, 1, 2, 1, recompute="full"),
            L(2, 2, 1, 1, recompute="selective"),
            L(1, 2, 2, 1, recompute="full", sequence_parallel=True, zero_stage=2),
        ],
        tmp_path,
    )


def train_placed(model: ModelSpec, layouts: list[dict[str, Any]]) -> list[list[float]]:
    """``train_layouts``, first checking that this process plays the plan rank its DeviceMap gives it."""
    for kw in layouts:
        layout = Layout(**kw)
        plan_rank = [layout.device_map.device_of(r) for r in range(layout.world_size)].index(dist.get_rank())
        trainer = SETTING.trainer(model, layout)
        stage, replica, _ = coordinates(layout, plan_rank)
        assert (trainer.pp_rank, trainer.dp_rank) == (stage, replica), (kw, dist.get_rank())
    return train_layouts(model, layouts)


def test_four_ranks_device_map_trains_as_the_identity(tmp_path: Path) -> None:
    """Under a DeviceMap the process of rank r's device plays rank r; losses are the identity's
    (every mesh axis below lists its devices out of increasing order somewhere)."""
    mapped = [
        L(2, 2, 1, 2, device_map=DeviceMap(devices=(2, 3, 0, 1))),
        L(1, 2, 2, 1, device_map=DeviceMap(devices=(3, 1, 2, 0))),
        L(2, 1, 2, 1, zero_stage=3, device_map=DeviceMap(devices=(1, 3, 0, 2))),
        L(2, 2, 1, 1, zero_stage=1, sequence_parallel=True, device_map=DeviceMap(devices=(1, 0, 3, 2))),
    ]
    identity = [{**kw, "device_map": DeviceMap()} for kw in mapped]
    results = run_ranks(4, train_placed, GPT, identity + mapped, workdir=tmp_path)
    reference = reference_of(GPT)
    for kw, same, placed in zip(mapped, results[: len(mapped)], results[len(mapped) :], strict=True):
        assert placed == pytest.approx(same, abs=1e-6), kw
        assert placed == pytest.approx(reference, abs=PARITY_TOLERANCE), kw


def train_mixed(model: ModelSpec, layouts: list[dict[str, Any]]) -> list[list[float]]:
    """``train_layouts`` in bf16 mixed precision (bf16 weights, gradients, activations; fp32 masters)."""
    return [SETTING.losses(model, SETTING.trainer(model, Layout(**kw), dtype=DType.BF16)) for kw in layouts]


def test_mixed_precision_stays_within_bf16_rounding_of_the_reference(tmp_path: Path) -> None:
    reference = reference_of(GPT)
    layouts = [
        L(4, 1, 1, 2),
        L(4, 1, 1, 2, zero_stage=1),
        L(2, 2, 1, 2, zero_stage=3, sequence_parallel=True),
        L(1, 2, 2, 1, sequence_parallel=True, zero_stage=1),
    ]
    results = run_ranks(4, train_mixed, GPT, layouts, workdir=tmp_path)
    for kw, losses in zip(layouts, results, strict=True):
        assert losses == pytest.approx(reference, abs=1e-3), kw
