"""The straggler detector's judgement (runtime.stragglers) on synthetic timings, hand-worked, and
the collective clock's accounting (runtime.collective_clock)."""

import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.schemas import Layout, RankMemory, RunReport, SlowLink, Straggler
from planner.views.tables import run_summary
from runtime.collective_clock import CollectiveClock
from runtime.stragglers import (
    DetectorSettings,
    DetectorState,
    Finding,
    WindowTimings,
    describe,
    excess_s,
    noise_s,
    observe,
    peer_groups,
)

MS = 1e-3
FOUR = peer_groups([0, 0, 0, 0])
RULES = DetectorSettings(window_steps=4, windows_to_flag=2, min_excess_fraction=0.5, mad_factor=6.0)
"""Every rule at work (the defaults leave the noise rule off), for hand-worked cases."""


def window(first_step: int, compute_ms: Sequence[Sequence[float]], wait_ms: float = 5.0) -> WindowTimings:
    """A window from per-step, per-rank compute in ms; every rank waits ``wait_ms`` a step."""
    return WindowTimings(
        first_step=first_step,
        compute_s=tuple(tuple(c * MS for c in step) for step in compute_ms),
        wait_s=tuple(tuple(wait_ms * MS for _ in step) for step in compute_ms),
    )


def judge(
    windows: Sequence[WindowTimings], groups: Sequence[Sequence[int]] = FOUR, rules: DetectorSettings = RULES
) -> tuple[DetectorState, list[Finding]]:
    state = DetectorState.empty(len(groups))
    found: list[Finding] = []
    for w in windows:
        state, findings = observe(state, w, groups, rules)
        found += findings
    return state, found


def test_peers_are_the_other_ranks_of_the_same_stage() -> None:
    assert peer_groups([0, 0, 1, 1]) == ((1,), (0,), (3,), (2,))
    assert peer_groups([0, 1]) == ((), ())


def test_excess_is_the_least_over_the_window_of_each_steps_excess() -> None:
    # rank 3 against the median of ranks 0-2: step 1: 20 - 10 = 10 ms; step 2: 25 - 10 = 15 ms
    compute = ((10 * MS, 10 * MS, 10 * MS, 20 * MS), (10 * MS, 12 * MS, 9 * MS, 25 * MS))
    assert abs(excess_s(compute, (0, 1, 2), 3) - 10 * MS) < 1e-12
    # rank 1 is 2 ms above its peers' median (10 ms) in step 2, level with it in step 1
    assert abs(excess_s(compute, (0, 2, 3), 1)) < 1e-12
    # with the least step set aside, rank 3's excess is its other step's: 15 ms
    assert abs(excess_s(compute, (0, 1, 2), 3, outlier_steps=1) - 15 * MS) < 1e-12


def test_noise_is_the_scaled_median_absolute_deviation() -> None:
    # median 3; deviations 2, 1, 0, 1, 97: median 1
    assert abs(noise_s([1.0, 2.0, 3.0, 4.0, 100.0]) - 1.4826) < 1e-12
    assert noise_s([1.0, 5.0]) == 0.0  # too few to estimate


def test_a_rank_slow_in_two_windows_running_is_named_once() -> None:
    quiet = [[30, 31, 29, 30]] * 4
    slow = [[30, 31, 80, 30], [29, 30, 82, 31], [30, 30, 79, 30], [31, 29, 81, 30]]
    state, found = judge([window(2, quiet), window(6, slow), window(10, slow), window(14, slow)])
    assert [(f.rank, f.since_step, f.named_at_step) for f in found] == [(2, 6, 13)]
    assert found[0].peers == (0, 1, 3)
    assert abs(found[0].compute_s - 80.5 * MS) < 1e-9  # median of 80, 82, 79, 81
    assert abs(found[0].peers_compute_s - 30 * MS) < 1e-9
    assert state.checks == 16
    line = describe(found[0], ["a", "b", "node7", "d"])
    assert line.startswith("rank 2 on host node7 is a straggler since step 6: 80.5 ms")


def test_one_slow_window_or_slowness_in_some_steps_is_not_a_straggler() -> None:
    quiet = [[30, 31, 29, 30]] * 4
    spike = [[30, 31, 90, 30]] * 4
    some_steps = [[30, 31, 90, 30], [30, 31, 29, 30]] * 2  # descheduled in half its steps
    _, found = judge([window(2, quiet), window(6, spike), window(10, quiet), window(14, some_steps)] * 2)
    assert found == []


