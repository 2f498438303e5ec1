"""CPU ranks that share their node's cores: how much faster the step runs than the profiled
times say, because a waiting stage gives its cores to the others. Units: seconds, fractions.
"""

from cost_models.timing import StageTime


def shared_core_factor(times: tuple[StageTime, ...], micro_batches: int, bubble_s: float, core_share: float) -> float:
    """What the stages' critical path (m micro-batches on the slowest stage, plus the bubble)
    takes on shared cores, as a fraction of it: 1 when each rank has its own device.

    Times were measured with every rank busy, at ``core_share`` of a core each
    (``DeviceProfile.core_share`` < 1 where ranks outnumber the node's cores). A stage that
    waits (in the bubble, or for a slower stage) leaves its cores to the others, which run up
    to 1 / ``core_share`` faster. With ideal sharing the node's cores bound the step from below
    by the mean stage's busy time, and no rank beats its own faster path; this takes that bound.
    On a CPU cluster whose ranks share cores, pipelined plans' measured steps lie between this
    bound and the unshared path: nearer the bound when waits are long (few micro-batches), and
    nearer the unshared path with many short slots.

    Args:
        times: every stage's times per micro-batch, as profiled (seconds).
        micro_batches: micro-batches per step on one replica (m).
        bubble_s: the pipeline bubble on the slowest stage (seconds).
        core_share: the share of a core each rank had while profiled, in (0, 1].

    Returns:
        The factor on the critical path's compute and bubble, in (0, 1].
    """
    path_s = micro_batches * max(st.total_s for st in times) + bubble_s
    if core_share >= 1.0 or path_s <= 0:
        return 1.0
    mean_busy_s = micro_batches * sum(st.total_s for st in times) / len(times)
    return min(1.0, max(mean_busy_s, core_share * path_s) / path_s)
