"""`planner run`: execute a plan for a few steps under torchrun and report what it measured.

Every rank checks the plan against the job before any work (world size, devices), trains with
runtime.Trainer, times each step between barriers (on CUDA, each clock read after a device
synchronize), and measures one step's peak memory (``runtime.peak_memory``: on CUDA the tensors',
the allocator's and the driver's, on CPU torch's MemTracker); the report names the method. The
straggler watch times every step's collectives (by CUDA events on a GPU). Rank 0 writes the
RunReport and returns it (the CLI prints measured beside predicted).
"""

import contextlib
import logging
import os
import signal
import socket
import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.attention import sdpa_kernel

from planner.schemas import DeviceKind, Plan, RankMemory, RunReport
from planner.schemas.errors import InfeasibleConfigError, JobFailed, StragglerFound
from planner.schemas.runtime_support import check_buildable, check_fp8_device, check_runnable
from planner.schemas.settings import RunSettings
from runtime import checkpoint
from runtime.checkpoint_meta import check_loadable, check_steps_left, latest
from runtime.data import TokenFile, synthetic_batch
from runtime.elastic import Replan, agreed_plan
from runtime.expert_parallel import expert_sent_bytes
from runtime.heartbeat import SLOW_FAULT_S, Heartbeat, Stopped, act_out_fault, stop_on_sigterm
from runtime.model import attention_priority
from runtime.peak_memory import MeasuredPeak, measured_step
from runtime.progress import log_step, progress_every
from runtime.routing_trace import gather_routing, record_routing, save_routing_trace
from runtime.straggler_watch import StragglerWatch, axis_groups
from runtime.threads import cpu_threads_per_rank
from runtime.torch_compat import require_supported_torch
from runtime.trainer import Trainer

logger = logging.getLogger(__name__)


def check_world(plan: Plan, world_size: int, cuda: bool, device: torch.device | None = None) -> None:
    """Refuse a plan the job cannot run, before any work (every rank reaches the same verdict;
    ``device``, this rank's, is checked for an FP8 plan's tensor cores)."""
    if world_size != plan.cluster.world_size:
        raise InfeasibleConfigError(
            f"the plan is for {plan.cluster.world_size} ranks ({plan.cluster.num_nodes} nodes x "
            f"{plan.cluster.devices_per_node}), but this job has {world_size}; launch it with the command "
            "`planner launch` prints"
        )
    check_buildable(plan.model)  # the model the plan was priced for, not another one
    check_runnable(plan, cuda=cuda)  # what the plan asks of any job (planner launch checks it too)
    if not cuda and plan.cluster.device_kind is not DeviceKind.CPU:
        raise InfeasibleConfigError(
            f"the plan is for {plan.cluster.device_name!r} devices, but this job has no CUDA device; "
            "run it where those devices are, or plan for this machine (planner profile, then planner search)"
        )
    if device is not None and device.type == "cuda":
        check_fp8_device(plan, torch.cuda.get_device_capability(device), torch.cuda.get_device_name(device))


