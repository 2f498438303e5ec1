"""What the runtime's pipeline keeps to receive activations and gradients: torch's stages keep a
buffer per micro-batch of the schedule, for each chunk's input and each chunk's output gradient,
across steps, which ``cost_models.communication_buffers.pipeline_buffer_bytes`` prices (``PipelineBuffers``)."""

from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from harness import TINY_LLAMA, Setting, run_ranks

from cost_models.communication_buffers import pipeline_buffer_bytes
from planner.schemas import DType, Layout, PipelineBuffers, Schedule, TrainingSpec

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SETTING = Setting(batch=8, seq_len=16, steps=2)
MICRO_BATCHES = 4
"""The schedule's: 8 sequences in micro-batches of 2, one pipeline."""


def _receive_buffers(layout_kw: dict[str, Any]) -> list[int]:
    """Every rank's bytes of the receive buffers its pipeline stages keep after two steps."""
    trainer = SETTING.trainer(TINY_LLAMA, Layout(**layout_kw))
    SETTING.losses(TINY_LLAMA, trainer)
    schedule = trainer.schedule
    stages = getattr(schedule, "_stages", None) or [schedule._stage]  # type: ignore[union-attr]
    held = 0
    for stage in stages:
        for infos in (*stage.args_recv_info.values(), *stage.grad_recv_info.values()):
            held += sum(i.buffer.numel() * i.buffer.element_size() for i in infos if i.buffer is not None)
    everyone: list[int] = [0] * dist.get_world_size()
    dist.all_gather_object(everyone, held)
    return everyone


@pytest.mark.parametrize(
    "layout_kw",
    [
        {"schedule": Schedule.ONE_F_ONE_B, "virtual_stages": 1},
        {"schedule": Schedule.INTERLEAVED, "virtual_stages": 2},
    ],
    ids=["1f1b", "interleaved"],
)
def test_the_runtime_keeps_a_receive_buffer_per_micro_batch_as_priced(
    layout_kw: dict[str, Any], tmp_path: Path
) -> None:
    kw = {
        "data_parallel_degree": 1,
        "tensor_parallel_degree": 1,
        "pipeline_parallel_degree": 2,
        "micro_batch_size": 2,
        **layout_kw,
    }
    held = run_ranks(2, _receive_buffers, kw, workdir=tmp_path)
    layout = Layout(**kw)
    training = TrainingSpec(global_batch_size=SETTING.batch, seq_len=SETTING.seq_len, dtype=DType.FP32)
    # Buffers of 2 x 16 tokens x 64 wide in fp32, 8 KiB each. With nothing in flight the priced
    # bytes are the kept buffers alone: 1F1B, one a micro-batch on each rank (activations into the
    # second, gradients into the first); interleaved over 4 chunks, both ways into the two in the
    # middle of the model, one way into each end: 3 a micro-batch on each rank.
    priced = [pipeline_buffer_bytes(TINY_LLAMA, training, layout, s, MICRO_BATCHES, 0.0) for s in range(2)]
    one = 2 * 16 * 64 * 4
    assert priced == ([4 * one, 4 * one] if layout.virtual_stages == 1 else [12 * one, 12 * one])
    assert held == priced
    per_transfer = training.model_copy(update={"pipeline_buffers": PipelineBuffers.PER_TRANSFER})
    assert pipeline_buffer_bytes(TINY_LLAMA, per_transfer, layout, 0, MICRO_BATCHES, 2.0) == 0.0
