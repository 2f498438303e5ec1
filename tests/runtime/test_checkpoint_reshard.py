"""Re-planning's checkpoints (``runtime.checkpoint``): a run saved after step k under one layout
and resumed under another (data, tensor and pipeline degrees changed, the micro-batches
reshaped, the global batch kept) computes steps k+1.. as the uninterrupted run does, within
float tolerance (the layouts sum in other orders); a checkpoint of another model or global batch
size is refused."""

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import cpu_cluster
from harness import planner_main, run_ranks

from cost_models.estimate import estimate
from planner.files.models import load_model
from planner.files.plans import make_plan, save_plan
from planner.schemas import DType, Layout, ModelSpec, TrainingSpec, VocabularyLayout
from planner.schemas.errors import InfeasibleConfigError
from runtime import checkpoint, checkpoint_meta, optim
from runtime.data import synthetic_batch
from runtime.trainer import Trainer

BATCH, SEQ, STEPS, SAVED_AT, SEED, LR = 8, 32, 4, 2, 0, 1e-2
GPT, MOE = load_model("tiny-gpt"), load_model("tiny-moe")
DP2_PP2 = dict(data_parallel_degree=2, pipeline_parallel_degree=2, micro_batch_size=2)
# (saved under, resumed under, optimizer, precision, model)
CASES: list[tuple[dict[str, Any], dict[str, Any], str, DType, ModelSpec]] = [
    (DP2_PP2, dict(data_parallel_degree=4, micro_batch_size=1), "sgd", DType.FP32, GPT),
    (DP2_PP2, dict(data_parallel_degree=2, tensor_parallel_degree=2, micro_batch_size=4), "sgd", DType.FP32, GPT),
    # AdamW's moments move too: from ZeRO-1 whole-parameter owners to FSDP2's shards, and from
    # mixed precision's fp32 master slices to tensor-parallel masters
    (
        {**DP2_PP2, "zero_stage": 1},
        dict(data_parallel_degree=4, zero_stage=3, micro_batch_size=2),
        "adamw",
        DType.FP32,
        GPT,
    ),
    (
        dict(data_parallel_degree=4, zero_stage=1, micro_batch_size=2),
        dict(data_parallel_degree=2, tensor_parallel_degree=2, zero_stage=1, micro_batch_size=2),
        "adamw",
        DType.BF16,
        GPT,
    ),
    (  # FSDP2's fp32 shards of a bf16 run into ZeRO-1's fp32 master slices
        dict(data_parallel_degree=4, zero_stage=3, micro_batch_size=2),
        {**DP2_PP2, "zero_stage": 1},
        "adamw",
        DType.BF16,
        GPT,
    ),
    # experts keep their names whichever rank holds them: from two per rank to all on each, split
    # over the tensor-parallel pair
    (
        dict(data_parallel_degree=4, expert_parallel_degree=2, zero_stage=1, micro_batch_size=1),
        dict(data_parallel_degree=2, tensor_parallel_degree=2, micro_batch_size=2),
        "adamw",
        DType.FP32,
        MOE,
    ),
    (  # DTensors on one mesh (tensor-parallel) into DTensors on another (FSDP2's data-parallel)
        dict(data_parallel_degree=2, tensor_parallel_degree=2, sequence_parallel=True, micro_batch_size=2),
        dict(data_parallel_degree=4, zero_stage=3, micro_batch_size=1),
        "adamw",
        DType.FP32,
        GPT,
    ),
    # a vocabulary split over the pipeline (row blocks, tied) gathered, and split again (untied)
    (
        {**DP2_PP2, "vocabulary_layout": VocabularyLayout.VOCAB_2},
        dict(data_parallel_degree=4, micro_batch_size=1),
        "adamw",
        DType.FP32,
        GPT,
    ),
    (
        dict(data_parallel_degree=4, micro_batch_size=1),
        {**DP2_PP2, "vocabulary_layout": VocabularyLayout.VOCAB_1},
        "adamw",
        DType.FP32,
        MOE,
    ),
    (  # and back: each expert's tensor-parallel halves (plain tensors cut by hand) joined
        dict(data_parallel_degree=2, tensor_parallel_degree=2, micro_batch_size=2),
        dict(data_parallel_degree=4, expert_parallel_degree=4, micro_batch_size=1),
        "adamw",
        DType.FP32,
        MOE,
    ),
    (  # context parallelism: the d cp ranks hold the same weights, ZeRO-1's moments shared over them
        dict(data_parallel_degree=2, context_parallel_degree=2, zero_stage=1, micro_batch_size=2),
        dict(data_parallel_degree=1, context_parallel_degree=2, tensor_parallel_degree=2, micro_batch_size=2),
        "adamw",
        DType.FP32,
        GPT,
    ),
]


