"""How much a profiling run measures: sizes, repeats, shapes and its timeout."""

from dataclasses import dataclass, replace

from planner.schemas import DType, ModelSpec

KIB, MIB = 1024, 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileSettings:
    """Everything that decides what the profiler measures and how long it may wait."""

    timeout_s: float = 60.0
    """A collective or transfer that waits longer than this fails the run (a rank died or hung)."""
    warmup: int = 2
    repeats: int = 5
    latency_bytes: int = 4 * KIB
    bandwidth_bytes: int = 16 * MIB
    collective_bytes: tuple[int, ...] = tuple(4**i * KIB for i in range(1, 9))
    """4 KiB ... 64 MiB."""
    gemm_shapes: tuple[tuple[int, int, int], ...] = (
        (256, 256, 256),
        (512, 512, 512),
        (1024, 1024, 1024),
        (2048, 1024, 1024),
        (1024, 4096, 1024),
        (1024, 1024, 4096),
    )
    gemm_dtypes: tuple[DType, ...] = (DType.FP32, DType.BF16)
    stream_bytes: int = 64 * MIB
    """Size of each operand of the elementwise kernel that measures memory bandwidth."""
    model: ModelSpec | None = None
    layer_micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    """Micro-batch sizes at which the model's own layer is timed (with ``model``)."""
    layer_repeats: int = 7
    """Repeats of each layer timing, quick or not: plans are ranked by these times."""
    min_sample_s: float = 0.02
    """A lockstep timing calls an op back to back until one sample lasts this long (profiler.context)."""
    seq_len: int = 512
    """Sequence length of the model's own layers and GEMM shapes (with ``model``)."""
    model_gemm_shapes: tuple[tuple[int, int, int], ...] = ()
    """The model's own GEMM shapes (m, n, k), given by the caller from the cost model's view of
    the model (cost_models.layer_work.profile_gemm_shapes): the profiler imports no cost model."""
    inject_link_delay: tuple[tuple[int, int, float], ...] = ()
    """Testing aid: each (a, b, seconds) slows every transfer between ranks a and b by ``seconds``
    per ``bandwidth_bytes`` moved."""
    inject_fault: tuple[int, str, str] | None = None
    """Testing aid: (rank, phase, "exit" | "hang") makes that rank die or hang when it starts the phase."""
    simulate_nodes: int | None = None
    """Testing aid: split the ranks into this many pretend nodes (contiguous blocks)."""

    def to_record(self) -> dict[str, str | int | float | bool]:
        """The settings as provenance."""
        return {
            "timeout_s": self.timeout_s,
            "warmup": self.warmup,
            "repeats": self.repeats,
            "latency_bytes": self.latency_bytes,
            "bandwidth_bytes": self.bandwidth_bytes,
            "collective_bytes": ",".join(str(b) for b in self.collective_bytes),
            "gemm_shapes": len(self.gemm_shapes),
            "gemm_dtypes": ",".join(str(d) for d in self.gemm_dtypes),
            "model": self.model.name if self.model else "",
            "seq_len": self.seq_len,
            "layer_micro_batches": ",".join(str(b) for b in self.layer_micro_batches),
            "layer_repeats": self.layer_repeats,
            "min_sample_s": self.min_sample_s,
            "injected_link_delay": ";".join(",".join(str(x) for x in d) for d in self.inject_link_delay),
            "simulated_nodes": self.simulate_nodes or 0,
        }


def quick(settings: ProfileSettings) -> ProfileSettings:
    """Fewer sizes, shapes and repeats: a profile in seconds, with wider spreads."""

    return replace(
        settings,
        warmup=1,
        repeats=3,
        bandwidth_bytes=4 * MIB,
        collective_bytes=(16 * KIB, 1 * MIB, 16 * MIB),
        gemm_shapes=((512, 512, 512), (1024, 1024, 1024)),
        stream_bytes=16 * MIB,
    )