def test_below_half_of_the_peers_compute_is_not_a_straggler() -> None:
    # 40 ms against 30: 10 ms, a third of the peers' compute, under the 50% threshold
    _, found = judge([window(2 + 4 * i, [[30, 30, 40, 30]] * 4) for i in range(4)])
    assert found == []
    _, found = judge([window(2 + 4 * i, [[30, 30, 46, 30]] * 4) for i in range(4)])
    assert [f.rank for f in found] == [2]


def test_a_noisy_rank_needs_a_larger_departure() -> None:
    # rank 2's past excesses over its peers: 0, 10, 0, 10 ... ms: noise 1.4826 x 5 ms, x6 = 44.5 ms
    noisy = [window(2 + 4 * i, [[30, 30, 30 + 10 * (i % 2), 30]] * 4) for i in range(8)]
    _, found = judge([*noisy, *[window(34 + 4 * i, [[30, 30, 70, 30]] * 4) for i in range(3)]])
    assert found == []  # 40 ms > 50% of 30 ms, but under 6 noise
    _, found = judge([*noisy, *[window(34 + 4 * i, [[30, 30, 80, 30]] * 4) for i in range(3)]])
    assert [f.rank for f in found] == [2]


def test_by_default_60_percent_slower_in_every_step_of_3_windows_of_3_steps() -> None:
    quiet = [[30, 30, 30, 30]] * 3
    slow = [[30, 49, 30, 30]] * 3  # 19 ms: above 60% of 30 ms (18 ms)
    windows = [window(0, quiet), *[window(3 * i, slow) for i in range(1, 5)]]
    _, found = judge(windows, rules=DetectorSettings())
    assert [(f.rank, f.since_step, f.named_at_step) for f in found] == [(1, 3, 11)]
    barely = [[30, 47, 30, 30]] * 3  # 17 ms
    _, found = judge([window(3 * i, barely) for i in range(5)], rules=DetectorSettings())
    assert found == []


def test_ranks_alone_in_their_stage_are_not_judged() -> None:
    state, found = judge([window(2, [[30, 90]] * 4)] * 3, peer_groups([0, 1]))
    assert found == [] and state.checks == 0


def test_stages_are_judged_apart() -> None:
    # stage 1 (ranks 2, 3) computes twice as long as stage 0: no straggler; rank 3 then slows
    groups = peer_groups([0, 0, 1, 1])
    _, found = judge([window(2 + 4 * i, [[30, 30, 60, 60]] * 4) for i in range(3)], groups)
    assert found == []
    _, found = judge([window(2 + 4 * i, [[30, 30, 60, 100]] * 4) for i in range(3)], groups)
    assert [f.rank for f in found] == [3]


noisy_ms = st.floats(min_value=0.85, max_value=1.15)


@settings(max_examples=50, deadline=None)
@given(
    base_ms=st.floats(min_value=5.0, max_value=500.0),
    factors=st.lists(st.lists(noisy_ms, min_size=4, max_size=4), min_size=40, max_size=40),
)
def test_ranks_within_15_percent_of_each_other_are_never_named(base_ms: float, factors: list[list[float]]) -> None:
    # at most 1.15 b - 0.85 b = 0.3 b above the peers' median, under half of it (>= 0.425 b)
    windows = [window(4 * i, [[base_ms * f for f in step] for step in factors[4 * i : 4 * i + 4]]) for i in range(10)]
    _, found = judge(windows)
    assert found == []


@settings(max_examples=50, deadline=None)
@given(
    base_ms=st.floats(min_value=5.0, max_value=500.0),
    slow=st.integers(min_value=0, max_value=3),
    factors=st.lists(
        st.lists(st.floats(min_value=0.95, max_value=1.05), min_size=4, max_size=4), min_size=40, max_size=40
    ),
)
def test_a_rank_three_times_slower_is_named_after_two_windows(
    base_ms: float, slow: int, factors: list[list[float]]
) -> None:
    # windows 0-5 quiet within 5% (noise at most 1.4826 x 0.1 b, x6 = 0.89 b); then `slow` computes
    # three times as long: at least 2.85 b - 1.05 b = 1.8 b above its peers
    steps = [
        [base_ms * f * (3 if r == slow and i >= 24 else 1) for r, f in enumerate(step)]
        for i, step in enumerate(factors)
    ]
    _, found = judge([window(4 * i, steps[4 * i : 4 * i + 4]) for i in range(10)])
    assert [(f.rank, f.since_step, f.named_at_step) for f in found] == [(slow, 24, 31)]


