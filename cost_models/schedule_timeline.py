"""A pipeline step as a timeline: when every stage runs each micro-batch's forward, recompute,
backward and communication, and where it waits (the bubble).

The estimate prices a step's critical path in closed form (``cost_models.estimate``: m
micro-batches on the slowest stage, the bubble, and 2 transfers per slot of the schedule,
``pipeline.micro_batch_slots``). This replays the same schedule op by op from the same per-stage
times (``timing.stage_times``), each stage running its ops in the schedule's order, an op
starting once the stage is free and the op it depends on (the previous chunk's forward, the next
chunk's backward) has finished:
- GPipe: every forward, then every backward, in micro-batch order;
- 1F1B: p - s - 1 forwards on stage s, then one forward and one backward in turn, then the
  remaining backwards (Narayanan et al. SC21 fig. 4);
- interleaved: Megatron-LM's order (``forward_backward_pipelining_with_interleaving``): warm-up of
  (p - s - 1) 2 + (v - 1) p chunk forwards, micro-batches taken p at a time per model chunk.
Each op carries one transfer: the cost model's 2 (m v + p - 1) transfers of a step spread evenly
over the 2 (m v + p - 1) ops of the critical path; a chunk's tensor-, expert-parallel and
vocabulary collectives are split evenly between its forward and backward. With equal stages the
timeline lasts exactly the estimate's pipeline terms (compute, recompute, tensor- and
expert-parallel and pipeline communication, bubble); with unequal ones it is shorter, the
estimate charging every slot at the slowest stage. Pure: no I/O. Units: seconds.
"""

from dataclasses import dataclass, replace
from enum import StrEnum

from cost_models.estimate import critical_path
from cost_models.pipeline import micro_batch_slots, pipeline_comm_s
from cost_models.vocabulary import tied_embedding_sync_s
from planner.schemas import ClusterProfile, Layout, ModelSpec, Schedule, TimeBreakdown, TrainingSpec
from planner.schemas.geometry import pipeline_schedules, tied_copy_stages
from planner.schemas.routing import RoutingStats


class Activity(StrEnum):
    """What a stage does during a span of the timeline (idle time is what no span covers)."""

    FORWARD = "forward"
    RECOMPUTE = "recompute"
    BACKWARD = "backward"
    COMMUNICATION = "communication"


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkTimes:
    """One model chunk's seconds for one micro-batch on one stage."""

    forward_s: float
    backward_s: float
    recompute_s: float = 0.0
    collectives_s: float = 0.0
    """Tensor-, expert-parallel and vocabulary collectives, forward and backward together."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """One activity of one stage on one micro-batch and model chunk."""

    stage: int
    micro_batch: int
    chunk: int
    """The model chunk (0 .. p v - 1; stage s holds s, s + p, ...); -1 for step-level work."""
    activity: Activity
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """Every stage's spans of one step's pipeline."""

    stages: int
    spans: tuple[Span, ...]

    @property
    def length_s(self) -> float:
        """From the first forward to the last span's end."""
        return max((s.end_s for s in self.spans), default=0.0)

    def busy_s(self, stage: int) -> float:
        """Seconds ``stage`` is doing something."""
        return sum(s.end_s - s.start_s for s in self.spans if s.stage == stage)


@dataclass(frozen=True, slots=True)
class _Op:
    forward: bool
    micro_batch: int
    local_chunk: int


