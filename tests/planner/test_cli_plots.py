"""`planner explain --plot DIR` and `planner search --plot FILE`: PNG files written, bad paths
refused in one line before any work, and every evaluated layout recorded for the search plot."""

import struct
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cost_models.schedule_timeline import Timeline
from planner import api
from planner.cli import app
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import Plan, TrainingSpec
from planner.schemas.settings import Budget
from planner.search_engine import ExhaustiveSearch
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.space import SearchSpace
from planner.views import plots
from planner.views.plots import EXPLAIN_FILES

SEARCH = ["search", "-m", "tiny-gpt", "-c", "dgx-a100-80g:1", "--global-batch-size", "32", "--seq-len", "128"]
ESTIMATE = [
    *["estimate", "-m", "llama3-8b", "-c", "dgx-a100-80g:1", "--global-batch-size", "8", "--seq-len", "4096"],
    *["--dp", "1", "--tp", "2", "--pp", "4", "--micro-batch-size", "1", "--recompute", "full"],
]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG file, read from its header (which must be a PNG's)."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _planner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "planner", *args], capture_output=True, text=True, check=False, timeout=60
    )


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    result = CliRunner().invoke(app, [*ESTIMATE, "--output", str(path)])
    assert result.exit_code == 0, result.output
    return path


def test_explain_writes_the_schedule_memory_and_step_time(plan_file: Path, tmp_path: Path) -> None:
    where = tmp_path / "plots"  # created: its parent exists
    result = CliRunner().invoke(app, ["explain", str(plan_file), "--plot", str(where)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in where.iterdir()) == sorted(EXPLAIN_FILES)
    for name in EXPLAIN_FILES:
        width, height = _png_size(where / name)
        assert 300 <= width <= 1400 and 200 <= height <= 1000
        assert (where / name).stat().st_size < 150_000


def test_search_draws_every_evaluated_layout(tmp_path: Path) -> None:
    path = tmp_path / "search.png"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, [*SEARCH, "--top-k", "2", "--plot", str(path)])
    assert result.exit_code == 0, result.output
    assert f"to {path}" in result.output
    assert _png_size(path) == (800, 500)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*SEARCH, "--plot", "{tmp}/search.txt"], "must name a .png file"),
        ([*SEARCH, "--plot", "{tmp}/missing/search.png"], "does not exist or is not writable"),
        ([*SEARCH, "--plot", "{tmp}"], "must name a .png file"),
        (["explain", "{plan}", "--plot", "{tmp}/file.txt"], "is a file; name a directory"),
        (["explain", "{plan}", "--plot", "{tmp}/missing/plots"], "does not exist; create it first"),
        # checked before the plan is read: a missing plan would otherwise be the error
        (["explain", "{tmp}/no-plan.json", "--plot", "{tmp}/file.txt"], "is a file; name a directory"),
    ],
)
def test_bad_plot_paths_are_refused_in_one_line(args: list[str], message: str, plan_file: Path, tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("not a directory")
    filled = [a.format(tmp=tmp_path, plan=plan_file) for a in args]
    proc = _planner(*filled)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "fastest layouts" not in proc.stdout  # refused before the search


@pytest.mark.parametrize("processes", [1, 3])
def test_the_evaluator_records_every_layout_it_prices(processes: int) -> None:
    model, profile = load_model("mixtral-8x7b"), load_cluster("dgx-h100:2")
    training = TrainingSpec(global_batch_size=8, seq_len=2048)
    space = SearchSpace(
        model=model, training=training, world_size=profile.world_size, devices_per_node=profile.devices_per_node
    )
    evaluate = Evaluator(model, training, profile, record_points=True)
    found = ExhaustiveSearch(processes=processes, min_parallel_blocks=0).search(space, evaluate, Budget(), seed=0)
    plain = Evaluator(model, training, profile)
    unplotted = ExhaustiveSearch(processes=processes, min_parallel_blocks=0).search(space, plain, Budget(), seed=0)
    # plotting changes what is drawn, not what the search asks or finds (the count it prints)
    assert (found.evaluated, evaluate.evaluations) == (unplotted.evaluated, plain.evaluations)
    assert [c.layout for c in found.feasible] == [c.layout for c in unplotted.feasible]
    points = evaluate.points
    # every layout priced, and those the recompute bisection passes over (priced for the plot alone)
    assert points is not None and len(points) > evaluate.evaluations > len(found.feasible)
    fitting = sorted(p.step_time_s for p in points if p.fits)
    assert len(fitting) >= len(found.feasible)
    assert fitting[0] == pytest.approx(found.feasible[0].estimate.step_time_s)
    assert all(p.peak_memory_bytes > evaluate.usable_memory_bytes for p in points if not p.fits)
    assert Evaluator(model, training, profile).points is None  # nothing kept unless asked


def _explained(args: list[str], tmp_path: Path) -> tuple[Plan, Timeline]:
    path = tmp_path / "plan.json"
    result = CliRunner().invoke(app, [*args, "--output", str(path)])
    assert result.exit_code == 0, result.output
    shown = api.explain(path, timeline=True)
    assert shown.timeline is not None
    return shown.plan, shown.timeline


ONE_STAGE = [
    *["estimate", "-m", "tiny-gpt", "-c", "dgx-a100-80g:1", "--global-batch-size", "32", "--seq-len", "128"],
    *["--dp", "8", "--tp", "1", "--pp", "1", "--micro-batch-size", "1"],
]


@pytest.mark.parametrize("args", [ONE_STAGE, ESTIMATE], ids=["pp1", "pp4"])
def test_the_schedule_legend_lies_inside_the_figure(args: list[str], tmp_path: Path) -> None:
    plan, timeline = _explained(args, tmp_path)
    fig = plots._schedule(plan, timeline)
    fig.draw_without_rendering()  # lays the figure out, as saving it does
    (legend,) = fig.legends
    box, page = legend.get_window_extent(), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, (box, page)
    assert "bubble (idle)" in [t.get_text() for t in legend.get_texts()]


def test_the_memory_plot_draws_the_usable_memory_the_search_fits_under(tmp_path: Path) -> None:
    plan, _ = _explained(ESTIMATE, tmp_path)
    (ax,) = plots._memory(plan, 0.1).axes
    capacity = plan.estimate.memory_capacity_bytes / 2**30
    levels = sorted(float(line.get_ydata()[0]) for line in ax.get_lines())  # type: ignore[index, arg-type]
    assert levels == pytest.approx([capacity * 0.9, capacity])
    legend = ax.get_legend()
    assert legend is not None and any("10% kept free" in t.get_text() for t in legend.get_texts())