def _trainer(kw: dict[str, Any], optimizer: str, dtype: DType, model: ModelSpec) -> Trainer:
    layout = Layout(**{"tensor_parallel_degree": 1, "pipeline_parallel_degree": 1, **kw})
    return Trainer(
        model,
        layout,
        global_batch_size=BATCH,
        seed=SEED,
        optimizer=optimizer,
        lr=LR,
        device=torch.device("cpu"),
        dtype=dtype,
    )


def _steps(trainer: Trainer, first: int, last: int) -> list[float]:
    losses = []
    for step in range(first, last):
        inputs, targets = synthetic_batch(trainer.model.vocab_size, BATCH, SEQ, step=step, seed=SEED)
        losses.append(trainer.step(inputs, targets))
    return losses


def save_and_reshard(workdir: str) -> list[dict[str, Any]]:
    """For each case: the uninterrupted losses under the first layout, and those of the second
    layout resumed from the first's checkpoint after SAVED_AT."""
    results = []
    for i, (before, after, optimizer, dtype, model) in enumerate(CASES):
        directory = Path(workdir) / f"ckpt{i}"
        first = _trainer(before, optimizer, dtype, model)
        whole = _steps(first, 0, SAVED_AT)
        checkpoint.save(first, directory, SAVED_AT, plan_sha256="before")
        whole += _steps(first, SAVED_AT, STEPS)
        resumed = _trainer(after, optimizer, dtype, model)
        at = checkpoint.resume(resumed, directory, plan_sha256="after")
        results.append({"whole": whole, "at": at.step, "resharded": at.resharded, "after": _steps(resumed, 2, STEPS)})
    return results


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_checkpoint_resumes_under_another_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # bf16 masters in slices of 16 Ki elements: a parameter's slices on several ranks (forked ranks inherit it)
    monkeypatch.setattr(optim, "MASTER_SLICE_ELEMENTS", 1 << 14)
    results = run_ranks(4, save_and_reshard, str(tmp_path), workdir=tmp_path)
    for case, result in zip(CASES, results, strict=True):
        assert result["at"] == SAVED_AT and result["resharded"]
        # in bf16 the two layouts round their sums differently (1e-4 at a loss of 7): a weight
        # or moment lost moves the next loss by 1e-2
        tolerance = 1e-5 if case[3] is DType.FP32 else 3e-4
        assert result["after"] == pytest.approx(result["whole"][SAVED_AT:], abs=tolerance), case[:4]
        assert len(set(result["whole"])) == STEPS  # the steps do change the weights


def _meta(tmp_path: Path, **changes: Any) -> Path:
    folder = tmp_path / checkpoint.checkpoint_name(2)
    folder.mkdir(parents=True)
    meta = {
        "step": 2,
        "plan_sha256": "p",
        "model_name": GPT.name,
        "model_sha256": checkpoint_meta.model_sha256(GPT),
        "global_batch_size": BATCH,
    } | changes
    (folder / "meta.json").write_text(json.dumps(meta))
    (tmp_path / "latest").write_text(folder.name + "\n")
    return tmp_path


def test_a_checkpoint_of_the_same_model_and_batch_is_loadable(tmp_path: Path) -> None:
    assert checkpoint_meta.check_loadable(_meta(tmp_path), GPT, BATCH)["step"] == 2


def test_another_global_batch_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InfeasibleConfigError, match="global batch size 16, not this plan's 8"):
        checkpoint_meta.check_loadable(_meta(tmp_path, global_batch_size=16), GPT, BATCH)


def test_another_model_is_refused(tmp_path: Path) -> None:
    other = load_model("tiny-moe")
    with pytest.raises(InfeasibleConfigError, match="taken for model 'tiny-gpt', not this plan's 'tiny-moe'"):
        checkpoint_meta.check_loadable(_meta(tmp_path), other, BATCH)


def test_planner_run_refuses_such_a_checkpoint_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = cpu_cluster(4)
    layout = Layout(data_parallel_degree=4, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=2)
    training = TrainingSpec(global_batch_size=BATCH, seq_len=SEQ, dtype=DType.FP32)
    plan = make_plan(GPT, training, cluster, "cluster.json", layout, estimate(GPT, training, cluster, layout))
    save_plan(plan, tmp_path / "plan.json")
    folder = _meta(tmp_path / "ckpt", global_batch_size=16)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    args = ["run", str(tmp_path / "plan.json"), "--checkpoint-dir", str(folder), "--resume"]
    code, _, err = planner_main(args, monkeypatch)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "global batch size 16, not this plan's 8; re-plan with the same global batch size" in err


def test_a_checkpoint_of_the_older_per_rank_form_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / checkpoint.checkpoint_name(2)
    folder.mkdir()
    (folder / "meta.json").write_text('{"step": 2, "plan_sha256": "p"}')
    (tmp_path / "latest").write_text(folder.name + "\n")
    with pytest.raises(InfeasibleConfigError, match="older per-rank form"):
        checkpoint_meta.check_loadable(tmp_path, GPT, BATCH)