def run(settings: RunSettings, *, replan: Replan | None = None) -> RunReport | None:
    """Run ``settings.plan`` on this rank; on rank 0 the RunReport it wrote, None on the other ranks.

    ``replan`` (elastic runs, ``runtime.elastic``): on a world size other than the plan's, rank 0
    gets the plan for the job's ranks from it and every rank runs that plan; the run continues
    from the newest complete checkpoint in ``settings.checkpoint_dir`` whenever there is one.
    """
    require_supported_torch()
    rank, world, cuda, device = _set_up_device()
    plan, plan_sha256, resume = _agree_on_plan(settings, replan, rank, world, device)
    if not dist.is_initialized():
        _init(settings, cuda)
    trainer = _build_trainer(settings, plan, device)
    first = _resume(settings, trainer, plan_sha256, rank) if resume else 0
    tokens = TokenFile(settings.data, vocab_size=plan.model.vocab_size) if settings.data else None
    hosts, watch = _place_ranks(settings, trainer, rank, world, first)
    times, losses, sent, memory = _train_or_diagnose(
        settings, plan, trainer, tokens, device, first, plan_sha256, watch, rank, world
    )
    if settings.trace_routing is not None:
        _save_routing(settings, settings.trace_routing, plan, trainer)
    everyone, sent_by_rank = _gather_measurements(plan, trainer, rank, world, memory, sent)
    report = None
    if rank == 0:
        assert everyone is not None and sent_by_rank is not None
        report = _report(
            settings, plan, plan_sha256, times, losses, everyone, hosts, device, world, sent_by_rank, first
        )
        report = _with_faults(report, watch)
        settings.report_path.write_text(report.model_dump_json(indent=2) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    if watch.stopped:  # every rank: the launcher sees the job end with this code
        raise StragglerFound(f"stopped after step {first + len(times) - 1}: " + "; ".join(watch.messages))
    return report


def _set_up_device() -> tuple[int, int, bool, torch.device]:
    """This rank's (rank, world size, whether on CUDA, device), read from torchrun's environment;
    the device is made current (CUDA), and the rank given the threads the profile measured with:
    the node's cores split over its ranks, for its CPU work (all of it on a CPU cluster; an
    offloaded optimizer's step on CUDA, which torchrun's default of one thread a rank would run
    slower than the profile, or a preset, prices it)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(cpu_threads_per_rank(int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    return rank, world, cuda, device


def _agree_on_plan(
    settings: RunSettings, replan: Replan | None, rank: int, world: int, device: torch.device
) -> tuple[Plan, str, bool]:
    """The plan every rank runs, its SHA-256, and whether the run resumes from a checkpoint.

    An elastic (re)start on other ranks than the plan's starts the process group here to agree on
    rank 0's new plan; the plan is then checked against the job, and a checkpoint to resume from
    against the plan, before any work.
    """
    plan = settings.plan
    plan_sha256 = settings.plan_sha256
    cuda = device.type == "cuda"
    if replan is not None and world != plan.cluster.world_size:  # an elastic (re)start on other ranks
        _init(settings, cuda)
        plan, _, plan_sha256 = agreed_plan(replan, rank, world)
    check_world(plan, world, cuda, device)
    if settings.trace_routing is not None and not plan.model.is_moe:
        raise InfeasibleConfigError(
            f"--trace-routing records which experts tokens go to, but {plan.model.name!r} has no experts; "
            "drop the option"
        )
    resume = settings.resume or (
        replan is not None and settings.checkpoint_dir is not None and latest(settings.checkpoint_dir) is not None
    )
    if resume:  # before any work: a checkpoint of another model or global batch is refused
        assert settings.checkpoint_dir is not None
        check_loadable(settings.checkpoint_dir, plan.model, plan.training.global_batch_size)
    return plan, plan_sha256, resume


def _build_trainer(settings: RunSettings, plan: Plan, device: torch.device) -> Trainer:
    """The plan's Trainer on ``device``, recording its routing when the run traces it."""
    training = plan.training
    trainer = Trainer(
        plan.model,
        plan.layout,
        global_batch_size=training.global_batch_size,
        seed=settings.seed,
        optimizer=str(settings.optimizer),
        lr=settings.lr,
        device=device,
        dtype=training.dtype,
        reduce_dtype=training.reduce_dtype,
        pipeline_flushes=training.pipeline_flushes,
        fp8=training.precision.fp8,
        fp8_param_gather=training.fp8_param_gather,
        fp8_bf16_layers=training.fp8_bf16_layers,
        plan_checked=True,  # check_world ran check_runnable
    )
    if settings.trace_routing is not None:
        record_routing(trainer)
    return trainer


def _resume(settings: RunSettings, trainer: Trainer, plan_sha256: str, rank: int) -> int:
    """Load the newest checkpoint into ``trainer`` (resharded if taken under another layout) and
    return the steps it had done; refuse a run that asks for no more steps than that."""
    assert settings.checkpoint_dir is not None
    resumed = checkpoint.resume(trainer, settings.checkpoint_dir, plan_sha256)
    first = resumed.step
    if resumed.resharded and rank == 0:
        logger.info("resumed %s, taken under another layout, resharded into this plan's", resumed.path)
    check_steps_left(first, settings.steps)
    return first


def _place_ranks(
    settings: RunSettings, trainer: Trainer, rank: int, world: int, first: int
) -> tuple[list[str], StragglerWatch]:
    """Every rank's host (one collective: each rank's host and pipeline stage), and the straggler
    watch that knows them (on CUDA its clock times collectives by events: runtime.collective_clock)."""
    placed: list[tuple[str, int]] = [("", 0)] * world
    dist.all_gather_object(placed, (socket.gethostname(), trainer.pp_rank))
    hosts = [host for host, _ in placed]
    watch = StragglerWatch(
        rank=rank,
        hosts=hosts,
        stages=[stage for _, stage in placed],
        first_step=tracked_step(settings, first) + 1,
        on_fault=settings.on_fault,
        axes=axis_groups(trainer.mesh),
        device=trainer.device,
    )
    return hosts, watch


def _train_or_diagnose(
    settings: RunSettings,
    plan: Plan,
    trainer: Trainer,
    tokens: TokenFile | None,
    device: torch.device,
    first: int,
    plan_sha256: str,
    watch: StragglerWatch,
    rank: int,
    world: int,
) -> tuple[list[float], list[float], list[tuple[float, float]], MeasuredPeak]:
    """``_train`` under the plan's attention kernel, with a heartbeat; a peer's death or hang, or
    the launcher stopping us, becomes JobFailed with the heartbeat's diagnosis (a bug keeps its
    traceback)."""
    heartbeat = Heartbeat(rank, world, dist.distributed_c10d._get_default_store(), HEARTBEAT_KEY)
    stop_on_sigterm()
    backends = attention_priority(plan.training.attention_kernel, device)  # the kernel the plan was priced for first
    try:
        with sdpa_kernel(backends, set_priority=True) if backends is not None else contextlib.nullcontext():
            return _train(settings, plan, trainer, tokens, device, first, plan_sha256, heartbeat, watch)
    except (Stopped, RuntimeError) as e:  # a peer died, hung past the timeout, or the launcher stopped us
        if not (isinstance(e, Stopped) or communication_failed(e)):
            raise  # a bug: it keeps its traceback
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the launcher stopping us now must not cut the diagnosis
        failure = heartbeat.diagnose(e, "training")
        raise JobFailed(failure) from None


def _save_routing(settings: RunSettings, path: Path, plan: Plan, trainer: Trainer) -> None:
    """Gather the experts every token went to on rank 0, which writes them to ``path``."""
    training = plan.training
    rows = training.global_batch_size // plan.layout.data_parallel_degree
    expert_ids = gather_routing(trainer, settings.steps * rows * training.seq_len)
    if expert_ids is not None:  # rank 0
        save_routing_trace(path, expert_ids, plan.model)


def _gather_measurements(
    plan: Plan,
    trainer: Trainer,
    rank: int,
    world: int,
    memory: MeasuredPeak,
    sent: list[tuple[float, float]],
) -> tuple[list[RankMemory] | None, list[tuple[float, float]] | None]:
    """Every rank's memory and steady bytes sent per step, gathered on rank 0 (None elsewhere)."""
    stage = trainer.pp_rank
    predicted = plan.estimate.stages[stage].memory
    rank_memory = RankMemory(
        rank=rank,
        stage=stage,
        peak_bytes=memory.peak_bytes,
        predicted_bytes=predicted.total_bytes,
        method=memory.method,
        breakdown_bytes=memory.breakdown_bytes,
        predicted_workspace_bytes=max(predicted.workspace_bytes, 0.0),
        reserved_bytes=memory.reserved_bytes,
        driver_used_bytes=memory.driver_used_bytes,
    )
    everyone: list[RankMemory] | None = [rank_memory] * world if rank == 0 else None
    dist.gather_object(rank_memory, everyone, dst=0)
    # A pipeline stage's first step also forwards placeholders (shape inference): leave it out.
    steady = sent[1:] or sent
    steady_sent = (statistics.mean(e for e, _ in steady), statistics.mean(c for _, c in steady))
    sent_by_rank: list[tuple[float, float]] | None = [(0.0, 0.0)] * world if rank == 0 else None
    dist.gather_object(steady_sent, sent_by_rank, dst=0)
    return everyone, sent_by_rank


def _with_faults(report: RunReport, watch: StragglerWatch) -> RunReport:
    """``report`` with what the straggler watch found and checked."""
    return report.model_copy(
        update={
            "stragglers": tuple(watch.found),
            "timing_windows": tuple(watch.windows),
            "straggler_checks": watch.checks,
            "slow_links": tuple(watch.links),
            "link_checks": watch.link_state.checks,
            "stopped_by_fault": watch.stopped,
        }
    )


def _init(settings: RunSettings, cuda: bool) -> None:
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=settings.timeout_s))


