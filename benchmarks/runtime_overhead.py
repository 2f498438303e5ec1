"""What `planner run` adds to a training step: each layout trained by `planner run` and by a
minimal hand-written torch loop of the same layout (the same model, global batch, micro-batches,
precision (fp32: a hand loop in bf16 would need master weights, no longer minimal), optimizer and
steps), on 4 gloo ranks under torchrun, the two alternated round by round so a slow
spell of the machine falls on both; per layout the median over rounds of the ratio of their
median step times (the first two steps left out of both: the warm-up, and the step whose memory `planner run` tracks).

Layouts: DDP (dp4), FSDP2 (dp4, ZeRO-3), a 2-stage 1F1B pipeline (pp2 x dp2, 4 micro-batches),
tp2 with sequence parallelism (tp2 x dp2). The hand loops use torch's own pieces as their
tutorials do: DistributedDataParallel, fully_shard per layer, PipelineStage + Schedule1F1B with
the gradients all-reduced over the data-parallel pair after the schedule, parallelize_module
with Colwise/Rowwise/SequenceParallel (torchtitan's plan for a Llama layer). Both build the
runtime's Decoder (runtime.model), so the modules are the same; a hand loop takes torch's
cross-entropy and AdamW with its defaults (weight decay 0), `planner run` its own (one fp32 copy of the logits,
AdamW fused where torch has the kernel, gradients reduced through DDP-sized buckets).

Target (the speed issue): `planner run` within 5% of the hand loop on every layout. Keep the
machine otherwise idle: the 4 ranks share its cores.

Run: .venv/bin/python benchmarks/runtime_overhead.py [--cluster out/cluster.json] [--rounds 3] [--steps 8]
(without --cluster it profiles the machine first, 4 ranks, quick). Writes out/runtime-overhead/.
"""

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RANKS = 4
GLOBAL_BATCH, SEQ_LEN, LR, SEED = 16, 256, 1e-3, 0
MEASURED_FROM = 2
"""The first step timed: `planner run` leaves out its warm-up step (0) and the step whose memory it
tracks (1), and the hand loop the same two."""
LOSS_TOLERANCE = 1e-4
"""The two ways' losses at every step (fp32, the same initial weights and batches) agree within
this, or the hand loop is not the same training and the benchmark stops (they agreed within 1e-6)."""
LAYOUTS: dict[str, dict[str, Any]] = {
    "ddp": dict(data_parallel_degree=4, micro_batch_size=4),
    "fsdp2": dict(data_parallel_degree=4, micro_batch_size=4, zero_stage=3),
    "pipeline-1f1b": dict(data_parallel_degree=2, pipeline_parallel_degree=2, micro_batch_size=2),
    "tp2-sp": dict(data_parallel_degree=2, tensor_parallel_degree=2, micro_batch_size=8, sequence_parallel=True),
}
"""Each layout's Layout keywords beyond the defaults (degree 1, ZeRO 0, no recompute)."""


def model_spec() -> Any:
    """A Llama-shaped model big enough that a step is compute, not Python (about 10 M parameters)."""
    from planner.schemas import ModelSpec

    return ModelSpec(
        name="bench-llama",
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=704,
        vocab_size=4096,
        hidden_act="silu",
        tie_word_embeddings=False,
        max_position_embeddings=SEQ_LEN,
        position_embedding_type="rope",
        norm_type="rmsnorm",
    )


def layout_of(name: str) -> Any:
    from planner.schemas import Layout

    kw = {"tensor_parallel_degree": 1, "pipeline_parallel_degree": 1, **LAYOUTS[name]}
    return Layout(**kw)


# --- the hand-written loops (run on every rank under torchrun) -------------------------------


