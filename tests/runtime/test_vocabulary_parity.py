"""Vocabulary layouts split over the pipeline (vocab-1, vocab-2) train like the single-process
reference: the losses of the first steps match within the pipeline parity tests' 1e-5 (SGD,
float32 on CPU), and the embedding and output-layer rows every pipeline rank holds equal the
reference's trained matrices (the losses alone barely see the embedding's gradient: dropping it
moves them by 1.3e-5 at this learning rate). tiny-gpt with a 32k vocabulary (tied), and an
untied copy; the pinned layouts at the same vocabulary too."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from harness import run_ranks

from cost_models.estimate import estimate
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.plans import make_plan, save_plan
from planner.schemas import DType, Layout, ModelSpec, TrainingSpec
from planner.schemas.geometry import MeshAxis, accounted_split, vocabulary_rows
from runtime.data import synthetic_batch
from runtime.reference import reference_training
from runtime.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_run_cli import _dry, _local_plan

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(300)]

TOLERANCE = 1e-5
WEIGHT_TOLERANCE = 1e-6
BATCH, SEQ, STEPS, SEED, LR = 8, 32, 3, 0, 0.1
GPT_32K = load_model("tiny-gpt").model_copy(update={"vocab_size": 32000})
UNTIED_32K = GPT_32K.model_copy(update={"tie_word_embeddings": False})


def L(d: int, p: int, b: int, vocabulary: str, t: int = 1, **kw: Any) -> dict[str, Any]:
    return dict(
        data_parallel_degree=d,
        tensor_parallel_degree=t,
        pipeline_parallel_degree=p,
        micro_batch_size=b,
        vocabulary_layout=vocabulary,
        **kw,
    )


def train(model: ModelSpec, layouts: list[dict[str, Any]], out: str, dtype: DType) -> list[list[float]]:
    """Each layout's losses for STEPS steps (runs on every rank); rank 0 saves each layout's
    embedding and output layer, gathered from the pipeline ranks of the first (dp, tp) coordinate."""
    results = []
    for i, kw in enumerate(layouts):
        layout = Layout(**kw)
        trainer = Trainer(
            model,
            layout,
            global_batch_size=BATCH,
            seed=SEED,
            optimizer="sgd",
            lr=LR,
            device=torch.device("cpu"),
            dtype=dtype,
        )
        losses = []
        for step in range(STEPS):
            inputs, targets = synthetic_batch(model.vocab_size, BATCH, SEQ, step=step, seed=SEED)
            losses.append(trainer.step(inputs, targets))
        results.append(losses)
        if trainer.vocabulary is None:  # pinned: the dense parity tests check its weights
            continue
        shards = trainer.vocabulary.shards
        first_line = trainer.dp_rank == 0 and trainer.mesh[MeshAxis.TP].get_local_rank() == 0
        mine = (trainer.pp_rank, first_line, shards.embedding.detach(), shards.output.detach())
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        if dist.get_rank() == 0:
            held = sorted(((s, e, o) for s, first, e, o in everyone if first), key=lambda t: t[0])
            rows = [len(vocabulary_rows(model.vocab_size, layout, s)) for s, _, _ in held]
            assert [len(e) for _, e, _ in held] == rows
            embedding = torch.cat([e for _, e, _ in held])
            output = torch.cat([o for _, _, o in held])
            torch.save((embedding, output), Path(out) / f"vocabulary{i}.pt")
    return results


def check(
    model: ModelSpec, world: int, layouts: list[dict[str, Any]], tmp_path: Path, dtype: DType = DType.FP32
) -> None:
    """fp32: losses within TOLERANCE, weights within WEIGHT_TOLERANCE; bf16 (bf16 weights and
    activations, fp32 masters): losses within bf16's rounding, 1e-3, as the pinned layouts'."""
    reference, net = reference_training(
        model, global_batch_size=BATCH, seq_len=SEQ, steps=STEPS, seed=SEED, optimizer="sgd", lr=LR
    )
    assert net.tok_emb is not None and net.head is not None
    results = run_ranks(world, train, model, layouts, str(tmp_path), dtype, workdir=tmp_path)
    for i, (kw, losses) in enumerate(zip(layouts, results, strict=True)):
        assert losses == pytest.approx(reference, abs=TOLERANCE if dtype is DType.FP32 else 1e-3), kw
        if dtype is not DType.FP32 or kw["vocabulary_layout"] == "pinned":
            continue
        embedding, output = torch.load(tmp_path / f"vocabulary{i}.pt")
        torch.testing.assert_close(embedding, net.tok_emb.weight.detach(), atol=WEIGHT_TOLERANCE, rtol=0)
        torch.testing.assert_close(output, net.head.weight.detach(), atol=WEIGHT_TOLERANCE, rtol=0)
    assert len(set(reference)) == STEPS  # the steps do update the parameters


def test_two_ranks_tied_untied_and_mixed_precision(tmp_path: Path) -> None:
    check(GPT_32K, 2, [L(1, 2, 2, "vocab-2")], tmp_path / "tied")
    check(UNTIED_32K, 2, [L(1, 2, 1, "vocab-1")], tmp_path / "untied")
    check(GPT_32K, 2, [L(1, 2, 2, "vocab-1"), L(1, 2, 2, "vocab-2")], tmp_path / "bf16", DType.BF16)


def test_four_ranks_pipeline_data_parallel_and_zero(tmp_path: Path) -> None:
    layouts = [
        L(1, 4, 1, "vocab-2"),
        L(2, 2, 1, "vocab-1"),
        L(2, 2, 1, "vocab-2", zero_stage=1),
        L(2, 2, 1, "vocab-1", zero_stage=2),
        L(2, 2, 1, "vocab-2", zero_stage=3),
        L(1, 2, 1, "vocab-2", t=2),  # each tensor-parallel rank of a stage holds its stage's rows
        L(1, 2, 1, "vocab-1", t=2, sequence_parallel=True),
        # the pinned layouts at this vocabulary: even, with Megatron-LM's split counting the
        # embedding and the loss as layers (geometry.accounted_split), and split over tp
        L(1, 4, 1, "pinned"),
        L(1, 4, 1, "pinned", layer_split=accounted_split(GPT_32K.num_hidden_layers, 4)),
        L(2, 1, 1, "pinned", t=2),
    ]
    check(GPT_32K, 4, layouts, tmp_path)


def test_four_ranks_zero_3_and_sequence_parallel_mixed_precision(tmp_path: Path) -> None:
    """FSDP's fp32 shards computing in bf16 (the vocabulary shards fp32 too, computing in bf16),
    and bf16 under tensor and sequence parallelism."""
    layouts = [L(2, 2, 1, "vocab-2", zero_stage=3), L(1, 2, 1, "vocab-2", t=2, sequence_parallel=True)]
    check(GPT_32K, 4, layouts, tmp_path, DType.BF16)


def test_the_dry_run_holds_what_the_real_run_tracks(tmp_path: Path) -> None:
    """The dry run of a vocabulary split (fake process group: the rank runs the passes it joins as
    a peer in its own thread, at its peak) traces the first and the last stage's peaks as a real
    run's tracker does, to 5% (measured: within 1% on every rank; before the shards' gradients
    were set after zero_grad, their optimizer states went missing, 5-10% under)."""
    cluster_path = _local_plan(tmp_path, ranks=4).parent / "cluster.json"
    cluster, model = load_cluster(str(cluster_path)), load_model("tiny-gpt")
    training = TrainingSpec(global_batch_size=8, seq_len=32)
    layout = Layout(**L(1, 4, 2, "vocab-2"))
    plan_path = tmp_path / "vocab.json"
    estimated = estimate(model, training, cluster, layout)
    save_plan(make_plan(model, training, cluster, str(cluster_path), layout, estimated), plan_path)
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    command += ["-m", "planner", "run", str(plan_path), "--steps", "2", "--report", str(report)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    measured = {m["rank"]: m["peak_bytes"] / 2**20 for m in json.loads(report.read_text())["memory"]}
    traced = {rank: _dry(plan_path, rank) for rank in (0, 3)}
    for rank in traced:
        assert traced[rank] == pytest.approx(measured[rank], rel=0.05), (traced, measured)