HEARTBEAT_KEY = "planner/run/at/{rank}"
COMMUNICATION_MARKERS = ("gloo", "nccl", "Connection closed", "Connection reset", "timed out", "Timed out")
"""Text of the errors a collective raises when a peer dies or hangs: gloo and NCCL raise a plain
RuntimeError naming themselves or the broken connection (torch 2.13)."""


def communication_failed(error: BaseException) -> bool:
    """Whether ``error`` is a collective's failure (a peer died or hung), not a bug."""
    text = str(error)
    return isinstance(error, dist.DistError) or any(marker.lower() in text.lower() for marker in COMMUNICATION_MARKERS)


def _sent_bytes(trainer: Trainer) -> tuple[float, float]:
    """Bytes this rank has sent so far: (its MoE all-to-alls', its ring attention's)."""
    context = trainer.context.sent if trainer.context is not None and trainer.context.sent is not None else None
    return float(expert_sent_bytes(trainer.chunks)), float(context.total_bytes if context else 0)


def _train(
    settings: RunSettings,
    plan: Plan,
    trainer: Trainer,
    tokens: TokenFile | None,
    device: torch.device,
    first: int,
    plan_sha256: str,
    heartbeat: Heartbeat,
    watch: StragglerWatch,
) -> tuple[list[float], list[float], list[tuple[float, float]], MeasuredPeak]:
    """Steps ``first`` .. ``settings.steps - 1``: their times, losses and bytes sent (``_sent_bytes``), and
    the tracked step's memory; each step recorded in ``heartbeat`` before it starts, and timed
    for ``watch``, which may stop the run early (a checkpoint is then taken, if they are)."""
    training = plan.training
    times: list[float] = []
    losses: list[float] = []
    sent: list[tuple[float, float]] = []
    memory: MeasuredPeak | None = None
    lag_s = 0.0
    every, tokens_per_step = progress_every(settings.steps, settings.log_every), training.tokens_per_step
    resumed_from = (
        settings.checkpoint_dir / checkpoint.checkpoint_name(first) if settings.checkpoint_dir and first else None
    )
    with watch.clock.running():
        for step in range(first, settings.steps):
            began = time.perf_counter()
            inside_before = watch.clock.inside_s
            watch.step_begins()
            heartbeat.at("step", str(step))
            lag_s = max(lag_s, _inject_fault(settings, heartbeat.rank, step, watch, times))
            time.sleep(lag_s)
            inputs, targets = (
                tokens.batch(training.global_batch_size, training.seq_len, step=step)
                if tokens
                else synthetic_batch(
                    plan.model.vocab_size, training.global_batch_size, training.seq_len, step=step, seed=settings.seed
                )
            )
            track = step == tracked_step(settings, first)
            dist.barrier()
            synchronize(device)
            sent_before = _sent_bytes(trainer)
            start = time.perf_counter()
            if track:
                loss, memory = measured_step(trainer, inputs, targets, device)
            else:
                loss = trainer.step(inputs, targets)
            dist.barrier()
            synchronize(device)
            times.append(time.perf_counter() - start)
            if heartbeat.rank == 0:
                log_step(step, settings.steps, every, loss=loss, step_time_s=times[-1], tokens_per_step=tokens_per_step)
            if step == first and first > 0 and heartbeat.rank == 0:  # how long a restart took shows from here
                logger.info("step %d, the first after the resume, ended at %s", step, datetime.now(UTC).isoformat())
            losses.append(loss)
            (expert, context), (expert_before, context_before) = _sent_bytes(trainer), sent_before
            sent.append((expert - expert_before, context - context_before))
            stop = watch.step_done(step, time.perf_counter() - began, watch.clock.inside_s - inside_before)
            if settings.checkpoint_dir is not None and (stop or _checkpoint_due(settings, step + 1)):
                heartbeat.at("checkpoint", str(step + 1))
                checkpoint.save(
                    trainer,
                    settings.checkpoint_dir,
                    step + 1,
                    plan_sha256,
                    keep_last=settings.keep_last,
                    keep=resumed_from,
                )
            if stop:
                break
    assert memory is not None
    return times, losses, sent, memory


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (CUDA; the CPU has none queued), so that a host clock
    read next measures it: NCCL's barrier waits for its own all-reduce only, and a step's
    collectives return once queued."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


