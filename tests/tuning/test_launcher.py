"""A trial's job: the command it runs, and what a failed job is recorded as."""

import time
from pathlib import Path

import pytest
from conftest import make_cluster

from cost_models.estimate import estimate
from planner.files.models import load_model
from planner.files.plans import make_plan
from planner.schemas import Layout, Plan, TrainingSpec
from planner.schemas.errors import SchemaError
from planner.tuning.launcher import check_template, job_command, run_job

MODEL = load_model("tiny-gpt")
TRAINING = TrainingSpec(global_batch_size=8, seq_len=64)


def plan_on(nodes: int, per_node: int = 2) -> Plan:
    cluster = make_cluster(nodes=nodes, per_node=per_node)
    layout = Layout(
        data_parallel_degree=nodes * per_node, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1
    )
    return make_plan(MODEL, TRAINING, cluster, f"test:{nodes}", layout, estimate(MODEL, TRAINING, cluster, layout))


def test_a_template_is_filled_and_an_unknown_placeholder_refused() -> None:
    plan = plan_on(2)
    line = job_command(plan, Path("p.json"), Path("r.json"), 5, "srun -N {nnodes} -n {world_size} x {run_args}")
    assert line == "srun -N 2 -n 4 x -m planner run p.json --steps 5 --report r.json"
    with pytest.raises(SchemaError, match=r"\{nodes\}.*it may use \{plan\}"):
        check_template("srun -N {nodes} {run_args}")
    with pytest.raises(SchemaError, match="give --launcher"):
        job_command(plan, Path("p.json"), Path("r.json"), 5, None)


@pytest.mark.parametrize("template", ["srun -N {nnodes} hostname", "srun python -m planner run {plan} --steps {steps}"])
def test_a_template_that_runs_no_plan_is_refused(template: str) -> None:
    with pytest.raises(
        SchemaError, match=r"runs no plan: it names neither \{run_args\} nor both \{plan\} and \{report\}"
    ):
        check_template(template)
    check_template("srun python -m planner run {plan} --report {report}")


def test_the_local_command_is_torchrun_of_this_interpreter() -> None:
    line = job_command(plan_on(1), Path("p.json"), Path("r.json"), 3, None)
    assert "-m torch.distributed.run --standalone --nproc-per-node 2 -m planner run p.json --steps 3" in line


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        (
            "echo '[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB'; exit 1",
            "out of memory: [rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB",
        ),
        (
            "echo '[rank0]: ValueError: first'; echo 'ChildFailedError: later'; exit 3",
            "exit code 3: ValueError: first",
        ),
        ("echo done; exit 0", "the job succeeded but wrote no report"),
    ],
)
def test_a_failed_job_says_why(tmp_path: Path, script: str, reason: str) -> None:
    run = run_job(script, tmp_path / "r.json", tmp_path / "log.txt", timeout_s=30)
    assert run.report is None and run.failure == reason
    assert script in (tmp_path / "log.txt").read_text()  # the log keeps the command and its output


def test_a_job_past_its_time_limit_is_stopped_with_its_children(tmp_path: Path) -> None:
    marker = tmp_path / "still-running"
    start = time.perf_counter()
    run = run_job(f"(sleep 3; touch {marker}) & sleep 30", tmp_path / "r.json", tmp_path / "log.txt", timeout_s=0.5)
    assert run.failure is not None and run.failure.startswith("timed out after 0.5 s")
    assert time.perf_counter() - start < 10
    time.sleep(3.5)
    assert not marker.exists()  # the whole process group went, not just the shell
