"""``planner.tune`` and ``planner.validate`` as a Python user calls them, with fake runs: where the
calibration is stored (the profile file, another file, or nowhere, refused for a preset before
any work), and a stored study read back as the tune left it."""

from dataclasses import replace
from pathlib import Path

import pytest
from conftest import make_cluster
from fakes import FakeRunner, fake_report, true_machine

import planner
from planner.files.clusters import load_cluster, save_cluster
from planner.schemas import TrainingSpec
from planner.schemas.errors import SchemaError
from planner.schemas.settings import SearchSettings
from planner.views.tables import run_summary

TRAINING = TrainingSpec(global_batch_size=32, seq_len=128)
CLUSTER = make_cluster(per_node=4, memory_bytes=2 * 2**30, intra_bw=2e8)
MACHINE = true_machine(CLUSTER)


def _settings(tmp_path: Path) -> planner.TuneSettings:
    return planner.TuneSettings(top_k=3, storage=f"sqlite:///{tmp_path / 'tune.db'}", workdir=tmp_path / "trials")


@pytest.fixture
def cluster_path(tmp_path: Path) -> str:
    path = tmp_path / "cluster.json"
    save_cluster(CLUSTER, path)
    return str(path)


def test_tune_stores_the_calibration_in_the_profile_and_validate_reads_the_study_back(
    tmp_path: Path, cluster_path: str
) -> None:
    progress: list[tuple[int, int]] = []
    result = planner.tune(
        "tiny-gpt",
        cluster_path,
        TRAINING,
        _settings(tmp_path),
        run_trial=FakeRunner(MACHINE),
        progress=lambda done, total: progress.append((done, total)),
    )
    assert result.ran == 3 and progress[-1] == (3, 3)
    assert result.calibration is not None and result.calibration_path == Path(cluster_path)
    assert load_cluster(cluster_path).calibration == result.calibration
    assert len(result.validations) == 2

    shown = planner.validate(_settings(tmp_path).storage)
    assert shown.study_name == result.study_name
    assert [r.key for r in shown.records] == [r.key for r in result.records]
    assert shown.before is not None and result.before is not None
    assert shown.before.median_time_error == pytest.approx(result.before.median_time_error)
    assert shown.calibration_path is None  # validate stores nothing

    with pytest.raises(SchemaError, match="'other' is not in"):
        planner.validate(_settings(tmp_path).storage, study="other")


def test_tune_can_store_the_calibration_elsewhere_or_not_at_all(tmp_path: Path, cluster_path: str) -> None:
    elsewhere = tmp_path / "calibrated.json"
    result = planner.tune(
        "tiny-gpt",
        cluster_path,
        TRAINING,
        replace(_settings(tmp_path), save_calibration=elsewhere),
        run_trial=FakeRunner(MACHINE),
    )
    assert result.calibration_path == elsewhere and load_cluster(str(elsewhere)).calibration is not None
    assert load_cluster(cluster_path).calibration is None

    again = planner.tune("tiny-gpt", cluster_path, TRAINING, replace(_settings(tmp_path), calibrate=False))
    assert again.ran == 0 and again.calibration_path is None  # every plan finished; no file written
    assert load_cluster(cluster_path).calibration is None


def test_tune_on_a_preset_needs_a_place_for_the_calibration_before_any_work(tmp_path: Path) -> None:
    runner = FakeRunner(MACHINE)
    with pytest.raises(SchemaError, match="--save-calibration PATH"):
        planner.tune("tiny-gpt", "dgx-h100:1", TRAINING, _settings(tmp_path), run_trial=runner)
    assert runner.ran == [] and not (tmp_path / "tune.db").exists()


def test_validate_of_a_missing_storage_raises_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="no such file"):
        planner.validate(f"sqlite:///{tmp_path / 'nowhere.db'}")
    assert list(tmp_path.iterdir()) == []


def test_the_run_summary_puts_measured_beside_predicted() -> None:
    plan = planner.search("tiny-gpt", CLUSTER, TRAINING, SearchSettings(top_k=1))[0]
    lines = run_summary(fake_report(plan, MACHINE)).splitlines()
    assert lines[0].startswith("tiny-gpt ") and "steps" in lines[0]
    assert lines[1].startswith("  step time   measured") and "predicted" in lines[1] and "ratio" in lines[1]
    assert lines[3].startswith("  peak memory measured") and "MiB" in lines[3]
