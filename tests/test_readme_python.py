"""The README's Python example runs as written, and the layout it estimates by hand fits and says
so (it estimated a layout 2.7 GiB over the H100's memory and printed it as if
it were a plan)."""

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from planner import api
from planner.schemas import Layout

ROOT = Path(__file__).resolve().parents[1]


def _python_block() -> str:
    (block,) = re.findall(r"^```python\n(.*?)^```$", (ROOT / "README.md").read_text(), flags=re.S | re.M)
    return str(block)


def test_the_readme_example_estimates_a_layout_that_fits_and_prints_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # All of it but the dry run of an 8B rank (a minute; the slow test below runs that too).
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(api, "dry_run", lambda plan, rank=0: None)
    printed, names = io.StringIO(), {"__name__": "readme"}
    with contextlib.redirect_stdout(printed):
        exec(compile(_python_block(), "README.md", "exec"), names)
    est = names["est"]
    assert est.fits and est.peak_memory_bytes <= est.memory_capacity_bytes
    assert "fits: True" in printed.getvalue()
    one = {"data_parallel_degree": 8, "tensor_parallel_degree": 1, "pipeline_parallel_degree": 1}
    zero1 = api.estimate("llama3-8b", "dgx-h100:1", names["training"], Layout(**one, micro_batch_size=1, zero_stage=1))
    assert not zero1.fits  # as the example's comment says
    assert api.load_plan(tmp_path / "plan.json") == names["plans"][0]


@pytest.mark.slow
def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _python_block()], capture_output=True, text=True, check=False, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "fits: True" in proc.stdout
