"""The dry run traces the real runtime under fake tensors: it checks plans far larger than this
machine without allocating them. (That it agrees with a real run's tracked peak, same method, is
tests/runtime/test_run_cli.py's, on the run that test launches.)"""

import resource
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_run_cli import _dry

from cost_models.estimate import estimate
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.plans import make_plan, save_plan
from planner.schemas import Layout, TrainingSpec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_dry_run_of_a_large_plan_allocates_nothing(tmp_path: Path) -> None:
    # Llama 3 8B on 64 H100s: several GiB per rank, traced on this machine without allocating them
    # (one micro-batch per replica: a step's weights, gradients and optimizer states are all there).
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100:8")
    training = TrainingSpec(global_batch_size=16, seq_len=4096)
    layout = Layout(
        data_parallel_degree=16,
        tensor_parallel_degree=2,
        pipeline_parallel_degree=2,
        micro_batch_size=1,
        zero_stage=1,
        sequence_parallel=True,
    )
    plan_path = tmp_path / "plan.json"
    save_plan(
        make_plan(model, training, cluster, "dgx-h100:8", layout, estimate(model, training, cluster, layout)), plan_path
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    traced_mib = _dry(plan_path, 63)
    child_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    assert traced_mib * 2**20 > 4 * 2**30
    assert max(before, child_peak) < 2 * 2**30  # the process never held what it traced


def test_dry_run_of_a_pipeline_with_tied_embeddings(tmp_path: Path) -> None:
    # tiny-gpt ties its embeddings: with a pipeline the first and last stage pair up to sum the
    # copies' gradients, a group built from the rank order (once read from the fake mesh tensor,
    # which has no values under the dry run: it failed with a traceback).
    model, cluster = load_model("tiny-gpt"), load_cluster("dgx-h100:1")
    training = TrainingSpec(global_batch_size=8, seq_len=64)
    layout = Layout(data_parallel_degree=4, tensor_parallel_degree=1, pipeline_parallel_degree=2, micro_batch_size=1)
    plan_path = tmp_path / "plan.json"
    estimated = estimate(model, training, cluster, layout)
    save_plan(make_plan(model, training, cluster, "dgx-h100:1", layout, estimated), plan_path)
    for rank in (0, 7):
        assert _dry(plan_path, rank) > 0


def test_dry_run_of_sharding_groups_and_a_secondary_partition(tmp_path: Path) -> None:
    # HSDP builds a (replicate, shard) mesh and hpZ a secondary one outside the fake tensors, as
    # the layout's mesh is built; sharded over 4 ranks rather than 8, the states take more room.
    model, cluster = load_model("tiny-gpt"), load_cluster("dgx-h100:1")
    training = TrainingSpec(global_batch_size=16, seq_len=64)
    peaks = []
    for groups in ({}, {"sharding_group_size": 4, "secondary_partition_size": 2}):
        layout = Layout(
            data_parallel_degree=8,
            tensor_parallel_degree=1,
            pipeline_parallel_degree=1,
            micro_batch_size=1,
            zero_stage=3,
            **groups,  # type: ignore[arg-type]
        )
        plan_path = tmp_path / f"{layout.describe()}.json"
        estimated = estimate(model, training, cluster, layout)
        save_plan(make_plan(model, training, cluster, "dgx-h100:1", layout, estimated), plan_path)
        peaks.append(_dry(plan_path, 7))
    assert 0 < peaks[0] < peaks[1]
