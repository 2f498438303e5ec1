"""What each loss method keeps and allocates per logit (``cost_models.loss_memory``): hand-worked
bytes, and the two eager methods traced by torch's MemTracker as a dry run traces a step."""

import pytest
import torch
import torch.nn.functional as F
from torch.distributed._tools.mem_tracker import MemTracker

from cost_models.loss_memory import loss_element_bytes
from planner.schemas import DType, Layout, LossMethod, ZeroStage
from runtime.loss import cross_entropy


def _layout(p: int) -> Layout:
    return Layout(
        data_parallel_degree=1,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=p,
        micro_batch_size=1,
        zero_stage=ZeroStage.NONE,
    )


@pytest.mark.parametrize(
    ("method", "dtype", "p", "expected"),
    [
        # torch's: the fp32 log-softmax kept, its backward's two fp32 gradients beside it
        (LossMethod.FP32_EAGER, DType.BF16, 1, (4, 8)),
        (LossMethod.FP32_EAGER, DType.FP32, 1, (4, 8)),
        (LossMethod.FP32_EAGER, DType.BF16, 2, (6, 8)),  # + the stage's bf16 output
        # fused: the logits kept (the stage's own under a pipeline), a gradient in their precision
        (LossMethod.FUSED, DType.BF16, 1, (2, 2)),
        (LossMethod.FUSED, DType.BF16, 2, (2, 2)),
        (LossMethod.FUSED, DType.FP32, 1, (4, 4)),
    ],
)
def test_each_loss_method_keeps_and_adds_its_copies(
    method: LossMethod, dtype: DType, p: int, expected: tuple[int, int]
) -> None:
    assert loss_element_bytes(dtype, _layout(p), method) == expected


def _traced_bytes_per_logit(loss_of: object, dtype: torch.dtype) -> float:
    """The peak bytes a loss's forward and backward allocate, per logit, beyond the logits (made
    before the trace, as the output layer makes them)."""
    tokens, vocab = 512, 3000
    weight = torch.randn(tokens, vocab, dtype=dtype, requires_grad=True)
    logits = weight * 1.0  # not a leaf: the output layer's output
    targets = torch.randint(0, vocab, (tokens,))
    tracker = MemTracker()  # type: ignore[no-untyped-call]
    with tracker:
        loss = loss_of(logits, targets)  # type: ignore[operator]
        del logits  # the trainer's step keeps no reference to them
        loss.backward()
    peak = tracker.get_tracker_snapshot("peak")  # type: ignore[no-untyped-call]
    return sum(v.get("Total", 0) for v in peak.values()) / (tokens * vocab)


@pytest.mark.parametrize("dtype", [DType.BF16, DType.FP32])
@pytest.mark.parametrize(
    ("method", "loss_of"),
    [
        (LossMethod.FP32_EAGER, lambda logits, targets: F.cross_entropy(logits.float(), targets)),
        (LossMethod.FP32_IN_PLACE, cross_entropy),
    ],
)
def test_the_eager_methods_peak_as_torch_traces_them(method: LossMethod, loss_of: object, dtype: DType) -> None:
    torch_dtype = torch.bfloat16 if dtype is DType.BF16 else torch.float32
    kept, transient = loss_element_bytes(dtype, _layout(1), method)
    # per-token statistics (a few fp32 values a token over 3,000 logits) are not counted
    assert _traced_bytes_per_logit(loss_of, torch_dtype) == pytest.approx(kept + transient, abs=0.01)
