"""The device-mapping refiner's predicted gain on Pipette's measured node bandwidth matrices.

Pipette (Yim et al., DATE 2024) maps a 3D-parallel layout onto nodes by measured link speeds.
Its repository publishes two mpiGraph runs over 16 A100 nodes (``tests/fixtures/pipette``, read
by ``pipette_matrices``), each with a Recv and a Send table: four node matrices. On each, a
cluster of 16 DGX A100 nodes (the one A100 preset: 8 GPUs and 8 HDR rails a node, as Pipette's
high-end cluster; its GPU memory is not stated) takes the matrix as its node links, and the
planner searches (exhaustive, with the default refiners: the layer split, then the device
mapping) the model Pipette's published run script trains,
``Megatron-LM-2.5/script/date_testid_a100_a_merge_64gpu_after_date_testid1_a_submit.sub``:
"GPT8.1B", 64 layers, hidden 3072, 24 heads, sequence 1024, global batch 128, on Megatron-LM 2.5
(a GPT of LayerNorm, biases, GELU, learned positions, tied embeddings, dropout 0.1; the GPT-2
vocabulary of 50,257 its script ships; attention as Megatron-LM 2.5 ran it, unfused). Its script
trains in fp32; Megatron's mixed precision is fp16 (``--dtype``).

For each of the top plans: its step time as mapped (the plan) and with the identity device map
(the same layout, ``replace(layout, device_map=IDENTITY)``, priced by the Evaluator), and the
gain. And the search's best against a search without the mapping refiner (the layer split
alone), which is what the mapping gains the user.

Measured (2026-11-25): in fp16 the best plan on every matrix is dp64 tp2 with ZeRO-2, whose
gradient rings span all 16 nodes. In identity order that ring crosses a matrix's slowest links
(17.1-17.8 GB/s); the refiner's node order keeps it at 19.5-19.9 GB/s, and the step falls 4.1-6.5%
(0.4193-0.4268 s -> 0.3989-0.4021 s); against the best plan of a search without the refiner, 3.4-5.3%.
The preset's uniform 24 GB/s rails give 0.3758 s. In fp32 (A100's 19.5 TFLOP/s without tensor
cores) the step is 3.9 s of compute and the mapping gains 0.14-0.23%.

Run: python benchmarks/pipette_mapping.py [--dtype fp16|fp32] [--top N]
"""

import argparse
import time
from dataclasses import dataclass, replace

from pipette_matrices import RUNS, Table, measured_cluster, read_run
from sc21 import megatron_gpt

from planner.files.clusters import load_cluster
from planner.schemas import (
    AttentionKernel,
    ClusterProfile,
    DType,
    Layout,
    ModelSpec,
    TrainingSpec,
)
from planner.schemas.device_map import IDENTITY
from planner.schemas.settings import SearchSettings
from planner.search_engine import StrategyName, make_strategy
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.layer_split import LayerSplitRefiner
from planner.search_engine.runner import DEFAULT_REFINERS, run_search

CLUSTER = "dgx-a100-80g:16"
SEQ_LEN = 1024
GLOBAL_BATCH = 128
GPT2_VOCAB = 50257


def pipette_gpt() -> ModelSpec:
    """Pipette's "GPT8.1B" as Megatron-LM 2.5 builds it."""
    return megatron_gpt("gpt-8.1b-pipette", 3072, 64, 24, GPT2_VOCAB, SEQ_LEN)