SLOW_LINK_FAULT_S = 6e-3
"""Seconds the injected slow link adds to each collective of its groups."""


def _inject_fault(
    settings: RunSettings, rank: int, step: int, watch: StragglerWatch, times_s: Sequence[float]
) -> float:
    """Act out ``settings.inject_fault`` if it falls on this rank and step. Returns the seconds
    this rank lags each step from now on: the "slow" fault's straggler sleeps, inside its compute
    where its peers wait for it, as long as its fastest step so far took (``times_s``; at least
    ``SLOW_FAULT_S``), so it is about twice as slow on a fast host and a slow one alike; 0 otherwise."""
    fault = settings.inject_fault
    if fault is None or step != fault[1]:
        return 0.0
    if fault[2] == "slow-link":
        if rank in (fault[0], fault[3]):
            watch.clock.injected_delay = (frozenset((fault[0], fault[3])), SLOW_LINK_FAULT_S)
        return 0.0
    if rank != fault[0]:
        return 0.0
    if fault[2] == "slow":
        return max(SLOW_FAULT_S, min(times_s, default=0.0))
    act_out_fault(fault[2], settings.timeout_s)
    return 0.0


def tracked_step(settings: RunSettings, first: int = 0) -> int:
    """The step whose memory is measured: the first after the warm-up of a run starting at step
    ``first`` (the optimizer's state then exists, as in every later step), or the last of a
    shorter run."""
    return min(first + settings.warmup_steps, settings.steps - 1)