def stage_order(schedule: Schedule, stages: int, virtual_stages: int, micro_batches: int, stage: int) -> list[_Op]:
    """The order in which ``stage`` runs its forwards and backwards (module docstring)."""
    p, v, m, s = stages, virtual_stages, micro_batches, stage
    if schedule is Schedule.GPIPE:
        return [_Op(True, i, 0) for i in range(m)] + [_Op(False, i, 0) for i in range(m)]
    if schedule is Schedule.ONE_F_ONE_B or v == 1:
        warmup = min(p - s - 1, m)
        order = [_Op(True, i, 0) for i in range(warmup)]
        for i in range(m - warmup):
            order += [_Op(True, warmup + i, 0), _Op(False, i, 0)]
        return order + [_Op(False, i, 0) for i in range(m - warmup, m)]
    if m % p:
        raise ValueError(f"the interleaved schedule needs micro-batches ({m}) divisible by stages ({p})")

    def op(k: int, forward: bool) -> _Op:  # Megatron-LM's k-th virtual micro-batch
        chunk = (k // p) % v
        return _Op(forward, (k // (p * v)) * p + k % p, chunk if forward else v - 1 - chunk)

    total = m * v
    warmup = min((p - s - 1) * 2 + (v - 1) * p, total)
    order = [op(k, True) for k in range(warmup)]
    for i in range(total - warmup):
        order += [op(warmup + i, True), op(i, False)]
    return order + [op(k, False) for k in range(total - warmup, total)]


def pipeline_timeline(
    schedule: Schedule,
    chunks: tuple[ChunkTimes, ...],
    micro_batches: int,
    *,
    virtual_stages: int = 1,
    transfer_s: float = 0.0,
) -> Timeline:
    """Replay a step's pipeline schedule (module docstring).

    Args:
        schedule: the pipeline schedule.
        chunks: each stage's times per model chunk and micro-batch (p entries).
        micro_batches: micro-batches per step (m).
        virtual_stages: model chunks per stage (v; interleaved only).
        transfer_s: the point-to-point transfer each op ends with.

    Returns:
        The spans of every stage; idle time is what they leave uncovered.

    Raises:
        ValueError: an interleaved schedule whose micro-batches do not divide by the stages.
    """
    p, v = len(chunks), virtual_stages
    orders = [stage_order(schedule, p, v, micro_batches, s) for s in range(p)]
    done: dict[tuple[bool, int, int], float] = {}  # (forward, micro-batch, model chunk) -> end
    free, next_op, spans = [0.0] * p, [0] * p, []
    last_chunk = p * v - 1
    while any(next_op[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while next_op[s] < len(orders[s]):
                op = orders[s][next_op[s]]
                chunk = op.local_chunk * p + s
                before = (True, op.micro_batch, chunk - 1) if op.forward else (False, op.micro_batch, chunk + 1)
                if op.forward and chunk == 0:
                    ready = 0.0
                elif not op.forward and chunk == last_chunk:
                    ready = done.get((True, op.micro_batch, chunk), -1.0)
                else:
                    ready = done.get(before, -1.0)
                if ready < 0:
                    break
                t = chunks[s]
                parts = (
                    [(Activity.FORWARD, t.forward_s)]
                    if op.forward
                    else [(Activity.RECOMPUTE, t.recompute_s), (Activity.BACKWARD, t.backward_s)]
                )
                parts.append((Activity.COMMUNICATION, t.collectives_s / 2 + transfer_s))
                clock = max(free[s], ready)
                for activity, seconds in parts:
                    if seconds > 0:
                        spans.append(
                            Span(
                                stage=s,
                                micro_batch=op.micro_batch,
                                chunk=chunk,
                                activity=activity,
                                start_s=clock,
                                end_s=clock + seconds,
                            )
                        )
                        clock += seconds
                done[(op.forward, op.micro_batch, chunk)] = free[s] = clock
                next_op[s] += 1
                progressed = True
        if not progressed:
            raise ValueError(f"the {schedule} order deadlocks: every stage waits")  # a bug in stage_order
    return Timeline(stages=p, spans=tuple(spans))


def pipeline_time_s(time: TimeBreakdown) -> float:
    """The estimate's terms a timeline of its pipeline covers (module docstring), in seconds."""
    return (
        time.compute_s
        + time.recompute_s
        + time.tensor_parallel_comm_s
        + time.expert_parallel_comm_s
        + time.context_parallel_comm_s
        + time.pipeline_comm_s
        + time.pipeline_bubble_s
    )


def _flushed(schedule: Timeline, flushes: int) -> Timeline:
    """``flushes`` runs of one schedule's timeline back to back (``TrainingSpec.pipeline_flushes``),
    each run's micro-batches numbered after the run before."""
    per_run = 1 + max((s.micro_batch for s in schedule.spans), default=-1)
    spans = tuple(
        replace(
            s,
            micro_batch=s.micro_batch + run * per_run,
            start_s=s.start_s + run * schedule.length_s,
            end_s=s.end_s + run * schedule.length_s,
        )
        for run in range(flushes)
        for s in schedule.spans
    )
    return Timeline(stages=schedule.stages, spans=spans)


def estimate_timeline(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    routing: RoutingStats | None = None,
) -> Timeline:
    """The timeline of ``layout``'s step from the estimate's own per-stage times and shared-core
    factor (``estimate.critical_path``) and its calibration scales, a tied embedding's gradient sum
    ending the step on the two stages holding its copies.

    Args:
        model, training, cluster, layout, routing: as for ``estimate``.

    Returns:
        The replayed schedule, in seconds from the step's first forward.
    """
    path = critical_path(model, training, cluster, layout, routing)
    m, times, slowest, shared = path.micro_batches, path.times, path.slowest, path.shared
    cal = cluster.calibration
    compute = shared * (cal.compute_scale if cal else 1.0)
    tp_scale = shared * (cal.tensor_parallel_scale if cal else 1.0)
    comm_scale = cal.communication_scale if cal else 1.0
    v = layout.virtual_stages
    chunks = tuple(
        ChunkTimes(
            forward_s=compute * (st.compute_s - st.backward_s) / v,
            backward_s=compute * st.backward_s / v,
            recompute_s=compute * st.recompute_s / v,
            collectives_s=(
                tp_scale * st.tensor_parallel_comm_s
                + shared * comm_scale * (st.expert_parallel_comm_s + st.context_parallel_comm_s)
                + comm_scale * st.vocabulary_comm_s
            )
            / v,
        )
        for st in times
    )
    transfers_s = comm_scale * pipeline_comm_s(
        model, training, cluster, layout, m, slowest.compute_s + slowest.recompute_s
    )
    schedules = pipeline_schedules(layout, training.pipeline_flushes)
    slots = micro_batch_slots(layout, m, schedules)
    transfer_s = transfers_s / (2 * slots) if layout.pipeline_parallel_degree > 1 else 0.0
    timeline = _flushed(
        pipeline_timeline(layout.schedule, chunks, m // schedules, virtual_stages=v, transfer_s=transfer_s), schedules
    )
    copies = tied_copy_stages(model, layout)
    sync_s = comm_scale * tied_embedding_sync_s(model, training, cluster, layout)
    if copies is None or sync_s <= 0:
        return timeline
    start = max(s.end_s for s in timeline.spans if s.stage in copies)
    sync = tuple(
        Span(stage=s, micro_batch=-1, chunk=-1, activity=Activity.COMMUNICATION, start_s=start, end_s=start + sync_s)
        for s in copies
    )
    return Timeline(stages=timeline.stages, spans=timeline.spans + sync)
