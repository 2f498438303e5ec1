"""A dry run drives a pipeline stage's step itself (``runtime.dry_run._stage_step``): it must run
what ``Trainer.step`` runs, in its order, or the trace misses what the runtime holds. The sum of a
tied embedding's two copies' gradients comes after the backward (its copy in the reduce precision,
V/t x h x 4 bytes under bf16, is held then) and before the optimizer step."""

import contextlib
from types import SimpleNamespace

import pytest

from planner.schemas import Layout
from runtime import dry_run


def test_a_pipeline_stage_sums_tied_gradients_between_its_backward_and_its_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(
        dry_run, "_forward_backward", lambda trainer, plan, n, **_: calls.append(f"forward-backward {n}")
    )
    layout = Layout(data_parallel_degree=1, tensor_parallel_degree=1, pipeline_parallel_degree=2, micro_batch_size=1)
    trainer = SimpleNamespace(
        layout=layout,
        pp_rank=1,  # the last stage under 1F1B: one micro-batch in flight, 4 in the step
        micro_batches=4,
        chunks=[],
        loss_context=contextlib.nullcontext,
        optimizer=SimpleNamespace(zero_grad=lambda: calls.append("zero_grad"), step=lambda: calls.append("step")),
        tied=SimpleNamespace(sync=lambda chunks: calls.append("tied sync")),
        vocabulary=None,
    )
    dry_run._stage_step(trainer, None)  # type: ignore[arg-type]
    assert calls == ["zero_grad", "forward-backward 1", "forward-backward 1", "tied sync", "step"]
