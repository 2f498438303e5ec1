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
    monkeypatch.setattr(dry_run, "_ReceiveBuffers", lambda trainer, plan, **_: None)
    monkeypatch.setattr(
        dry_run,
        "_forward_backward",
        lambda trainer, plan, buffers, at, **_: calls.append(f"forward-backward {list(at)}"),
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
    assert calls == ["zero_grad", "forward-backward [0]", "forward-backward [0]", "tied sync", "step"]


def test_interleaved_forwards_go_through_each_chunk_in_groups_of_p_micro_batches() -> None:
    # Megatron-LM's and torch's interleaved 1F1B: rank 0 of 2 stages with 8 chunks warms up with
    # (v - 1) p + 2 (p - 1) = 16 forwards, groups of 2 micro-batches through chunk 0, 1, ..., 7,
    # and holds 17 chunks' activations at its first backward: 2 micro-batches through every chunk
    # and a third through the first (holding 3 micro-batches through all 8 traced 41% too much).
    layout = Layout(
        data_parallel_degree=1,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=2,
        micro_batch_size=1,
        schedule="interleaved",
        virtual_stages=8,
    )
    assert dry_run.forward_order(layout, 17) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 0]
    one_chunk = Layout(data_parallel_degree=1, tensor_parallel_degree=1, pipeline_parallel_degree=4, micro_batch_size=1)
    assert dry_run.forward_order(one_chunk, 3) == [0, 0, 0]
