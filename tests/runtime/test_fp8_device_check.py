"""An FP8 plan is refused before any work on a CUDA device without the tensor cores its recipe
needs (compute capability 8.9 for FP8, 10.0 for MXFP8), in one line naming the recipe, the
device and the fix; a CPU, where torch emulates the scaled matmul, runs it."""

import pytest
import torch

from cost_models.estimate import estimate
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.plans import make_plan
from planner.schemas import Layout, TrainingSpec
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.plan import PlannedLayout
from planner.schemas.runtime_support import check_fp8_device
from runtime.run import check_world

LAYOUT = Layout(data_parallel_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)


def _plan(fp8: str | None, stack: str = "planner-runtime") -> PlannedLayout:
    training = TrainingSpec(global_batch_size=8, seq_len=4096, fp8=fp8, stack=stack)
    return PlannedLayout(load_model("llama3-8b"), training, LAYOUT)


@pytest.mark.parametrize(("capability", "refused"), [((8, 0), True), ((8, 6), True), ((8, 9), False), ((9, 0), False)])
def test_fp8_needs_ada_or_hopper(capability: tuple[int, int], refused: bool) -> None:
    if refused:
        with pytest.raises(InfeasibleConfigError, match=r"'tensorwise'.*capability 8\.9 or later.*plan without --fp8"):
            check_fp8_device(_plan("tensorwise"), capability, "NVIDIA A100-SXM4-80GB")
    else:
        check_fp8_device(_plan("tensorwise"), capability)


def test_mxfp8_needs_blackwell_and_nothing_is_asked_of_bf16_or_a_cpu() -> None:
    with pytest.raises(InfeasibleConfigError, match=r"'mxfp8'.*mxfp8 tensor cores.*10\.0 or later.*has 9\.0"):
        check_fp8_device(_plan("mxfp8", stack="torchtitan"), (9, 0), "NVIDIA H100 80GB HBM3")
    check_fp8_device(_plan("mxfp8", stack="torchtitan"), (10, 0))
    check_fp8_device(_plan(None), (7, 0))
    check_fp8_device(_plan("tensorwise"), None)


def test_the_run_checks_its_cuda_device_before_any_work(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = load_cluster("dgx-h100:1")
    planned = _plan("tensorwise")
    plan = make_plan(
        planned.model,
        planned.training,
        cluster,
        "dgx-h100:1",
        LAYOUT,
        estimate(planned.model, planned.training, cluster, LAYOUT),
    )
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(InfeasibleConfigError, match=r"A100-SXM4-80GB has 8\.0"):
        check_world(plan, plan.cluster.world_size, cuda=True, device=torch.device("cuda", 0))
    check_world(plan, plan.cluster.world_size, cuda=True)  # no device given: nothing asked of it
