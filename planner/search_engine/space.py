"""The search space: every layout of a model on a cluster that the cost models can price.

Degrees: every factorization world = d x t x p with t dividing the query and key/value heads
and the MLP width and at most one node's devices (tensor parallelism across nodes is never
worth its traffic; raise ``max_tensor_parallel`` to include it), and p at most the layer count.
Micro-batch sizes divide the per-replica batch; a pipeline gets at least p micro-batches.
Schedules: 1F1B, and interleaved with every v whose p x v chunks each get a layer and whose
micro-batch count p divides. Recompute and
sequence parallelism as allowed. ZeRO stages that can differ (``zero_stages_for``): over one
replica nothing is sharded, so only the lowest stage; under a pipeline ZeRO 2-3 hold what ZeRO-1
holds and take longer (cost_models.pipeline.defers_gradient_reduction), so none above ZeRO-1. The
layer split starts even; the CP-SAT split refines it (planner.search_engine.layer_split).
"""

from collections.abc import Iterator
from dataclasses import dataclass

from planner.schemas import Layout, ModelSpec, Recompute, Schedule, TrainingSpec, ZeroStage


def divisors(n: int) -> list[int]:
    """Divisors of n in increasing order."""
    small = [i for i in range(1, int(n**0.5) + 1) if n % i == 0]
    return sorted({*small, *(n // i for i in small)})


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """The choices a search may make for one model, training setup and cluster size."""

    model: ModelSpec
    training: TrainingSpec
    world_size: int
    devices_per_node: int
    zero_stages: tuple[ZeroStage, ...] = tuple(ZeroStage)
    recompute: tuple[Recompute, ...] = tuple(Recompute)
    """In increasing order of time (and decreasing memory): strategies rely on it."""
    schedules: tuple[Schedule, ...] = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)
    sequence_parallel: tuple[bool, ...] = (True, False)
    max_tensor_parallel: int | None = None
    """Largest tensor-parallel degree; None means one node's devices."""
    max_virtual_stages: int = 8
    """Largest number of model chunks per pipeline rank for the interleaved schedule."""
    max_micro_batch_size: int = 64

    def degrees(self) -> list[tuple[int, int, int]]:
        """(dp, tp, pp) triples whose product is the world size."""
        m = self.model
        t_max = self.max_tensor_parallel or self.devices_per_node
        out = []
        for t in divisors(self.world_size):
            if t > t_max or m.num_attention_heads % t or m.kv_heads % t or m.ffn_size % t:
                continue
            for p in divisors(self.world_size // t):
                if p <= m.num_hidden_layers:
                    out.append((self.world_size // (t * p), t, p))
        return out

    def micro_batch_sizes(self, dp: int) -> list[int]:
        """Micro-batch sizes that divide the per-replica batch B / dp (none if dp does not divide B)."""
        if self.training.global_batch_size % dp:
            return []
        per_replica = self.training.global_batch_size // dp
        return [b for b in divisors(per_replica) if b <= self.max_micro_batch_size]

    def schedules_for(self, pp: int, micro_batches: int) -> list[tuple[Schedule, int]]:
        """(schedule, virtual stages) pairs valid for pp stages and this many micro-batches."""
        if pp == 1:
            return [(Schedule.ONE_F_ONE_B, 1)]
        if micro_batches < pp:  # most of the pipeline would idle, and torch's schedules refuse it
            return []
        out: list[tuple[Schedule, int]] = []
        if Schedule.ONE_F_ONE_B in self.schedules:
            out.append((Schedule.ONE_F_ONE_B, 1))
        if Schedule.GPIPE in self.schedules:
            out.append((Schedule.GPIPE, 1))
        if Schedule.INTERLEAVED in self.schedules and micro_batches % pp == 0:
            for v in range(2, self.max_virtual_stages + 1):
                if pp * v <= self.model.num_hidden_layers:
                    out.append((Schedule.INTERLEAVED, v))
        return out

    def zero_stages_for(self, dp: int, pp: int) -> tuple[ZeroStage, ...]:
        """The allowed ZeRO stages that give ``dp`` replicas of ``pp`` stages different layouts
        (module docstring); the lowest allowed one where none of them would."""
        if dp == 1:
            return (min(self.zero_stages),)
        if pp > 1:
            return tuple(z for z in self.zero_stages if z <= ZeroStage.OPTIMIZER) or (min(self.zero_stages),)
        return self.zero_stages

    def groups(self) -> Iterator[tuple[Layout, ...]]:
        """Candidates grouped by everything but recompute; each group is in ``recompute`` order.

        Within a group the layouts differ only in recomputation, which adds time and saves memory,
        so the first that fits dominates the rest.
        """
        for dp, tp, pp in self.degrees():
            for b in self.micro_batch_sizes(dp):
                m = self.training.global_batch_size // (dp * b)
                for schedule, v in self.schedules_for(pp, m):
                    for sp in self.sequence_parallel if tp > 1 else (False,):
                        if sp and self.training.seq_len % tp:
                            continue
                        for zero in self.zero_stages_for(dp, pp):
                            yield tuple(
                                Layout(
                                    data_parallel_degree=dp,
                                    tensor_parallel_degree=tp,
                                    pipeline_parallel_degree=pp,
                                    micro_batch_size=b,
                                    zero_stage=zero,
                                    recompute=rc,
                                    sequence_parallel=sp,
                                    schedule=schedule,
                                    virtual_stages=v,
                                )
                                for rc in self.recompute
                            )

    def candidates(self) -> Iterator[Layout]:
        """Every candidate layout (even layer split)."""
        for group in self.groups():
            yield from group

    def size(self) -> int:
        """Number of candidates."""
        return sum(len(g) for g in self.groups())
