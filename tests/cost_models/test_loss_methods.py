"""What each loss method keeps and allocates per logit (``cost_models.loss_memory``): hand-worked
bytes, and the two eager methods traced by torch's MemTracker as a dry run traces a step."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel
from torch.testing._internal.distributed.fake_pg import FakeStore

from cost_models.loss_memory import loss_element_bytes
from planner.schemas import DType, Layout, LossMethod, ZeroStage
from runtime.loss import cross_entropy


def _layout(p: int, t: int = 1) -> Layout:
    return Layout(
        data_parallel_degree=1,
        tensor_parallel_degree=t,
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
        # torch's over bf16 logits: the same copies in bf16
        (LossMethod.EAGER, DType.BF16, 1, (2, 4)),
        (LossMethod.EAGER, DType.BF16, 2, (4, 4)),
        (LossMethod.EAGER, DType.FP32, 1, (4, 8)),
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


def test_torch_loss_over_split_logits_builds_one_copy_more() -> None:
    # torch's loss_parallel: its log-softmax backward's exp(output) beside the two gradients
    assert loss_element_bytes(DType.BF16, _layout(1, t=2), LossMethod.FP32_EAGER) == (4, 12)
    assert loss_element_bytes(DType.BF16, _layout(1, t=2), LossMethod.EAGER) == (2, 12)  # it works in fp32
    assert loss_element_bytes(DType.BF16, _layout(1, t=2), LossMethod.FP32_IN_PLACE) == (4, 2)


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
        (LossMethod.EAGER, F.cross_entropy),
        (LossMethod.FP32_IN_PLACE, cross_entropy),
    ],
)
def test_the_eager_methods_peak_as_torch_traces_them(method: LossMethod, loss_of: object, dtype: DType) -> None:
    torch_dtype = torch.bfloat16 if dtype is DType.BF16 else torch.float32
    kept, transient = loss_element_bytes(dtype, _layout(1), method)
    # per-token statistics (a few fp32 values a token over 3,000 logits) are not counted
    assert _traced_bytes_per_logit(loss_of, torch_dtype) == pytest.approx(kept + transient, abs=0.01)


@pytest.mark.parametrize("method", [LossMethod.FP32_EAGER, LossMethod.EAGER])
def test_torch_loss_parallel_peaks_as_torch_traces_it(method: LossMethod) -> None:
    # one rank's vocabulary shard of a DTensor, as torchtitan's tensor-parallel output layer
    # returns it, under a process group that only plays the collectives (the dry run's)
    tokens, vocab = 512, 3000
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        weight = distribute_tensor(torch.randn(tokens, vocab, dtype=torch.bfloat16), mesh, [Shard(1)])
        logits = weight.requires_grad_() * 1.0  # not a leaf: the output layer's output
        targets = torch.randint(0, vocab, (tokens,))
        tracker = MemTracker()  # type: ignore[no-untyped-call]
        with tracker, loss_parallel():
            loss = F.cross_entropy(logits.float() if method is LossMethod.FP32_EAGER else logits, targets)
            del logits
            loss.backward()
        peak = tracker.get_tracker_snapshot("peak")  # type: ignore[no-untyped-call]
    finally:
        dist.destroy_process_group()
    kept, transient = loss_element_bytes(DType.BF16, _layout(1, t=2), method)
    traced = sum(v.get("Total", 0) for v in peak.values()) / (tokens * vocab)
    assert traced == pytest.approx(kept + transient, abs=0.05)
