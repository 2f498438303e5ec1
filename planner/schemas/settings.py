"""One typed Settings object per command: what the command is asked to do, as data.

Each field's attribute docstring is the one place its meaning is written; the CLI's options build
these objects and the flows (``planner.flows``) read them. Behaviour (progress callbacks, search
strategies and refiners, how a trial runs) is not data: it stays a keyword argument of the flow.
"""

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from planner.schemas.choices import Choice
from planner.schemas.enums import DType, OnFault, VocabularyLayout
from planner.schemas.errors import SchemaError
from planner.schemas.fp8 import Fp8Recipe
from planner.schemas.model import ModelSpec
from planner.schemas.plan import Plan
from planner.schemas.stacks import StackName

KIB, MIB = 1024, 1024 * 1024

DEFAULT_MEMORY_MARGIN = 0.05
"""Share of device memory kept free for allocator fragmentation and untracked buffers."""

REPLAN_CANDIDATES = 10
"""The fastest layouts a re-plan considers, in order, for the first the runtime runs."""


class StrategyName(StrEnum):
    """Search strategies by name (``planner.search_engine.make_strategy``)."""

    EXHAUSTIVE = "exhaustive"
    OPTUNA = "optuna"


class OptimizerName(StrEnum):
    """Optimizers the runtime offers."""

    ADAMW = "adamw"
    SGD = "sgd"