def _checkpoint_due(settings: RunSettings, done: int) -> bool:
    """Whether to checkpoint after ``done`` steps: every ``checkpoint_every``, and after the last."""
    every = settings.checkpoint_every
    return done == settings.steps or (every > 0 and done % every == 0)


def _report(
    settings: RunSettings,
    plan: Plan,
    plan_sha256: str,
    times: list[float],
    losses: list[float],
    memory: list[RankMemory],
    hosts: list[str],
    device: torch.device,
    world: int,
    sent_by_rank: list[tuple[float, float]],
    first: int,
) -> RunReport:
    # Tracking memory slows its step several times over: it is not a step to time.
    tracked = tracked_step(settings, first) - first
    steady = [t for i, t in enumerate(times) if i >= settings.warmup_steps and i != tracked] or times
    measured = statistics.median(steady)
    return RunReport(
        created=datetime.now(UTC),
        plan_sha256=plan_sha256,
        first_step=first,
        model=plan.model.name,
        layout=plan.layout,
        world_size=world,
        backend=dist.get_backend(),
        device=str(device.type),
        torch_version=torch.__version__,
        hosts=tuple(sorted(set(hosts))),
        precision=plan.training.precision.describe(),
        optimizer=str(settings.optimizer),
        steps=settings.steps,
        warmup_steps=settings.warmup_steps,
        step_times_s=tuple(times),
        losses=tuple(losses),
        measured_step_time_s=measured,
        predicted_step_time_s=plan.estimate.step_time_s,
        measured_tokens_per_s=plan.training.tokens_per_step / measured,
        predicted_tokens_per_s=plan.estimate.tokens_per_s,
        memory=tuple(memory),
        expert_sent_bytes_per_step=tuple(e for e, _ in sent_by_rank) if plan.layout.expert_parallel_degree > 1 else (),
        context_sent_bytes_per_step=tuple(c for _, c in sent_by_rank)
        if plan.layout.context_parallel_degree > 1
        else (),
    )
