"""--loss-kernels: estimate prices the loss as Megatron-LM runs it without
--cross-entropy-loss-fusion, beside fused kernels, and the plan file carries the choice."""

import json
from pathlib import Path

import pytest
from harness import planner_main

from planner.files.plans import load_plan
from planner.schemas import Kernels

BASE = ["estimate", "-m", "llama3-8b", "-c", "dgx-h100:1", "--global-batch-size", "8", "--seq-len", "4096"]
BASE += ["--dp", "8", "--tp", "1", "--micro-batch-size", "1", "--zero-stage", "1", "--format", "json"]
BASE += ["--kernels", "fused"]  # fused kernels beside an eager loss: Megatron-LM's default


def test_an_eager_loss_adds_its_passes_over_the_logits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, fused, err = planner_main(BASE, monkeypatch)
    assert code == 0, err
    path = tmp_path / "eager-loss.json"
    code, eager, err = planner_main([*BASE, "--loss-kernels", "eager", "--output", str(path)], monkeypatch)
    assert code == 0, err
    # One micro-batch of 4096 x 128256 logits: eager moves 52 bytes a logit where fused moves 12,
    # over the preset's 3.35e12 x 0.846 B/s, and launches 10 kernels for 2 at 5 us each.
    extra_s = 40 * 4096 * 128256 / (3.35e12 * 0.846) + 8 * 5e-6
    compute_s = [json.loads(out)["time_breakdown_s"]["compute"] for out in (fused, eager)]
    assert compute_s[1] - compute_s[0] == pytest.approx(extra_s, rel=1e-6)
    assert load_plan(path).training.loss_kernels is Kernels.EAGER
