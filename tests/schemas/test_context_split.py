"""How context parallelism may split a sequence and its attention (``schemas.context_split``): one
rule with one message, which the cost models and the refusal of a plan before a run both give."""

import pytest

from cost_models.estimate import estimate
from cost_models.layout_validity import check_layout
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.plans import make_plan
from planner.schemas import ContextParallelKind, Layout, TrainingSpec
from planner.schemas.context_split import check_context_split
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.runtime_support import check_runnable

RING, A2A = ContextParallelKind.RING, ContextParallelKind.ALL_TO_ALL


@pytest.mark.parametrize(
    ("kind", "cp", "seq_len", "heads", "fragment"),
    [
        (RING, 2, 8190, 32, "into 2 x cp = 4 equal chunks, but seq_len=8190 is not divisible by 4; use a cp for"),
        (RING, 1, 7, None, "into 2 x cp = 2 equal chunks, but seq_len=7"),  # a ring of one still cuts 2 chunks
        (A2A, 8, 8192, 4, "rank's 4 query heads, but cp does not divide 4; use a cp among 2, 4 or the ring"),
        (A2A, 3, 9, 1, "use a cp among none (one head) or the ring"),
        (A2A, 2, 8191, 32, "into 2 equal chunks, but seq_len=8191 is not divisible by 2; use a cp that divides it"),
        (A2A, 4, 10, None, "into 4 equal chunks, but seq_len=10 is not divisible by 4"),
    ],
)
def test_each_refusal_names_the_value_and_the_fix(
    kind: ContextParallelKind, cp: int, seq_len: int, heads: int | None, fragment: str
) -> None:
    with pytest.raises(InfeasibleConfigError) as refused:
        check_context_split(kind, cp, seq_len, heads)
    assert fragment in str(refused.value)


def test_what_splits() -> None:
    check_context_split(RING, 2, 8192, 3)  # the ring splits no heads
    check_context_split(RING, 1, 8)
    check_context_split(A2A, 4, 8196, 8)  # the contiguous split needs cp, not 2 cp, to divide the sequence
    check_context_split(A2A, 4, 8, None)  # the sequence alone
    check_context_split(A2A, 3, 9, 6)


@pytest.mark.parametrize(("kind", "seq_len"), [(RING, 8190), (A2A, 8191)])
def test_the_cost_models_and_the_refusal_before_a_run_give_one_message(kind: ContextParallelKind, seq_len: int) -> None:
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100:1")
    training = TrainingSpec(global_batch_size=8, seq_len=8192)
    layout = Layout(
        data_parallel_degree=2,
        tensor_parallel_degree=2,
        pipeline_parallel_degree=1,
        micro_batch_size=1,
        context_parallel_degree=2,
        context_parallel_kind=kind,
    )
    plan = make_plan(model, training, cluster, "dgx-h100:1", layout, estimate(model, training, cluster, layout))
    odd = training.model_copy(update={"seq_len": seq_len})
    messages = []
    for refuse in (
        lambda: check_layout(model, odd, cluster, layout),
        lambda: check_runnable(plan.model_copy(update={"training": odd}), cuda=False),
    ):
        with pytest.raises(InfeasibleConfigError) as refused:
            refuse()
        messages.append(str(refused.value))
    assert messages[0] == messages[1] and f"seq_len={seq_len}" in messages[0]
