"""How many threads a CPU rank computes with, and the share of a core each thread gets while
every rank of its host computes. The profiler and the runtime both ask here, so a plan runs with
the threads its profile was measured with."""

import os


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_threads_per_rank(local_world_size: int) -> int:
    """Threads of one of ``local_world_size`` ranks on a host: the cores split evenly, at least one."""
    return max(1, usable_cores() // local_world_size)


def core_share(local_world_size: int) -> float:
    """Cores per thread while all ``local_world_size`` ranks compute at once, at most 1: below 1
    the ranks outnumber the cores (4 ranks on 2 cores: 0.5), and a rank runs faster while others
    wait."""
    return min(1.0, usable_cores() / (local_world_size * cpu_threads_per_rank(local_world_size)))
