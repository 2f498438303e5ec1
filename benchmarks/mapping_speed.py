"""Time of the device-mapping refiner on clusters of 128, 1,024 and 4,096 DGX A100 nodes (8
devices each) whose node bandwidth matrices are random but seeded (uniform 5-25 GB/s, symmetric,
5 us latency): one greedy node chain (``device_mapping.greedy_node_chain``), and the whole refiner
(its ``MAX_STARTS`` chains and the Evaluator pricing each order) on a realistic candidate, Llama 3
70B at tp8 pp4 with ZeRO-1, full recompute and sequence parallelism, data parallel over the rest,
16 micro-batches of 1 sequence of 4,096 tokens per replica. Building the matrix (pydantic
validating n x n floats, then its arrays) is timed apart: a profile is loaded once per search.

Run: python benchmarks/mapping_speed.py [nodes ...]
"""

import sys
import time
from dataclasses import dataclass

import numpy as np

from planner.inputs import load_cluster, load_model
from planner.schemas import Layout, Recompute, TrainingSpec, ZeroStage
from planner.schemas.cluster import LinkMatrix
from planner.search_engine.device_mapping import MAX_NODES, DeviceMappingRefiner, greedy_node_chain
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.strategy import Budget, Candidate

DEVICES_PER_NODE, TP, PP, MICRO_BATCHES, SEQ_LEN = 8, 8, 4, 16, 4096


def random_links(nodes: int, *, seed: int = 0) -> LinkMatrix:
    """A symmetric node matrix with seeded bandwidths in 5-25 GB/s and 5 us latency."""
    rng = np.random.default_rng(seed)
    bandwidth = rng.uniform(5e9, 25e9, (nodes, nodes))
    bandwidth = (bandwidth + bandwidth.T) / 2
    return LinkMatrix(
        size=nodes,
        bandwidth_bytes_per_s=tuple(map(tuple, bandwidth.tolist())),
        latency_s=tuple((5e-6,) * nodes for _ in range(nodes)),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """One cluster size's measurements."""

    nodes: int
    build_s: float
    """Building the node matrix and its arrays."""
    chain_s: float
    """One greedy chain from node 0."""
    refine_s: float
    """The whole refiner on the candidate."""
    evaluations: int
    """Layouts the refiner priced."""
    identity_step_s: float
    mapped_step_s: float


def measure(nodes: int) -> Timing:
    """Build the cluster, price the candidate under the identity, then time a chain and the refiner."""
    start = time.perf_counter()
    links = random_links(nodes)
    links.arrays()
    build_s = time.perf_counter() - start
    cluster = load_cluster(f"dgx-a100-80g:{nodes}").model_copy(update={"inter_node_links": links})
    dp = nodes * DEVICES_PER_NODE // (TP * PP)
    training = TrainingSpec(global_batch_size=dp * MICRO_BATCHES, seq_len=SEQ_LEN)
    layout = Layout(
        data_parallel_degree=dp,
        tensor_parallel_degree=TP,
        pipeline_parallel_degree=PP,
        micro_batch_size=1,
        zero_stage=ZeroStage.OPTIMIZER,
        recompute=Recompute.FULL,
        sequence_parallel=True,
    )
    evaluate = Evaluator(load_model("llama3-70b"), training, cluster)
    candidate = Candidate(layout, evaluate(layout))
    start = time.perf_counter()
    greedy_node_chain(links, 0)
    chain_s = time.perf_counter() - start
    before = evaluate.evaluations
    start = time.perf_counter()
    mapped = DeviceMappingRefiner().refine(candidate, evaluate, Budget(), seed=0)
    refine_s = time.perf_counter() - start
    return Timing(
        nodes=nodes,
        build_s=build_s,
        chain_s=chain_s,
        refine_s=refine_s,
        evaluations=evaluate.evaluations - before,
        identity_step_s=candidate.estimate.step_time_s,
        mapped_step_s=mapped.estimate.step_time_s,
    )


def main(sizes: list[int]) -> None:
    print(
        f"refiner maps up to MAX_NODES={MAX_NODES} nodes; llama3-70b tp{TP} pp{PP}, {DEVICES_PER_NODE} devices a node"
    )
    for nodes in sizes:
        t = measure(nodes)
        print(
            f"{t.nodes:>5} nodes: matrix {t.build_s:.2f} s, one chain {t.chain_s:.4f} s, "
            f"refiner {t.refine_s:.2f} s ({t.evaluations} evaluations), "
            f"step {t.identity_step_s:.3f} s -> {t.mapped_step_s:.3f} s"
        )


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [128, 1024, 4096])
