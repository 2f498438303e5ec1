"""What communication costs when it runs behind compute: overlap is not free.

A collective overlapped with compute shares the device with it (NCCL's kernels take SMs and
memory bandwidth from the GEMMs beside them), so the compute it overlaps runs slower. Lee et al.
2025 ("Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
Learning", arXiv 2507.03114) measured GPT and LLaMA training steps on 4 A100s, H100s, MI250s
and MI210s: compute overlapped with communication runs on average 18.9% slower than alone (at
most 40%), and running the two one after the other is still 10.2% slower than overlapping them.
``OVERLAP_COMPUTE_SLOWDOWN`` is that average, one figure for every GPU (no per-device
measurement is in a profile yet).

Model: a window of W seconds of compute, with C seconds of communication to hide in it. While the
communication runs, compute progresses at 1 / (1 + sigma) of its rate. If the communication ends
first, the compute left runs alone: the window takes C + (W - C / (1 + sigma)) = W + C sigma /
(1 + sigma); else the communication outlasts the compute: C. So the communication adds
``max(C - W, C sigma / (1 + sigma))`` to the window: at least sigma / (1 + sigma) of it (15.9%
at the published average) however large the window, all of what the window cannot hold beyond.
The communication's own time is taken as measured alone (the profile's records).
Units: seconds.
"""

from typing import Final

OVERLAP_COMPUTE_SLOWDOWN: Final = 0.189
"""Compute's slowdown while a collective runs beside it (Lee et al. 2025, the mean over their
GPUs and models): a fraction of its time alone."""


def overlapped_comm_cost_s(comm_s: float, window_s: float, slowdown: float = OVERLAP_COMPUTE_SLOWDOWN) -> float:
    """Seconds that ``comm_s`` of communication adds to a ``window_s`` of compute it runs behind
    (module docstring): ``max(comm - window, comm * slowdown / (1 + slowdown))``, 0 without
    communication.

    Args:
        comm_s: the communication, timed alone.
        window_s: the compute it overlaps, timed alone.
        slowdown: compute's slowdown while the communication runs (a fraction).
    """
    if comm_s <= 0.0:
        return 0.0
    return max(comm_s - window_s, comm_s * slowdown / (1.0 + slowdown))
