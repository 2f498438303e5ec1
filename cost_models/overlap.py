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

Where communication can run behind compute at all: on GPUs (NCCL runs on its own streams and
copy engines), not on a CPU, where gloo's collectives run on the cores that compute
(``hides_communication``).

Tensor-parallel communication overlap (``TrainingSpec.tp_comm_overlap``; Megatron-Core's
``--tp-comm-overlap`` with Transformer Engine's userbuffers, torch's async tensor parallelism;
Wang et al. ASPLOS 2023, "Overlap Communication with Dependent Computation via Decomposition"):
under sequence parallelism each all-gather feeding a GEMM and each reduce-scatter of a GEMM's
output is split into t chunks exchanged ring-wise while the GEMM runs on the chunks already
there. A gather's first chunk is the rank's own, so it waits for nothing; a reduce-scatter's last
chunk is reduced after the last GEMM chunk, hidden by none. A layer's collectives come in such
pairs, so 1 / (2 t) of them is exposed (``tensor_parallel_exposed_s``) and the rest runs behind
the layer's GEMMs at the overlap's cost.
Units: seconds.
"""

from typing import Final

from planner.schemas import ClusterProfile, DeviceKind

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


def hides_communication(cluster: ClusterProfile) -> bool:
    """Whether communication can run behind compute. On GPUs it can: NCCL runs on its own
    streams and copy engines. On a CPU it cannot: gloo's collectives run on the cores that
    compute (ZeRO-3's gathers add to a CPU step in full)."""
    return cluster.pricing_device.kind is not DeviceKind.CPU


def tensor_parallel_exposed_s(
    comm_s: float, gemm_s: float, tensor_parallel_degree: int, fused_share: float = 1.0
) -> float:
    """Seconds a layer's ``comm_s`` of tensor-parallel collectives add to it when each is split
    into t chunks behind the ``gemm_s`` of GEMMs it feeds or follows (module docstring): the
    reduce-scatters' last chunks, comm / (2 t), and the cost of the rest behind the GEMMs. Only
    ``fused_share`` of the collectives runs so (``RecipeRun.micro_pipelined_share``: what torch's
    async TP can fuse under a torchao recipe); the rest waits in full."""
    fused_s = fused_share * comm_s
    edge_s = fused_s / (2 * tensor_parallel_degree)
    return comm_s - fused_s + edge_s + overlapped_comm_cost_s(fused_s - edge_s, gemm_s)