def hand(name: str, steps: int, out: Path) -> None:
    """Train ``name``'s layout with torch's own pieces; rank 0 writes the step times."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    from runtime.data import synthetic_batch
    from runtime.model import Decoder

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, model = dist.get_rank(), model_spec()
    kw = LAYOUTS[name]
    dp = kw["data_parallel_degree"]
    micro, per_rank = kw["micro_batch_size"], GLOBAL_BATCH // dp

    def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def batch(step: int, replica: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = synthetic_batch(model.vocab_size, GLOBAL_BATCH, SEQ_LEN, step=step, seed=SEED)
        rows = slice(replica * per_rank, (replica + 1) * per_rank)
        return inputs[rows], targets[rows]

    def all_reduce_grads(params: list[torch.nn.Parameter], group: dist.ProcessGroup) -> None:
        from torch.distributed.tensor import DTensor

        for p in params:
            if p.grad is not None:
                g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                dist.all_reduce(g, group=group)
                g.div_(dist.get_world_size(group))

    if name in ("ddp", "fsdp2"):
        net: torch.nn.Module = Decoder(model, seed=SEED)
        if name == "ddp":
            net = torch.nn.parallel.DistributedDataParallel(net)
        else:
            from torch.distributed.fsdp import fully_shard

            for block in net.layers.values():
                fully_shard(block)
            fully_shard(net)
        opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=0.0)

        def step(s: int) -> float:
            inputs, targets = batch(s, rank)
            opt.zero_grad()
            total = 0.0
            for i in range(0, per_rank, micro):
                last = i + micro >= per_rank
                with net.no_sync() if name == "ddp" and not last else contextlib.nullcontext():
                    loss = loss_of(net(inputs[i : i + micro]), targets[i : i + micro]) * micro / per_rank
                    loss.backward()
                total += loss.item()
            opt.step()
            return total / dp  # every rank holds its replica's loss

    elif name == "pipeline-1f1b":
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        mesh = init_device_mesh("cpu", (2, dp), mesh_dim_names=("pp", "dp"))
        stage_index, half = mesh["pp"].get_local_rank(), model.num_hidden_layers // 2
        layers = range(0, half) if stage_index == 0 else range(half, model.num_hidden_layers)
        chunk = Decoder(model, seed=SEED, layers=layers, embedding=stage_index == 0, output=stage_index == 1)
        stage = PipelineStage(chunk, stage_index, 2, torch.device("cpu"), group=mesh["pp"].get_group())
        schedule = Schedule1F1B(stage, n_microbatches=per_rank // micro, loss_fn=loss_of)
        opt = torch.optim.AdamW(chunk.parameters(), lr=LR, weight_decay=0.0)
        params = list(chunk.parameters())

        def step(s: int) -> float:
            inputs, targets = batch(s, mesh["dp"].get_local_rank())
            opt.zero_grad()
            losses: list[torch.Tensor] = []
            if stage_index == 0:
                schedule.step(inputs)
            else:
                schedule.step(target=targets, losses=losses)
            all_reduce_grads(params, mesh["dp"].get_group())
            opt.step()
            return sum(loss.item() for loss in losses) / len(losses) / dp if losses else 0.0  # the last stage's

    else:  # tp2-sp
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            PrepareModuleInput,
            RowwiseParallel,
            SequenceParallel,
            parallelize_module,
        )

        mesh = init_device_mesh("cpu", (dp, 2), mesh_dim_names=("dp", "tp"))
        net = Decoder(model, seed=SEED)
        parallelize_module(
            net,
            mesh["tp"],
            {
                "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
                "norm": SequenceParallel(),
                "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
            },
        )
        gathered = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        for block in net.layers.values():
            parallelize_module(
                block,
                mesh["tp"],
                {
                    "norm1": SequenceParallel(),
                    "attn": gathered,
                    "attn.q": ColwiseParallel(),
                    "attn.k": ColwiseParallel(),
                    "attn.v": ColwiseParallel(),
                    "attn.o": RowwiseParallel(output_layouts=Shard(1)),
                    "norm2": SequenceParallel(),
                    "mlp": gathered,
                    "mlp.gate": ColwiseParallel(),
                    "mlp.up": ColwiseParallel(),
                    "mlp.down": RowwiseParallel(output_layouts=Shard(1)),
                },
            )
        opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=0.0)
        params = list(net.parameters())

        def step(s: int) -> float:
            inputs, targets = batch(s, mesh["dp"].get_local_rank())
            opt.zero_grad()
            total = 0.0
            for i in range(0, per_rank, micro):
                loss = loss_of(net(inputs[i : i + micro]), targets[i : i + micro]) * micro / per_rank
                loss.backward()
                total += loss.item()
            all_reduce_grads(params, mesh["dp"].get_group())
            opt.step()
            return total / dp / 2  # both tensor-parallel ranks hold their replica's loss

    times: list[float] = []
    losses: list[float] = []
    for s in range(steps):
        dist.barrier()
        start = time.perf_counter()
        share = torch.tensor(step(s), dtype=torch.float64)
        dist.barrier()
        times.append(time.perf_counter() - start)
        dist.all_reduce(share)  # the shares sum to the mean loss over the global batch
        losses.append(float(share))
    if rank == 0:
        median_s = statistics.median(times[MEASURED_FROM:])
        out.write_text(json.dumps({"step_times_s": times, "losses": losses, "measured_step_time_s": median_s}))
    dist.barrier()  # rank 0's teardown hung, now and then, where the others had torn theirs down while it wrote
    dist.destroy_process_group()


# --- the driver ------------------------------------------------------------------------------


def _torchrun(args: list[str], log: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}", *args]
    with log.open("w") as f:
        try:
            done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, check=False, timeout=600)
        except subprocess.TimeoutExpired:
            sys.exit(f"no end after 600 s: {' '.join(args)}; its output: {log}")
    if done.returncode:
        sys.exit(f"failed ({done.returncode}): {' '.join(args)}; its output: {log}")


def _plans(cluster_path: Path, workdir: Path) -> dict[str, Path]:
    from cost_models.estimate import estimate
    from planner.files.clusters import load_cluster
    from planner.files.plans import make_plan, save_plan
    from planner.schemas import TrainingSpec

    cluster, model = load_cluster(str(cluster_path)), model_spec()
    training = TrainingSpec(global_batch_size=GLOBAL_BATCH, seq_len=SEQ_LEN, dtype="fp32")
    plans = {}
    for name in LAYOUTS:
        layout = layout_of(name)
        plans[name] = workdir / f"{name}.plan.json"
        estimated = estimate(model, training, cluster, layout)
        save_plan(make_plan(model, training, cluster, str(cluster_path), layout, estimated), plans[name])
    return plans


def main() -> None:
    """Profile (unless given a profile), run every layout both ways, round by round; print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", type=Path, help="a profile of this machine as 4 ranks (default: measure one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--hand", choices=list(LAYOUTS), help=argparse.SUPPRESS)  # a hand loop's rank (torchrun)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps <= MEASURED_FROM:
        parser.error(f"--steps {args.steps}: the first {MEASURED_FROM} are not timed; give {MEASURED_FROM + 1} or more")
    if args.hand:
        hand(args.hand, args.steps, args.out)
        return
    workdir = ROOT / "out" / "runtime-overhead"
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = args.cluster or workdir / "cluster.json"
    if args.cluster is None:
        print("profiling this machine as 4 ranks (quick) ...", flush=True)
        _torchrun(["-m", "planner", "profile", "--quick", "--output", str(cluster)], workdir / "profile.log")
    plans = _plans(cluster, workdir)
    results: dict[str, dict[str, list[float]]] = {n: {"planner": [], "hand": [], "ratio": []} for n in LAYOUTS}
    for r in range(args.rounds):
        for name, plan in plans.items():
            measured: dict[str, float] = {}
            losses: dict[str, list[float]] = {}
            for way in ("planner", "hand") if r % 2 == 0 else ("hand", "planner"):
                out = workdir / f"{name}.{way}.{r}.json"
                if way == "planner":
                    run = ["-m", "planner", "run", str(plan), "--steps", str(args.steps), "--report", str(out)]
                    _torchrun([*run, "--log-every", "0"], workdir / f"{name}.{way}.{r}.log")
                else:
                    hand_args = ["--hand", name, "--steps", str(args.steps), "--out", str(out)]
                    _torchrun([__file__, *hand_args], workdir / f"{name}.{way}.{r}.log")
                got = json.loads(out.read_text())
                measured[way], losses[way] = got["measured_step_time_s"], got["losses"]
                results[name][way].append(measured[way])
            apart = max(abs(a - b) for a, b in zip(losses["planner"], losses["hand"], strict=True))
            if apart > LOSS_TOLERANCE:  # not the same training
                sys.exit(f"{name}: losses {losses['planner']} under planner run, {losses['hand']} by hand")
            results[name]["ratio"].append(measured["planner"] / measured["hand"])
            print(
                f"round {r + 1}/{args.rounds} {name}: planner run {measured['planner'] * 1e3:.1f} ms, "
                f"hand loop {measured['hand'] * 1e3:.1f} ms",
                flush=True,
            )
    print(f"\n{'layout':<15} {'planner run ms':>15} {'hand loop ms':>13} {'ratio (median)':>15}  target <= 1.05")
    for name, got in results.items():
        ratio = statistics.median(got["ratio"])
        print(
            f"{name:<15} {statistics.median(got['planner']) * 1e3:>15.1f} "
            f"{statistics.median(got['hand']) * 1e3:>13.1f} {ratio:>15.3f}  {'ok' if ratio <= 1.05 else 'MISSED'}"
        )
    (workdir / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