def pipette_training(dtype: DType) -> TrainingSpec:
    """Global batch 128 of 1,024 tokens; Megatron-LM 2.5 materialized attention scores and ran
    its pipeline sends blocking."""
    return TrainingSpec(
        global_batch_size=GLOBAL_BATCH,
        seq_len=SEQ_LEN,
        dtype=dtype,
        attention_kernel=AttentionKernel.EAGER,
        pp_comm_overlap=False,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanGain:
    """One top plan: its layout, step time as mapped and under the identity device map."""

    layout: str
    mapped: bool
    mapped_step_s: float
    identity_step_s: float

    @property
    def gain_pct(self) -> float:
        """How much faster the mapped step is than the identity one, in % of the identity's."""
        return 100 * (self.identity_step_s - self.mapped_step_s) / self.identity_step_s


@dataclass(frozen=True, slots=True, kw_only=True)
class MatrixResult:
    """The searches on one node matrix."""

    label: str
    plans: tuple[PlanGain, ...]
    best_step_s: float
    """The search's best, with the mapping refiner."""
    best_unmapped_step_s: float
    """The best of a search with the layer split alone (every plan on the identity map)."""
    search_s: float
    identity_ring_bytes_per_s: float
    """The slowest link of the ring through the 16 nodes in identity order (0, 1, ..., 15, 0)."""
    mapped_ring_bytes_per_s: float
    """The slowest link of the ring through the nodes in the best plan's order."""

    @property
    def search_gain_pct(self) -> float:
        """How much faster the best plan is than the best without the mapping refiner, in %."""
        return 100 * (self.best_unmapped_step_s - self.best_step_s) / self.best_unmapped_step_s


def node_order(layout: Layout, devices_per_node: int) -> tuple[int, ...]:
    """The node each block of ``devices_per_node`` consecutive ranks runs on."""
    devices = layout.device_map.devices or tuple(range(layout.world_size))
    return tuple(d // devices_per_node for d in devices[::devices_per_node])


def ring_bottleneck_bytes_per_s(cluster: ClusterProfile, order: tuple[int, ...]) -> float:
    """The slowest [src][dst] link of the ring through ``order`` (the last node back to the first),
    which bounds a data-parallel ring spanning those nodes."""
    return cluster.inter_node_links.ring_slowest(order).bandwidth_bytes_per_s


def measure(label: str, cluster: ClusterProfile, model: ModelSpec, training: TrainingSpec, top: int) -> MatrixResult:
    """Search ``cluster`` with and without the mapping refiner; price each top plan's identity map."""
    start = time.perf_counter()
    outcome = run_search(model, training, cluster, make_strategy(StrategyName.EXHAUSTIVE), SearchSettings(top_k=top))
    search_s = time.perf_counter() - start
    unmapped = run_search(
        model,
        training,
        cluster,
        make_strategy(StrategyName.EXHAUSTIVE),
        SearchSettings(top_k=1),
        refiners=(LayerSplitRefiner(),),
    )
    evaluate = Evaluator(model, training, cluster)
    plans = tuple(
        PlanGain(
            layout=c.layout.describe(),
            mapped=not c.layout.device_map.is_identity,
            mapped_step_s=c.estimate.step_time_s,
            identity_step_s=evaluate(replace(c.layout, device_map=IDENTITY)).step_time_s,
        )
        for c in outcome.ranked
    )
    best = outcome.ranked[0]
    return MatrixResult(
        label=label,
        plans=plans,
        best_step_s=best.estimate.step_time_s,
        best_unmapped_step_s=unmapped.ranked[0].estimate.step_time_s,
        search_s=search_s,
        identity_ring_bytes_per_s=ring_bottleneck_bytes_per_s(cluster, tuple(range(cluster.num_nodes))),
        mapped_ring_bytes_per_s=ring_bottleneck_bytes_per_s(cluster, node_order(best.layout, cluster.devices_per_node)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=("fp16", "fp32"), default="fp16")
    parser.add_argument("--top", type=int, default=5, help="top plans to report per matrix")
    args = parser.parse_args()
    assert "device-mapping" in {r.name for r in DEFAULT_REFINERS}
    model, training = pipette_gpt(), pipette_training(DType(args.dtype))
    base = load_cluster(CLUSTER)
    print(f"{model.name} on {CLUSTER}, {args.dtype}, global batch {GLOBAL_BATCH} x {SEQ_LEN} tokens")
    uniform = run_search(model, training, base, make_strategy(StrategyName.EXHAUSTIVE), SearchSettings(top_k=1)).ranked[
        0
    ]
    rail = base.inter_node_links.uniform
    assert rail is not None
    print(
        f"preset's uniform links ({rail.bandwidth_bytes_per_s / 1e9:.1f} GB/s a rail): best "
        f"{uniform.estimate.step_time_s:.4f} s, {uniform.layout.describe()}"
    )
    clusters = [(f"{run}/{table}", measured_cluster(base, read_run(run), table)) for run in RUNS for table in Table]
    for label, cluster in clusters:
        r = measure(label, cluster, model, training, args.top)
        print(
            f"\n{label}: best {r.best_step_s:.4f} s, best without mapping {r.best_unmapped_step_s:.4f} s, "
            f"gain {r.search_gain_pct:.2f}% (search {r.search_s:.0f} s); slowest link of the node ring "
            f"{r.identity_ring_bytes_per_s / 1e9:.2f} GB/s in identity order, "
            f"{r.mapped_ring_bytes_per_s / 1e9:.2f} GB/s in the best plan's"
        )
        for p in r.plans:
            print(
                f"  {p.layout}: identity {p.identity_step_s:.4f} s -> {'mapped' if p.mapped else 'kept  '} "
                f"{p.mapped_step_s:.4f} s ({p.gain_pct:.2f}%)"
            )


if __name__ == "__main__":
    main()