def test_the_clock_sums_collectives_once_and_puts_them_back() -> None:
    clock = CollectiveClock()
    outer = clock._timed(lambda: (time.sleep(0.02), inner()))
    inner = clock._timed(lambda: time.sleep(0.01))
    outer()
    assert 0.03 <= clock.inside_s < 0.06  # the inner call is inside the outer one: counted once
    original = dist.all_reduce
    with clock.running():
        assert dist.all_reduce is not original
        assert dist.all_reduce.__wrapped__ is original  # type: ignore[attr-defined]
    assert dist.all_reduce is original


def _report(**fields: object) -> RunReport:
    layout = Layout(data_parallel_degree=4, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    memory = RankMemory(rank=0, stage=0, peak_bytes=1, predicted_bytes=1.0, method="MemTracker")
    return RunReport(
        created=datetime(2026, 1, 1, tzinfo=UTC),
        plan_sha256="0" * 64,
        model="tiny-gpt",
        layout=layout,
        world_size=4,
        backend="gloo",
        device="cpu",
        torch_version="2.13",
        hosts=("a",),
        precision="fp32",
        optimizer="adamw",
        steps=2,
        warmup_steps=1,
        step_times_s=(0.2, 0.1),
        losses=(7.0, 6.9),
        measured_step_time_s=0.1,
        predicted_step_time_s=0.1,
        measured_tokens_per_s=1.0,
        predicted_tokens_per_s=1.0,
        memory=(memory,),
        **fields,
    )


def test_a_version_3_run_report_still_reads() -> None:
    report = _report()
    assert report.schema_version == 5
    old = json.loads(report.model_dump_json())
    for key in ("slow_links", "link_checks"):
        del old[key]
    read = RunReport.model_validate({**old, "schema_version": 3})
    assert read.slow_links == () and read.link_checks == 0


def test_a_version_2_run_report_still_reads() -> None:
    report = _report()
    old = json.loads(report.model_dump_json())
    for key in ("stragglers", "timing_windows", "straggler_checks", "stopped_by_fault", "slow_links", "link_checks"):
        del old[key]
    read = RunReport.model_validate({**old, "schema_version": 2})
    assert read.stragglers == () and read.straggler_checks == 0 and not read.stopped_by_fault


def test_the_run_summary_names_the_straggler() -> None:
    straggler = Straggler(
        rank=2,
        host="node7",
        since_step=6,
        named_at_step=13,
        compute_s=0.08,
        peers=(0, 1, 3),
        peers_compute_s=0.03,
        peers_wait_s=0.05,
        message="",
    )
    lines = run_summary(_report(stragglers=(straggler,), stopped_by_fault=True)).splitlines()
    assert lines[-1] == (
        "  straggler   rank 2 on host node7 since step 6: 80.0 ms a step outside collectives, its peers 30.0 ms"
        " (run stopped)"
    )
    assert not any("straggler" in line for line in run_summary(_report()).splitlines())


def test_the_run_summary_names_the_slow_link() -> None:
    link = SlowLink(
        ranks=(0, 1),
        hosts=("a", "b"),
        group=(0, 1),
        axis="tp",
        since_step=3,
        named_at_step=11,
        wait_s=0.038,
        siblings=((2, 3),),
        siblings_wait_s=0.004,
        message="",
    )
    lines = run_summary(_report(slow_links=(link,), stopped_by_fault=True)).splitlines()
    assert lines[-1] == (
        "  slow link   ranks 0 (a) and 1 (b) since step 3: 38.0 ms a step in the collectives of its tp group, "
        "its siblings 4.0 ms (run stopped)"
    )


def test_the_clock_times_a_real_collective(tmp_path: Path) -> None:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        clock = CollectiveClock()
        with clock.running():
            dist.all_reduce(torch.ones(4))
            dist.barrier()
        assert clock.inside_s > 0
        timed = clock.inside_s
        dist.all_reduce(torch.ones(4))  # outside the block: not timed
        assert clock.inside_s == timed
    finally:
        dist.destroy_process_group()
