"""`planner launch --run` checks once, before any rank starts, what needs no rank, and refuses in
one line with exit code 2 without starting torchrun; the launcher's verdict on its ranks'
failures is one deduplicated line for a user error, a line per distinct failure otherwise.
(The real launches, on 2 gloo ranks, are in tests/runtime/test_launch_run_ranks.py.)"""

import json
import signal
import sys
from pathlib import Path

import pytest
from harness import planner_main

from planner.files.clusters import load_cluster, save_cluster
from planner.files.plans import load_plan
from planner.flows import rank_errors
from planner.flows.rank_errors import RankFailure, outcome_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import cpu_cluster


@pytest.fixture
def plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A 2-rank CPU plan of tiny-gpt; starting torchrun fails the test."""
    import planner.api

    def no_launch(*_: object) -> None:
        raise AssertionError("torchrun was started")

    monkeypatch.setattr(planner.api, "launch_node", no_launch)
    save_cluster(cpu_cluster(2), tmp_path / "cluster.json")
    search = ["search", "-m", "tiny-gpt", "-c", str(tmp_path / "cluster.json"), "--global-batch-size", "8"]
    code, _, err = planner_main([*search, "--seq-len", "32", "--output", str(tmp_path / "plan.json")], monkeypatch)
    assert code == 0, err
    return tmp_path / "plan.json"


def _refused(args: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    code, out, err = planner_main(["launch", *args], monkeypatch)
    assert code == 2 and not out, out + err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_resume_without_a_checkpoint_folder_is_refused_before_torchrun(
    plan: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "--checkpoint-dir" in _refused([str(plan), "--run", "--resume"], monkeypatch)


def test_a_missing_token_file_is_refused_before_torchrun(plan: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    err = _refused([str(plan), "--run", "--data", str(plan.parent / "tokens.bin")], monkeypatch)
    assert "tokens.bin" in err and "does not exist" in err


def test_a_checkpoint_with_the_steps_done_is_refused_before_torchrun(
    plan: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.checkpoint_meta import META, model_sha256

    loaded = load_plan(plan)
    checkpoints = plan.parent / "ckpt"
    (checkpoints / "step-00000005").mkdir(parents=True)
    meta = {"step": 5, "model_sha256": model_sha256(loaded.model), "global_batch_size": 8}
    (checkpoints / "step-00000005" / META).write_text(json.dumps(meta))
    (checkpoints / "latest").write_text("step-00000005")
    args = [str(plan), "--run", "--resume", "--checkpoint-dir", str(checkpoints)]
    assert "5 steps done" in _refused([*args, "--steps", "5"], monkeypatch)
    assert "no complete checkpoint" in _refused([*args[:-1], str(plan.parent)], monkeypatch)


def test_a_plan_of_several_nodes_needs_the_node_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_cluster(load_cluster("dgx-h100:2"), tmp_path / "cluster.json")
    search = ["search", "-m", "tiny-gpt", "-c", str(tmp_path / "cluster.json"), "--global-batch-size", "32"]
    code, _, err = planner_main([*search, "--seq-len", "64", "--output", str(tmp_path / "plan.json")], monkeypatch)
    assert code == 0, err
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    assert "--node-rank" in _refused([str(tmp_path / "plan.json"), "--run"], monkeypatch)
    assert "MASTER_ADDR" in _refused([str(tmp_path / "plan.json"), "--run", "--node-rank", "1"], monkeypatch)


def test_printed_lines_carry_the_runs_options(plan: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = [str(plan), "--data", "tokens.bin", "--checkpoint-dir", "ckpt", "--resume", "--steps", "6"]
    code, out, err = planner_main(["launch", *args], monkeypatch)
    assert code == 0, err
    options = "--steps 6 --report report.json --data tokens.bin --checkpoint-dir ckpt --resume"
    assert f"planner run {plan} {options}" in out


def test_launch_help_documents_run(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = planner_main(["launch", "--help"], monkeypatch)
    assert code == 0 and "--run" in out and "planner launch plan.json --run" in out


def _failure(rank: int, code: int, message: str = "") -> RankFailure:
    return RankFailure(rank=rank, exit_code=code, message=message)


def test_the_same_user_error_on_every_rank_is_one_line_without_rank_prefixes() -> None:
    failures = [
        _failure(1, 2, "[rank1]: the plan is for 4 ranks"),
        _failure(0, 2, "the plan is for 4 ranks"),
        _failure(2, -signal.SIGTERM),  # stopped by the agent once another rank failed
    ]
    outcome = outcome_of(failures)
    assert outcome.exit_code == 2 and outcome.lines == ("error: the plan is for 4 ranks",)


def test_a_crash_is_a_line_per_distinct_failure_and_exit_code_1() -> None:
    failures = [
        _failure(0, 3, "training stopped: rank 1 stopped responding"),
        _failure(2, 3, "training stopped: rank 1 stopped responding"),
        _failure(1, 1, "RuntimeError: boom\n"),
        _failure(3, -signal.SIGKILL),
    ]
    outcome = outcome_of(failures)
    assert outcome.exit_code == 1
    assert outcome.lines == (
        "ranks 0,2 failed: exit code 3: training stopped: rank 1 stopped responding",
        "rank 1 failed: exit code 1: RuntimeError: boom",
        "rank 3 failed: killed by SIGKILL",
    )


def test_a_ranks_error_file_is_what_torchruns_agent_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    error_file = tmp_path / "error.json"
    monkeypatch.setenv(rank_errors.ERROR_FILE_ENV, str(error_file))
    monkeypatch.delenv(rank_errors.QUIET_ENV, raising=False)
    assert not rank_errors.report_to_launcher("the plan is for 4 ranks")  # a torchrun by hand: the rank says it
    monkeypatch.setenv(rank_errors.QUIET_ENV, "1")
    assert rank_errors.report_to_launcher("the plan is for 4 ranks")  # launch --run says it
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=2, error_file=str(error_file))
    assert failure.message == "the plan is for 4 ranks"
