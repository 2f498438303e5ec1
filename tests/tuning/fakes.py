"""Fake trial runs for the tuner's tests: no job; each report is the model's estimate of the plan
on a 'true machine', the cluster under known calibration factors."""

from datetime import UTC, datetime

from cost_models.estimate import estimate
from cost_models.memory import workspace_bytes
from planner.schemas import Calibration, ClusterProfile, Plan, RankMemory, RunReport
from planner.schemas.settings import TuneSettings
from planner.tuning.launcher import TrialFiles, TrialRun

TRUE = dict(
    compute_scale=2.0,
    tensor_parallel_scale=3.0,
    communication_scale=0.5,
    step_overhead_s=0.003,
    micro_batch_overhead_s=0.0005,
    activation_memory_scale=1.5,
    logits_memory_scale=2.0,
    buffer_memory_scale=0.5,
    memory_overhead_bytes=2.0 * 2**20,
)
"""The machine of the fake runs: the model under these factors."""


def true_machine(cluster: ClusterProfile) -> ClusterProfile:
    """``cluster`` calibrated with the TRUE factors."""
    calibration = Calibration(**TRUE, created=datetime(2026, 1, 1), trials=0, memory_samples=0)
    return cluster.model_copy(update={"calibration": calibration})


def fake_report(plan: Plan, machine: ClusterProfile) -> RunReport:
    """A RunReport of ``plan`` whose figures are the model's on ``machine``."""
    truth = estimate(plan.model, plan.training, machine, plan.layout)
    step = truth.step_time_s
    layout = plan.layout
    ranks = []
    for rank in range(layout.world_size):
        stage = rank // (layout.data_parallel_degree * layout.tensor_parallel_degree)
        ranks.append(
            RankMemory(
                rank=rank,
                stage=stage,
                # a measured peak counts tensors: not the workspace the estimate assumes
                peak_bytes=int(truth.stages[stage].memory.total_bytes - workspace_bytes(machine)),
                predicted_bytes=plan.estimate.stages[stage].memory.total_bytes,
                predicted_workspace_bytes=plan.estimate.stages[stage].memory.workspace_bytes,
                method="MemTracker",
            )
        )
    return RunReport(
        created=datetime.now(UTC),
        plan_sha256="0" * 64,
        model=plan.model.name,
        layout=layout,
        world_size=layout.world_size,
        backend="fake",
        device="cpu",
        torch_version="fake",
        hosts=("fake",),
        precision=str(plan.training.dtype),
        optimizer="adamw",
        steps=3,
        warmup_steps=1,
        step_times_s=(step * 3, step, step),
        losses=(7.0, 6.9, 6.8),
        measured_step_time_s=step,
        predicted_step_time_s=plan.estimate.step_time_s,
        measured_tokens_per_s=plan.training.tokens_per_step / step,
        predicted_tokens_per_s=plan.estimate.tokens_per_s,
        memory=tuple(ranks),
    )


class FakeRunner:
    """Runs nothing: records each plan it is asked to run, fails the ones listed, interrupts on cue."""

    def __init__(
        self, machine: ClusterProfile, *, fail: dict[int, str] | None = None, interrupt_at: int | None = None
    ) -> None:
        self.machine = machine
        self.fail = fail or {}
        self.interrupt_at = interrupt_at
        self.ran: list[str] = []

    def __call__(self, plan: Plan, files: TrialFiles, settings: TuneSettings) -> TrialRun:
        index = len(self.ran)
        if index == self.interrupt_at:
            raise KeyboardInterrupt
        self.ran.append(plan.layout.describe())
        if index in self.fail:
            return TrialRun(report=None, failure=self.fail[index], seconds=0.1, log_path=files.log)
        return TrialRun(report=fake_report(plan, self.machine), failure=None, seconds=0.1, log_path=files.log)