class Selection(StrEnum):
    """Which of the search's plans the tuner runs."""

    TOP = "top"
    """The k fastest predicted: find the measured best among the model's favourites."""
    SPREAD = "spread"
    """k plans evenly spaced over the ``planner.tuning.selection.SPREAD_POOL`` x k fastest, the
    fastest included: a wider range of plans to calibrate on and to judge the model's ranking by."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """How much a strategy may spend."""

    max_trials: int | None = None
    """Layouts to evaluate at most (None: no limit)."""
    max_time_s: float | None = None
    """Wall time at most (None: no limit)."""
    workers: int = 1
    """Parallel workers (CP-SAT search workers)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSettings:
    """What `planner search` (and the searches inside tune and replan) looks for, and how hard."""

    strategy: StrategyName = StrategyName.EXHAUSTIVE
    """Which strategy walks the space: every layout, or Optuna's sampler (a flow may be handed a
    strategy object instead)."""
    budget: Budget | None = None
    """Trials and seconds the strategy may spend (None: no limit; Optuna 400 trials)."""
    top_k: int = 5
    """Plans to return, fastest first."""
    seed: int = 0
    """Seed of the sampler and of the CP-SAT solvers."""
    memory_margin: float = DEFAULT_MEMORY_MARGIN
    """Share of device memory kept free (allocator fragmentation, untracked buffers)."""
    storage: str | None = None
    """Optuna study storage URL (e.g. sqlite:///search.db) for a resumable search."""
    routing_trace: Path | None = None
    """A routing trace of the model (``planner.files.routing_trace``): every MoE layer is then
    priced at its busiest rank's load, and the experts of finalists with expert parallelism are
    placed from it (CP-SAT). None: routing is taken as uniform."""
    expert_replicas: int = 0
    """With a routing trace, spare expert slots per expert-parallel rank and MoE layer, filled
    with replicas of the hottest experts (DeepSeek's EPLB redundant experts)."""
    vocabulary_layouts: tuple[VocabularyLayout, ...] | None = None
    """Where the vocabulary layers may go (None: pinned, or split over the pipeline by Vocabulary
    Parallelism's Algorithm 2)."""
    hierarchical_sharding: bool = True
    """Whether ZeRO may shard in node-sized groups (HSDP) and keep ZeRO-3's weights over a
    node-sized secondary partition after the forward (hpZ); the planner's own runtime runs both,
    but not hpZ beside tensor parallelism."""
    optimizer_offload: bool = True
    """Whether, where no layout fits, the search tries each with the least share of its optimizer
    states offloaded to host memory that fits (``Layout.optimizer_offload_fraction``), on a
    cluster that describes its hosts (``ClusterProfile.host``)."""
    activation_offload: bool = True
    """Whether, where no layout fits, the search also tries each layout without recompute or a
    pipeline with the fewest of its first layers' activations on the host that fits
    (``Layout.activation_offload_layers``)."""
    constraints: Mapping[str, Collection[Choice]] | None = None
    """Values some axes may take, by axis name (``tp``, ``pp``, ``dp``, ``ep``, ``micro_batch_size``,
    ``schedule``, ``virtual_stages``, ``zero_stage``, ``recompute``, ...;
    ``planner.search_engine.axes.AXES``), applied before anything is enumerated; a search they
    leave without a valid layout says which constraint did it."""
    record_points: bool = False
    """Keep every evaluated layout's predicted time and peak memory (for a plot; layouts that do
    not fit are then priced in full too)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplanSettings:
    """How `planner replan` searches a plan's model and training again on other devices."""

    checkpoint_dir: Path | None = None
    """A checkpoint folder of the old run: its newest complete checkpoint must load into the new
    plan (same model and global batch). None: no checkpoint is checked."""
    search: SearchSettings = SearchSettings(top_k=REPLAN_CANDIDATES)
    """The search; its ``top_k`` fastest layouts are tried in order for the first the runtime runs."""
    stack: StackName | None = None
    """Price the new plan for this stack (``TrainingSpec.under``); None: the old plan's."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSettings:
    """How `planner run` trains with a plan, on every rank under torchrun."""

    plan: Plan
    """The plan, loaded once (``planner.files.plans.read_plan``)."""
    plan_sha256: str
    """SHA-256 of the plan file's bytes, recorded in the run report."""
    plan_file: Path | None = None
    """The file the plan was read from, named in messages (None: a plan built in Python)."""
    report_path: Path = Path("report.json")
    """Where rank 0 writes the RunReport (JSON)."""
    steps: int = 10
    """Training steps."""
    warmup_steps: int = 1
    """First steps left out of the measured step time."""
    seed: int = 0
    """Seed of the initialisation and the synthetic data."""
    optimizer: OptimizerName = OptimizerName.ADAMW
    """adamw, or sgd for exact parity checks."""
    lr: float = 1e-3
    """Learning rate."""
    data: Path | None = None
    """A token file (uint16); None means synthetic tokens."""
    timeout_s: float = 300.0
    """Seconds a rank waits for a peer before the job fails."""
    trace_routing: Path | None = None
    """Where rank 0 writes the run's routing trace (an MoE model's expert ids per token and
    layer, ``runtime.routing_trace``); None: no trace."""
    checkpoint_dir: Path | None = None
    """Where every rank saves its part of each checkpoint (``runtime.checkpoint``: model,
    optimizer, step and random state; atomic); None: none are taken."""
    checkpoint_every: int = 0
    """Steps between checkpoints; 0: one after the last step only."""
    keep_last: int = 0
    """Complete checkpoints kept in ``checkpoint_dir``: the newest N, and always the one the run
    resumed from (a checkpoint being written is a ``.partial`` folder, never counted or removed);
    0: all of them."""
    log_every: int | None = None
    """Steps between rank 0's progress lines (step, loss, step time, tokens/s; ``runtime.progress``);
    None: every step of a run of up to 50 steps, every 10 of a longer one; 0: none."""
    resume: bool = False
    """Continue from the newest complete checkpoint in ``checkpoint_dir``, taken under the same plan
    (the steps after it compute what an uninterrupted run computes) or under another layout of the
    same model and global batch (loaded resharded)."""
    elastic: bool = False
    """For torchrun's elastic restarts (``planner launch --elastic``): continue from the newest
    complete checkpoint in ``checkpoint_dir`` whenever there is one, and on a world size other
    than the plan's, run the plan rank 0 searches for the ranks there are (the plan's cluster cut
    to them, written to ``checkpoint_dir``/plans/world-N.json) instead of refusing."""
    on_fault: OnFault = OnFault.WARN
    """What a straggler or a slow link named by the detector (``runtime.straggler_watch``) does to
    the run: WARN logs it and records it in the report; EXIT also stops every rank after that step
    (a checkpoint is taken there, if they are) and raises StragglerFound."""
    inject_fault: tuple[int, int, str, int] | None = None
    """Testing: (rank, step, "exit" | "hang" | "slow" | "slow-link", peer): that rank dies or freezes
    at the start of that step (``runtime.heartbeat.act_out_fault``), or from that step on sleeps
    at each step's start as long as its fastest step took, about doubling its compute
    (``runtime.run``), or (on both ends) the link between it and ``peer`` slows
    from that step on: each collective of a group holding both, the default group aside, first
    sleeps ``SLOW_LINK_FAULT_S`` (inside the collective clock's time; on CUDA after a device
    synchronize, so the clock's events see it). ``peer`` is the rank itself for the other kinds."""

    def __post_init__(self) -> None:
        """Refuse settings that contradict each other, before any work.

        Raises:
            SchemaError: resuming or running elastic without a checkpoint folder, or a negative
                checkpoint interval, checkpoint count or progress interval.
        """
        if self.resume and self.checkpoint_dir is None:
            raise SchemaError("--resume continues from a checkpoint: give its folder with --checkpoint-dir")
        if self.elastic and self.checkpoint_dir is None:
            raise SchemaError(
                "--elastic resumes each restart from a checkpoint: give their folder with --checkpoint-dir"
            )
        if self.checkpoint_every < 0:
            raise SchemaError(f"--checkpoint-every {self.checkpoint_every} must be 0 (after the last step) or more")
        if self.keep_last < 0:
            raise SchemaError(f"--keep-last {self.keep_last} must be 0 (keep every checkpoint) or more")
        if self.log_every is not None and self.log_every < 0:
            raise SchemaError(f"--log-every {self.log_every} must be 0 (no progress lines) or more")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileSettings:
    """What `planner profile` measures, how long it may wait, and where rank 0 writes it."""

    output: Path = Path("cluster.json")
    """Where rank 0 writes the ClusterProfile (JSON), or what it measured, marked incomplete."""
    quick: bool = False
    """Fewer sizes, shapes and repeats (``quickened``): seconds instead of a minute, wider spreads."""
    timeout_s: float = 60.0
    """A collective or transfer that waits longer than this fails the run (a rank died or hung)."""
    warmup: int = 2
    repeats: int = 5
    latency_bytes: int = 4 * KIB
    bandwidth_bytes: int = 16 * MIB
    collective_bytes: tuple[int, ...] = tuple(4**i * KIB for i in range(1, 9))
    """4 KiB ... 64 MiB."""
    gemm_shapes: tuple[tuple[int, int, int], ...] = (
        (256, 256, 256),
        (512, 512, 512),
        (1024, 1024, 1024),
        (2048, 1024, 1024),
        (1024, 4096, 1024),
        (1024, 1024, 4096),
    )
    gemm_dtypes: tuple[DType, ...] = (DType.FP32, DType.BF16)
    """Precisions GEMMs and the model's layers are timed in: the one a user will train in halves
    the time (plans in another precision are then refused)."""
    fp8: Fp8Recipe | None = None
    """Also time the GEMMs in FP8 under this recipe's scaling (CUDA only: ``profiler.fp8_gemms``),
    for plans that train in it; None: no FP8 GEMM is timed."""
    stream_bytes: int = 64 * MIB
    """Size of each operand of the elementwise kernel that measures memory bandwidth."""
    model: ModelSpec | None = None
    """Also time this model's own layers and GEMM shapes (the cost model's view of them)."""
    layer_micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    """Micro-batch sizes at which the model's own layer is timed (with ``model``)."""
    layer_repeats: int = 7
    """Repeats of each timing of the model's layers, its optimizer step, the pipeline slot and the
    sharded units, quick or not: plans are ranked by these times."""
    min_sample_s: float = 0.02
    """A lockstep timing calls an op back to back until one sample lasts this long (profiler.context)."""
    seq_len: int = 512
    """Sequence length of the model's own layers and GEMM shapes (with ``model``)."""
    model_gemm_shapes: tuple[tuple[int, int, int], ...] = ()
    """The model's own GEMM shapes (m, n, k), filled by the profile flow from the cost model's view
    of the model (``cost_models.layer_work.profile_gemm_shapes``): the profiler imports no cost model."""
    inject_link_delay: tuple[tuple[int, int, float], ...] = ()
    """Testing aid: each (a, b, seconds) slows every transfer between ranks a and b by ``seconds``
    per ``bandwidth_bytes`` moved."""
    inject_fault: tuple[int, str, str] | None = None
    """Testing aid: (rank, phase, "exit" | "hang") makes that rank die or hang when it starts the phase."""
    simulate_nodes: int | None = None
    """Testing aid: split the ranks into this many pretend nodes (contiguous blocks)."""

    def quickened(self) -> "ProfileSettings":
        """These settings with fewer sizes, shapes and repeats when ``quick``; as they are otherwise."""
        if not self.quick:
            return self
        return replace(
            self,
            warmup=1,
            repeats=3,
            bandwidth_bytes=4 * MIB,
            collective_bytes=(16 * KIB, 1 * MIB, 16 * MIB),
            gemm_shapes=((512, 512, 512), (1024, 1024, 1024)),
            stream_bytes=16 * MIB,
        )

    def to_record(self) -> dict[str, str | int | float | bool]:
        """The settings as provenance."""
        return {
            "timeout_s": self.timeout_s,
            "warmup": self.warmup,
            "repeats": self.repeats,
            "latency_bytes": self.latency_bytes,
            "bandwidth_bytes": self.bandwidth_bytes,
            "collective_bytes": ",".join(str(b) for b in self.collective_bytes),
            "gemm_shapes": len(self.gemm_shapes),
            "gemm_dtypes": ",".join(str(d) for d in self.gemm_dtypes),
            "fp8": str(self.fp8 or ""),
            "model": self.model.name if self.model else "",
            "seq_len": self.seq_len,
            "layer_micro_batches": ",".join(str(b) for b in self.layer_micro_batches),
            "layer_repeats": self.layer_repeats,
            "min_sample_s": self.min_sample_s,
            "injected_link_delay": ";".join(",".join(str(x) for x in d) for d in self.inject_link_delay),
            "simulated_nodes": self.simulate_nodes or 0,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneSettings:
    """How `planner tune` runs its trials, where it keeps them, and where the calibration goes."""

    top_k: int = 10
    """Plans to run."""
    select: Selection = Selection.TOP
    """Which of the search's plans run: the fastest, or a spread over a wider pool."""
    steps: int = 10
    """Training steps per plan."""
    storage: str = "sqlite:///tune.db"
    """The Optuna storage the study lives in; a stopped tune resumes from it."""
    study_name: str | None = None
    """None: one study per model, training and measured cluster."""
    launcher: str | None = None
    """A shell template (``planner.tuning.launcher``); None runs locally with torchrun."""
    trial_timeout_s: float = 600.0
    """Seconds a plan may run before it is stopped and recorded as failed."""
    workdir: Path = Path("tune")
    """Plans, reports and job logs of the trials."""
    vocabulary_layouts: tuple[VocabularyLayout, ...] | None = None
    """Where the searched plans may put the vocabulary layers; None: the search's default."""
    calibrate: bool = True
    """Fit the cluster's calibration from the measured plans and store it in a profile file."""
    save_calibration: Path | None = None
    """That file (None: the cluster's own profile file; a preset cluster needs one)."""
