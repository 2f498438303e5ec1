"""Search wall time for mixture-of-experts models at scale (issue target on a 2-core machine:
mixtral-8x7b and deepseek-v3 on 1,024 H100s, the full space with every expert-parallel degree,
in 3 s each), the candidates evaluated and the plan chosen.

CPU time (this process and the search's worker processes) is printed next to wall time: the
exhaustive search splits the space over the cores (``planner.search_engine.exhaustive``), so on
an idle machine wall time is about CPU time over the cores; on a shared one it is more.

Run: .venv/bin/python benchmarks/search_speed_moe.py
"""

import os
import resource
import sys
import time

from planner import api
from planner.schemas import TrainingSpec
from planner.schemas.settings import SearchSettings

TRAINING = TrainingSpec(global_batch_size=4096, seq_len=4096, stack="megatron-lm")
"""Planned for Megatron-LM, which runs both models (the planner's runtime does not build
DeepSeek-V3's latent attention, so a search for it stops at once)."""
CASES = (
    ("mixtral-8x7b", "dgx-h100:128", TRAINING, 3.0),
    ("deepseek-v3", "dgx-h100:128", TRAINING, 3.0),
)


def _cpu_s() -> float:
    """CPU seconds of this process and of its finished children (the search's workers)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def main() -> int:
    """Print one line per case; exit 1 if any misses its target."""
    missed = 0
    for model, cluster, training, target_s in CASES:
        start, start_cpu = time.perf_counter(), _cpu_s()
        outcome, plans = api.search_outcome(model, cluster, training, SearchSettings(top_k=3))
        wall_s, cpu_s = time.perf_counter() - start, _cpu_s() - start_cpu
        layout, est = plans[0].layout, plans[0].estimate
        print(
            f"{model:>12} on {cluster} (batch {training.global_batch_size}, seq {training.seq_len}): "
            f"{wall_s:5.2f} s wall, {cpu_s:5.2f} s CPU on {len(os.sched_getaffinity(0))} cores "
            f"(target {target_s:.0f} s)  "
            f"{outcome.evaluated:,} evaluated of {outcome.space_size:,}  "
            f"best: dp{layout.data_parallel_degree} tp{layout.tensor_parallel_degree} "
            f"pp{layout.pipeline_parallel_degree} ep{layout.expert_parallel_degree} zero{int(layout.zero_stage)} "
            f"rc-{layout.recompute} mb{layout.micro_batch_size} ({layout.describe()}) "
            f"{est.step_time_s:.2f} s/step, MFU {est.mfu:.1%}",
            flush=True,
        )
        missed += wall_s > target_s
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
