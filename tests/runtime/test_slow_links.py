"""The slow-link detector's judgement (runtime.slow_links) on hand-made timings, the collective
clock's accounting per process group, and the slow link in the run report and its summary."""

import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.device_mesh import init_device_mesh

from planner.cli.testing_aids import parse_step_fault
from planner.schemas.errors import SchemaError
from runtime.collective_clock import CollectiveClock
from runtime.slow_links import (
    GroupWaits,
    LinkFinding,
    LinkSettings,
    LinkState,
    describe_link,
    link_ends,
    observe_links,
    sibling_families,
)
from runtime.stragglers import DetectorSettings, peer_groups

MS = 1e-3
STAGES = (0, 0, 0, 0)
"""tp2 x dp2, one stage: tp groups (0, 1), (2, 3); dp groups (0, 2), (1, 3)."""
TP, DP = ((0, 1), (2, 3)), ((0, 2), (1, 3))
RULES = LinkSettings(windows_to_flag=2)
RANK_RULES = DetectorSettings()


def waits(group_ms: dict[tuple[int, ...], Sequence[Sequence[float]]]) -> tuple[GroupWaits, ...]:
    """Per group, per step, per member, in ms."""
    return tuple(
        GroupWaits(ranks=g, wait_s=tuple(tuple(w * MS for w in step) for step in steps))
        for g, steps in group_ms.items()
    )


def judge(
    windows: Sequence[tuple[Sequence[Sequence[float]], dict[tuple[int, ...], Sequence[Sequence[float]]]]],
    stages: Sequence[int] = STAGES,
    rules: LinkSettings = RULES,
) -> tuple[LinkState, list[LinkFinding]]:
    """Judge windows of (per step, per rank compute in ms; per group waits in ms), 3 steps each from step 0."""
    state, found = LinkState(), []
    for i, (compute_ms, group_ms) in enumerate(windows):
        state, findings = observe_links(
            state,
            first_step=3 * i,
            compute_s=tuple(tuple(c * MS for c in step) for step in compute_ms),
            waits=waits(group_ms),
            stage_of_rank=stages,
            peers=peer_groups(stages),
            settings=rules,
            ranks=RANK_RULES,
        )
        found += findings
    return state, found


LEVEL = [[100.0, 100.0, 100.0, 100.0]] * 3
"""Every rank computes 100 ms in each of 3 steps."""


def quiet(tp_ms: float = 4.0, dp_ms: float = 10.0) -> dict[tuple[int, ...], Sequence[Sequence[float]]]:
    return {**{g: [[tp_ms, tp_ms]] * 3 for g in TP}, **{g: [[dp_ms, dp_ms]] * 3 for g in DP}}


def test_groups_along_one_axis_are_siblings() -> None:
    world = (0, 1, 2, 3)
    assert sibling_families([*TP, *DP, world], STAGES) == (((0, 1), (2, 3)), ((0, 2), (1, 3)))
    # two pipeline stages: the groups of stage 0 and of stage 1 carry different layers' traffic
    assert sibling_families([(0, 1), (2, 3)], (0, 0, 1, 1)) == ()
    assert sibling_families([(0, 2), (1, 3)], (0, 0, 1, 1)) == (((0, 2), (1, 3)),)  # pp groups of 2 replicas
    assert sibling_families([(0, 2), (1, 3)], (0, 1, 0, 1)) == ()  # dp groups of stage 0 and of stage 1


def test_a_slow_tp_group_is_named_as_the_link_between_its_two_ranks() -> None:
    slow = {**quiet(), (0, 1): [[38.0, 40.0], [40.0, 39.0], [41.0, 42.0]]}
    state, found = judge([(LEVEL, quiet()), (LEVEL, slow), (LEVEL, slow), (LEVEL, slow)])
    assert [(f.ranks, f.group, f.since_step, f.named_at_step) for f in found] == [((0, 1), (0, 1), 3, 8)]
    assert found[0].siblings == ((2, 3),)
    assert abs(found[0].wait_s - 39 * MS) < 1e-9  # median of the members' least: 38, 39, 41
    assert abs(found[0].siblings_wait_s - 4 * MS) < 1e-9
    assert state.checks == 16  # 4 groups in 2 families, 4 windows
    line = describe_link(found[0], ["a", "b", "c", "d"], "tp")
    assert line == (
        "slow link between rank 0 (host a) and rank 1 (host b) since step 3: its tp group (ranks 0,1) waits "
        "39.0 ms a step in its collectives against 4.0 ms on its sibling groups"
    )


def test_a_straggling_rank_is_not_a_slow_link() -> None:
    # rank 0 computes 200 ms: its tp partner 1 and dp partner 2 wait ~100 ms for it in each step
    compute = [[200.0, 100.0, 100.0, 100.0]] * 3
    held = {**quiet(), (0, 1): [[4.0, 104.0]] * 3, (0, 2): [[10.0, 110.0]] * 3}
    _, found = judge([(compute, held)] * 4)
    assert found == []
    # the least member wait alone spares it: with rank 0's compute level (a noisy window), still none
    _, found = judge([(LEVEL, held)] * 4)
    assert found == []


def test_a_slow_group_whose_member_also_straggles_is_left_to_the_rank_detector() -> None:
    slow = {**quiet(), (0, 1): [[40.0, 40.0]] * 3}
    _, found = judge([([[200.0, 100.0, 100.0, 100.0]] * 3, slow)] * 4)
    assert found == []


