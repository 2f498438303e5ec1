"""The runtime's optimizer offload (``Layout.optimizer_offload_fraction``): the first share of the
owned fp32 master slices stepped apart, on the host, with the same updates; refused where the
runtime cannot run it; and the dry run's peak without the host's states, as the estimate's.

On this machine the host and the device are the same CPU: the tests below check which slices go
to the host, that stepping them apart and copying them back gives the same weights, and what the
trace holds; the copies across PCIe run only on a GPU (``benchmarks/gpu_check.sh``)."""

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
from harness import MID_GPT
from torch import nn
from torch.testing._internal.distributed.fake_pg import FakeStore

from cost_models.estimate import estimate
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.plans import make_plan
from planner.schemas import DType, Layout, TrainingSpec, ZeroStage
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.plan import PlannedLayout
from planner.schemas.runtime_support import check_runnable
from runtime.dry_run import dry_run
from runtime.optim import MASTER_SLICE_ELEMENTS, DataParallelOptimizer


def _params(seed: int) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    sizes = (3 * MASTER_SLICE_ELEMENTS // 2, 1000, MASTER_SLICE_ELEMENTS)  # 4 slices
    return [nn.Parameter(torch.randn(n, generator=gen).to(torch.bfloat16)) for n in sizes]


def _steps(fraction: float) -> tuple[list[torch.Tensor], DataParallelOptimizer]:
    params = _params(0)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    try:
        group = dist.distributed_c10d._get_default_group()
        opt = DataParallelOptimizer(
            "adamw", params, 1e-2, group, shard=False, reduce_dtype=torch.float32, offload_fraction=fraction
        )
        gen = torch.Generator().manual_seed(1)
        for _ in range(3):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen).to(torch.bfloat16)
            opt.step()
    finally:
        dist.destroy_process_group()
    return [p.detach().clone() for p in params], opt


def test_offloaded_slices_step_apart_to_the_same_weights() -> None:
    kept, plain = _steps(0.0)
    moved, offloaded = _steps(0.5)
    for a, b in zip(kept, moved, strict=True):
        assert torch.equal(a, b)
    assert plain.host_slices == [] and plain.host_bytes() == (0, 0)
    # half of 2.5 slices' worth of elements: the first slice (1 Mi) and the half slice after it
    host = [(piece.start, piece.stop, piece.master.numel()) for group in offloaded.host_slices for piece in group]
    assert host == [
        (0, MASTER_SLICE_ELEMENTS, MASTER_SLICE_ELEMENTS),
        (MASTER_SLICE_ELEMENTS, 3 * MASTER_SLICE_ELEMENTS // 2, MASTER_SLICE_ELEMENTS // 2),
    ]
    elements = 3 * MASTER_SLICE_ELEMENTS // 2
    assert offloaded.host_bytes() == (4 * elements, 8 * elements)
    assert all(piece.master.grad is None for group in offloaded.host_slices for piece in group)


def test_the_runtime_refuses_an_offload_it_cannot_run() -> None:
    model, cluster = load_model("tiny-gpt"), load_cluster("dgx-h100:1")
    training = TrainingSpec(global_batch_size=8, seq_len=64)
    layout = Layout(
        data_parallel_degree=8,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        zero_stage=ZeroStage.OPTIMIZER,
        optimizer_offload_fraction=0.5,
    )
    check_runnable(PlannedLayout(model, training, layout), cuda=True)
    with pytest.raises(InfeasibleConfigError, match=r"on CPU devices the host is the devices' own memory"):
        check_runnable(PlannedLayout(model, training, layout), cuda=False)
    with pytest.raises(InfeasibleConfigError, match=r"FSDP2 would offload the parameters and gradients"):
        check_runnable(PlannedLayout(model, training, replace(layout, zero_stage=ZeroStage.PARAMETERS)), cuda=True)
    with pytest.raises(InfeasibleConfigError, match=r"no master copy to offload"):
        check_runnable(PlannedLayout(model, training.model_copy(update={"dtype": DType.FP32}), layout), cuda=True)
    del cluster


@pytest.mark.slow
def test_the_dry_run_holds_what_the_estimate_keeps_on_the_device() -> None:
    cluster, training = load_cluster("dgx-h100:1"), TrainingSpec(global_batch_size=8, seq_len=1024)
    layout = Layout(
        data_parallel_degree=8,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        zero_stage=ZeroStage.OPTIMIZER,
    )
    traced = {}
    for fraction in (0.0, 0.5, 1.0):
        offloaded = replace(layout, optimizer_offload_fraction=fraction)
        est = estimate(MID_GPT, training, cluster, offloaded)
        memory = est.stages[0].memory
        traced[fraction] = dry_run(make_plan(MID_GPT, training, cluster, "dgx-h100:1", offloaded, est), 0).peak_bytes
        assert memory.total_bytes - memory.workspace_bytes == pytest.approx(traced[fraction], rel=0.05)
    assert traced[0.0] > traced[0.5] > traced[1.0]


def test_the_runtime_runs_a_weight_offload_of_a_dense_model_only_and_the_dry_run_says_it_cannot_trace_one() -> None:
    cluster, training = load_cluster("dgx-h100:1"), TrainingSpec(global_batch_size=8, seq_len=64)
    layout = Layout(
        data_parallel_degree=8,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        zero_stage=ZeroStage.PARAMETERS,
        optimizer_offload_fraction=1.0,
        parameter_offload=True,
    )
    dense = load_model("tiny-gpt")
    check_runnable(PlannedLayout(dense, training, layout), cuda=True)
    with pytest.raises(InfeasibleConfigError, match=r"routed experts outside FSDP2"):
        check_runnable(PlannedLayout(load_model("tiny-moe"), training, layout), cuda=True)
    with pytest.raises(InfeasibleConfigError, match=r"FSDP2 would offload the parameters and gradients"):
        check_runnable(PlannedLayout(dense, training, replace(layout, parameter_offload=False)), cuda=True)
    plan = make_plan(dense, training, cluster, "dgx-h100:1", layout, estimate(dense, training, cluster, layout))
    with pytest.raises(InfeasibleConfigError, match=r"the dry run traces on the CPU"):
        dry_run(plan, 0)
