"""Time of the device-mapping refiner on clusters of 128, 1,024 and 4,096 DGX A100 nodes (8
devices each) whose node bandwidth matrices are random but seeded (uniform 5-25 GB/s, symmetric,
5 us latency): one greedy node chain (``device_mapping.greedy_node_chain``), and the whole refiner
(its ``MAX_STARTS`` chains and the Evaluator pricing each order) on a realistic candidate, Llama 3
70B at tp8 pp4 with ZeRO-1, full recompute and sequence parallelism, data parallel over the rest,
16 micro-batches of 1 sequence of 4,096 tokens per replica. Building the matrix (pydantic
validating n x n floats, then its arrays) is timed apart: a profile is loaded once per search.
Then the intra-node refiner (``intra_node_mapping``) on the node-ordered plan, every node's local
devices at 150 GB/s but the pair 0-1 at 5 GB/s (priced over links: the preset's intra-node
curves are dropped), which the identity's tp8 ring crosses.

Measured on a shared 2-core machine (under nice): node-order refiner 0.07 s at 128 nodes, 0.52 s
at 1,024 and 2.4 s at 4,096 (8 evaluations each); the intra-node refiner 0.08 s, 0.11 s and
0.49 s (one evaluation: the tp8 ring that avoids the slow pair; step 62.0 s -> 10.3 s at 128
nodes).

Run: python benchmarks/mapping_speed.py [nodes ...]
"""

import sys
import time
from dataclasses import dataclass

import numpy as np

from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.schemas import Layout, Recompute, TrainingSpec, ZeroStage
from planner.schemas.cluster import LinkMatrix
from planner.schemas.settings import Budget
from planner.search_engine.device_mapping import MAX_NODES, DeviceMappingRefiner, greedy_node_chain
from planner.search_engine.evaluate import Evaluator
from planner.search_engine.intra_node_mapping import IntraNodeMappingRefiner
from planner.search_engine.strategy import Candidate

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


def slow_pair_links() -> LinkMatrix:
    """A node's devices at 150 GB/s to each other but local devices 0 and 1, at 5 GB/s."""
    bandwidth = np.full((DEVICES_PER_NODE, DEVICES_PER_NODE), 150e9)
    np.fill_diagonal(bandwidth, 0.0)
    bandwidth[0, 1] = bandwidth[1, 0] = 5e9
    return LinkMatrix(
        size=DEVICES_PER_NODE,
        bandwidth_bytes_per_s=tuple(map(tuple, bandwidth.tolist())),
        latency_s=tuple((2e-6,) * DEVICES_PER_NODE for _ in range(DEVICES_PER_NODE)),
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
    intra_s: float
    """The intra-node refiner after the node order, every node with one slow local pair."""
    intra_evaluations: int
    intra_before_step_s: float
    intra_step_s: float


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
    slow_pair = cluster.model_copy(update={"intra_node_links": slow_pair_links(), "collectives": ()})
    evaluate_slow = Evaluator(load_model("llama3-70b"), training, slow_pair)
    ordered = Candidate(mapped.layout, evaluate_slow(mapped.layout))
    before = evaluate_slow.evaluations
    start = time.perf_counter()
    placed = IntraNodeMappingRefiner().refine(ordered, evaluate_slow, Budget(), seed=0)
    intra_s = time.perf_counter() - start
    return Timing(
        nodes=nodes,
        build_s=build_s,
        chain_s=chain_s,
        refine_s=refine_s,
        evaluations=evaluate.evaluations - before,
        identity_step_s=candidate.estimate.step_time_s,
        mapped_step_s=mapped.estimate.step_time_s,
        intra_s=intra_s,
        intra_evaluations=evaluate_slow.evaluations - before,
        intra_before_step_s=ordered.estimate.step_time_s,
        intra_step_s=placed.estimate.step_time_s,
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
            f"step {t.identity_step_s:.3f} s -> {t.mapped_step_s:.3f} s; with a slow local pair, intra-node "
            f"refiner {t.intra_s:.2f} s ({t.intra_evaluations} evaluations), "
            f"step {t.intra_before_step_s:.3f} s -> {t.intra_step_s:.3f} s"
        )


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [128, 1024, 4096])