def test_one_slow_step_or_window_is_not_a_slow_link() -> None:
    spike = {**quiet(), (0, 1): [[40.0, 40.0], [4.0, 4.0], [40.0, 40.0]]}  # a quiet step in the window
    window = {**quiet(), (0, 1): [[40.0, 40.0]] * 3}
    _, found = judge([(LEVEL, spike)] * 4 + [(LEVEL, window), (LEVEL, quiet())] * 3)
    assert found == []


def test_an_excess_must_pass_both_the_fraction_and_the_seconds() -> None:
    # dp siblings wait 10 ms: 19 ms is 9 ms over (under 100% of 10 ms); 4.5 ms over tp's 4 is under 5 ms
    small = {**quiet(), (0, 2): [[19.0, 19.0]] * 3, (2, 3): [[8.5, 8.5]] * 3}
    _, found = judge([(LEVEL, small)] * 4)
    assert found == []
    _, found = judge([(LEVEL, {**quiet(), (0, 2): [[21.0, 21.0]] * 3})] * 4)
    assert [f.ranks for f in found] == [(0, 2)]


def test_a_larger_group_is_narrowed_to_the_pair_the_slow_groups_share() -> None:
    # groups of 4 along two axes of a 4 x 4 grid: rows (0..3), (4..7), ...; a link between 0 and 1
    # slows row (0,1,2,3) and the group (0,1,4,5) of another axis
    assert link_ends((0, 1, 2, 3), [(0, 1, 2, 3), (0, 1, 4, 5)]) == (0, 1)
    assert link_ends((0, 1, 2, 3), [(0, 1, 2, 3)]) == (0, 1, 2, 3)  # nothing to intersect: the group
    assert link_ends((0, 1, 2, 3), [(0, 1, 2, 3), (0, 4, 8, 12)]) == (0, 1, 2, 3)  # one shared rank
    finding = LinkFinding(
        ranks=(0, 1, 2, 3),
        group=(0, 1, 2, 3),
        since_step=3,
        named_at_step=8,
        wait_s=0.05,
        siblings=((4, 5, 6, 7),),
        siblings_wait_s=0.01,
    )
    assert describe_link(finding, "abcd").startswith("slow link inside the group of ranks 0 (a), 1 (b), 2 (c), 3 (d)")


@settings(max_examples=50, deadline=None)
@given(
    tp_ms=st.floats(min_value=1.0, max_value=50.0),
    factors=st.lists(st.floats(min_value=0.7, max_value=1.3), min_size=8 * 4 * 3 * 2, max_size=8 * 4 * 3 * 2),
)
def test_groups_within_30_percent_of_each_other_are_never_named(tp_ms: float, factors: list[float]) -> None:
    # a group's least wait is at most 1.3 w, its sibling's at least 0.7 w: 0.6 w over, under 100% of 0.7 w
    draws = iter(factors)
    windows = []
    for _ in range(8):
        groups = {g: [[tp_ms * next(draws), tp_ms * next(draws)] for _ in range(3)] for g in (*TP, *DP)}
        windows.append((LEVEL, groups))
    _, found = judge(windows, rules=LinkSettings(windows_to_flag=1, min_excess_s=0.0))
    assert found == []


def test_the_clock_sums_each_groups_collectives(tmp_path: Path) -> None:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        clock = CollectiveClock()
        alone = dist.new_group([0])
        mesh = init_device_mesh("cpu", (1,))
        with clock.running():
            dist.all_reduce(torch.ones(4))
            dist.all_reduce(torch.ones(4), group=alone)
            dist.barrier(alone)  # its group passed positionally
            summed = funcol.all_reduce(torch.ones(4), "sum", group=(mesh, 0))  # as DTensor calls it
            assert not isinstance(summed, funcol.AsyncCollectiveTensor)  # waited for inside the clock
        assert funcol.all_reduce.__name__ == "all_reduce" and not hasattr(funcol.all_reduce, "__wrapped__")
        assert set(clock._keys) == {None, alone, (mesh, 0)}  # each group object looked up (once)
        assert set(clock.inside_by_group_s) == {(0,)}  # one rank: the world's key is the group's
        assert abs(clock.inside_by_group_s[(0,)] - clock.inside_s) < 1e-9 and clock.inside_s > 0
    finally:
        dist.destroy_process_group()


def test_the_injected_slow_link_slows_the_groups_holding_both_ends_but_the_world() -> None:
    clock = CollectiveClock()
    clock._keys[None] = (0, 1, 2, 3)  # the default group of 4 ranks, as looked up
    assert clock._delay_s((0, 1)) == 0.0  # nothing injected
    clock.injected_delay = (frozenset({0, 1}), 0.01)
    assert clock._delay_s((0, 1)) == 0.01
    assert clock._delay_s((0, 2)) == 0.0 and clock._delay_s((0, 1, 2, 3)) == 0.0


def test_the_clock_without_a_process_group_counts_the_total_only() -> None:
    clock = CollectiveClock()
    clock._timed(lambda: time.sleep(0.01))()
    assert clock.inside_s >= 0.01 and clock.inside_by_group_s == {}


def test_the_slow_link_fault_names_its_other_end() -> None:
    assert parse_step_fault("0,2,slow-link,1") == (0, 2, "slow-link", 1)
    assert parse_step_fault("3,2,slow") == (3, 2, "slow", 3)
    for bad in ("0,2,slow-link", "0,2,slow-link,0", "0,2,slow,1", "0,2,slow-link,x"):
        try:
            parse_step_fault(bad)
        except SchemaError as e:
            assert "slow-link,PEER" in str(e)
        else:
            raise AssertionError(bad)
