"""A profiling run on every rank: topology -> links -> collectives -> ops, then rank 0 builds the
cluster profile and returns it (the caller writes it).

Faults: every rank records in the job's store where it is; collectives and transfers time out
after ``timeout_s``. When a phase fails on a rank (a peer died, hung, or this rank was asked to
stop), the rank names the ranks that did not reach the point it reached and the phase they were
in, and exits with code 3; rank 0 returns what it measured, marked incomplete.
"""

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from planner.schemas import ClusterProfile
from planner.schemas.errors import ProfileError
from planner.schemas.settings import ProfileSettings
from profiler import collectives, links, ops, topology
from profiler.build import build_profile
from profiler.context import Context
from profiler.progress import ProfileProgress
from runtime import Stopped, cpu_threads_per_rank, require_supported_torch, stop_on_sigterm

logger = logging.getLogger(__name__)
FAILED_EXIT_CODE = 3


def _environment() -> tuple[int, int, int, int]:
    try:
        return tuple(int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))  # type: ignore[return-value]
    except KeyError as e:
        raise ProfileError(
            f"planner profile runs on every rank under torchrun ({e.args[0]} is not set): "
            "torchrun --nproc-per-node N -m planner profile --output cluster.json"
        ) from e


@dataclass(frozen=True, slots=True)
class ProfileOutcome:
    """What a rank takes away from a profiling run."""

    exit_code: int
    """0 when every phase was measured; FAILED_EXIT_CODE when a rank failed."""
    profile: ClusterProfile | None = None
    """Rank 0, complete run: the cluster profile."""
    incomplete: dict[str, object] | None = None
    """Rank 0, failed run: what was measured and who failed (JSON-ready)."""


def profile(settings: ProfileSettings) -> ProfileOutcome:
    """Profile the cluster this rank belongs to (see the module docstring)."""
    require_supported_torch()
    rank, world, local_rank, local_world = _environment()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(cpu_threads_per_rank(local_world))  # as the runtime's ranks compute
    backend = "nccl" if cuda else "gloo"
    stop_on_sigterm()
    dist.init_process_group(backend, timeout=timedelta(seconds=settings.timeout_s))
    store = dist.distributed_c10d._get_default_store()
    ctx = Context(rank, world, local_rank, local_world, device, settings, store)
    progress = ProfileProgress(rank == 0)
    ctx.on_step, ctx.on_expect = progress.step, progress.expect
    measured: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    failure = None
    try:
        with _timed(seconds, "topology", progress):
            measured["topology"] = topology.measure(ctx)
            infos = _broadcast(measured["topology"])
        if world > 1:
            with _timed(seconds, "links", progress):
                measured["links"] = links.measure(ctx)
            with _timed(seconds, "collectives", progress):
                measured["collectives"] = collectives.measure(ctx, infos)
        else:  # one rank: no peer to send to, no group to reduce over
            measured["links"], measured["collectives"] = [[]], [[]]
        with _timed(seconds, "ops", progress):
            measured["ops"] = ops.measure(ctx)
    except (Stopped, RuntimeError, dist.DistBackendError) as e:
        failure = ctx.heartbeat.diagnose(e, "profiling")
        logger.error("rank %d: %s", rank, failure)
    finally:
        progress.close()
    outcome = ProfileOutcome(0 if failure is None else FAILED_EXIT_CODE)
    if rank == 0:
        outcome = _outcome(settings, measured, failure, backend, seconds)
    if failure is None:
        dist.barrier()
    _teardown(failure is None)
    return outcome


def not_measured(world_size: int) -> tuple[str, ...]:
    """What a profile of ``world_size`` ranks cannot measure, each with why: one rank has no
    link, collective or tensor-parallel group; an odd number of ranks leaves one out of the pairs
    that time the pipeline slot and sharded data parallelism's unit cost (``profiler.framework_ops``).
    Its plans price only what needs none of them (one rank: dp 1, tp 1, pp 1)."""
    out = []
    if world_size == 1:
        out += [
            "links: one rank has no peer to time a transfer to",
            "collectives: one rank has no group of two or more",
            "tensor-parallel layers: one rank has no tensor-parallel group",
        ]
    if world_size % 2:
        out += [
            f"pipeline slot: timed on pairs of ranks, and {world_size} is odd",
            f"sharded data parallelism (FSDP) unit cost: timed on pairs of ranks, and {world_size} is odd",
        ]
    return tuple(out)


def _broadcast(infos: list[topology.RankInfo] | None) -> list[topology.RankInfo]:
    """Rank 0's list of every rank, on every rank."""
    box = [infos]
    dist.broadcast_object_list(box, src=0)
    assert box[0] is not None
    return box[0]


@contextlib.contextmanager
def _timed(seconds: dict[str, float], phase: str, progress: ProfileProgress) -> Iterator[None]:
    start = time.perf_counter()
    progress.begin(phase)
    yield
    seconds[phase] = time.perf_counter() - start
    progress.end(seconds[phase])


def _outcome(
    settings: ProfileSettings, measured: dict[str, Any], failure: str | None, backend: str, seconds: dict[str, float]
) -> ProfileOutcome:
    if failure is None:
        profile = build_profile(
            settings,
            measured["topology"],
            measured["links"],
            measured["collectives"],
            measured["ops"],
            backend=backend,
            phase_seconds=seconds,
            not_measured=not_measured(len(measured["topology"])),
        )
        return ProfileOutcome(0, profile=profile)
    partial: dict[str, object] = {
        "complete": False,
        "failure": failure,
        "phases_measured": [name for name in ("topology", "links", "collectives", "ops") if name in measured],
        "settings": settings.to_record(),
    }
    return ProfileOutcome(FAILED_EXIT_CODE, incomplete=partial)


def _teardown(clean: bool) -> None:
    # destroy_process_group then exit at once: gloo sometimes aborts at interpreter exit
    # (field notes, pytorch#190489).
    if clean:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
