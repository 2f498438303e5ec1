"""Expert parallelism: moving tokens to their experts and back, and the load of the busiest rank.

An MoE layer sends each micro-batch's routed (token, expert) pairs, k per token, to the ranks
holding their experts with an all-to-all and back with another, forward and again backward
(GShard, Lepikhin et al. 2020; Megatron-LM's token dispatcher); full recomputation repeats the
forward's two. A layer runs as fast as its busiest rank, so what counts is the hottest rank's
load, not the average (``ExpertLoad``).

Where the pairs go (per MoE layer, expert-parallel group of ep ranks, P pairs of its own on each
rank, expert e receiving a share n_e of all pairs):
- with a routing trace (``schemas.routing.RoutingStats``) n_e is the trace's share of expert e;
  without one, routing is assumed uniform: n_e = 1/E;
- dropless by default; under a capacity factor c (``TrainingSpec.moe_capacity_factor``) each
  rank sends expert e at most c/E of its pairs and drops the rest, n_e -> min(n_e, c/E), as
  Megatron-LM drops per rank before dispatch; padded to capacity every expert takes c/E;
- each rank's own tokens route like the trace's, whatever the rank (its tokens are a sample of
  the data);
- the layout's placement (``ExpertPlacement``; contiguous blocks without one) hosts expert e on
  c_e ranks. A rank keeps the pairs of an expert it hosts; the other ranks split theirs evenly
  over its c_e copies (as ``runtime.expert_parallel.ExpertExchange`` does).
Then rank q computes L_q = ep P sum_{e on q} n_e / c_e pairs (the mean rank P, dropless), keeps
K_q = P sum_{e on q} n_e of its own, sends P N - K_q to other ranks (N = sum_e n_e, 1 dropless)
and receives L_q - K_q from them. A balanced dropless layer has L_q = P and sends and receives
P (ep - 1)/ep.

The hottest rank's expert GEMMs scale with its L_q (linear in tokens, an approximation for
small GEMMs); the all-to-all with the busiest rank's larger of sent and received pairs.

With the experts folded over a stage's d t ranks (expert tensor parallelism 1, Megatron-Core's
MoE parallel folding: Liu et al. 2025, arXiv 2504.14960) every rank routes only its own s b / t
tokens of the sequence-parallel layer input, so P = k s b / t, and its expert-parallel group is
ep consecutive ranks of the stage (``groups.expert_groups``): with t = 8 and ep = 8 one node's
NVLink.

With the deduplicating dispatcher (``TrainingSpec.moe_dispatcher`` deepep) a token crosses once to
each remote node its experts are on and is forwarded there over NVLink; the combine reduces
there before crossing back. The all-to-all's off-node bytes shrink by ``off_node_share`` (uniform
routing; DeepSeek's group-limited routing where its groups fall whole on nodes); its on-node part
is priced as before. Units: seconds, bytes, pairs.
"""

import functools
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from cost_models.comm import Group, collective_time_s, nodes_spanned, priced_groups, slowest_collective_s
from cost_models.context_parallel import local_seq_len
from cost_models.memo import HeldMemo
from cost_models.params import stage_moe_layers
from planner.schemas import (
    ClusterProfile,
    CollectiveOp,
    Layout,
    ModelSpec,
    MoeDispatcher,
    RecomputeModule,
    TrainingSpec,
)
from planner.schemas.geometry import chunk_layers, chunks_of_stage
from planner.schemas.routing import ExpertPlacement, RoutingStats


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertLoad:
    """One MoE layer's routed pairs on its busiest expert-parallel rank, against a balanced layer."""

    compute_factor: float
    """Hottest rank's pairs (those its experts compute) over the mean rank's when dropless: max_q L_q / P
    (>= 1 dropless; a capacity factor can drop it below 1 or, padded, raise it to the factor)."""
    exchange_factor: float
    """Busiest rank's pairs over the links, sent or received, over a balanced rank's
    P (ep - 1)/ep; 1 for a balanced layer, 0 with one rank."""
    sent_share: float
    """Mean rank's pairs sent to other ranks over its own pairs: N - mean_q K_q / P."""
    dropped_share: float = 0.0
    """Routed pairs a capacity factor drops, over all routed pairs: 1 - N (0 when padded or dropless)."""


BALANCED = ExpertLoad(compute_factor=1.0, exchange_factor=1.0, sent_share=0.0)
"""What every MoE layer of a layout without expert parallelism, or routed uniformly over
contiguous blocks, carries relative to itself (sent_share aside, which ``layer_loads`` sets)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StageExpertLoad:
    """The MoE layers of one pipeline stage, their loads summed (they run one after another)."""

    moe_layers: int
    compute_sum: float
    """Sum of the stage's MoE layers' compute factors (= moe_layers when balanced)."""
    exchange_sum: float
    """Sum of their exchange factors."""
    compute_max: float
    """The largest compute factor among them (1 without MoE layers): sizes the receive buffer."""
    sent_pairs_share: float
    """Sum of their sent shares: pairs sent to other ranks per own routed pair of one layer."""


def layer_loads(
    model: ModelSpec, training: TrainingSpec, layout: Layout, routing: RoutingStats | None = None
) -> tuple[ExpertLoad, ...]:
    """``ExpertLoad`` of every MoE layer in model order (module docstring).

    Args:
        model: the MoE model (none for a dense one).
        training: its capacity factor (None: dropless) and padding.
        layout: the expert-parallel degree and placement.
        routing: a routing trace's statistics of this model; None assumes uniform routing.

    Raises:
        SchemaError: the trace's layers or experts are not the model's.
    """
    ep, layers, experts = layout.expert_parallel_degree, model.num_moe_layers, model.num_local_experts
    if not layers:
        return ()
    if routing is not None:
        routing.check_model(model)
    capacity = _Capacity(training.moe_capacity_factor, training.moe_pad_to_capacity)
    placement = layout.expert_placement
    if placement is None:
        if routing is None and capacity.factor is None:
            sent = (ep - 1) / ep
            return (BALANCED if ep == 1 else replace(BALANCED, sent_share=sent),) * layers
        placement = ExpertPlacement.contiguous(experts, ep, layers)
    return _loads(routing, placement, capacity)


@dataclass(frozen=True, slots=True)
class _Capacity:
    factor: float | None
    """c; None: dropless."""
    padded: bool

    def shares(self, routed: np.ndarray) -> np.ndarray:
        """Each expert's share n_e of a rank's routed pairs, as computed: capped at c/E, or c/E padded."""
        if self.factor is None:
            return routed
        cap = self.factor / routed.shape[-1]
        return np.full_like(routed, cap) if self.padded else np.minimum(routed, cap)


@functools.lru_cache(maxsize=512)
def _loads(routing: RoutingStats | None, placement: ExpertPlacement, capacity: _Capacity) -> tuple[ExpertLoad, ...]:
    ep, experts = placement.num_ranks, placement.num_experts
    if routing is None:
        routed = np.full((placement.num_layers, experts), 1.0 / experts)
    else:
        counts = routing.expert_tokens.astype(np.float64)
        routed = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
    shares = capacity.shares(routed)
    balanced = (ep - 1) / ep
    out = []
    for layer in range(placement.num_layers):
        share = placement.share(layer)  # (E, ep): 1 / c_e on each rank hosting e
        kept = shares[layer] @ (share > 0)  # K_q / P
        load = ep * (shares[layer] @ share)  # L_q / P
        computed = float(shares[layer].sum())  # N
        busiest = max(float((computed - kept).max()), float((load - kept).max()))
        out.append(
            ExpertLoad(
                compute_factor=float(load.max()),
                exchange_factor=busiest / balanced if ep > 1 else 1.0,
                sent_share=float(computed - kept.mean()),
                dropped_share=max(0.0, 1.0 - computed) if not capacity.padded else 0.0,
            )
        )
    return tuple(out)


def stage_expert_loads(
    model: ModelSpec, training: TrainingSpec, layout: Layout, routing: RoutingStats | None = None
) -> tuple[StageExpertLoad, ...]:
    """Every pipeline stage's MoE layers (its chunks' layers, ``ModelSpec.is_moe_layer``) and their loads."""
    if routing is None and layout.expert_placement is None and training.moe_capacity_factor is None:
        # uniform and dropless: every layer balanced (a search's usual case)
        return _uniform_loads(stage_moe_layers(model, layout), layout.expert_parallel_degree)
    loads = layer_loads(model, training, layout, routing)
    p, v = layout.pipeline_parallel_degree, layout.virtual_stages
    split = chunk_layers(model, layout)
    return _STAGE_LOADS.get(loads, (model, split, p, v), lambda: _stage_loads(model, loads, split, p, v))


_STAGE_LOADS: HeldMemo[tuple[StageExpertLoad, ...]] = HeldMemo(limit=4096)
"""``_stage_loads`` by the layers' loads (``_loads`` returns one tuple per placement, held here)
and the split: a search with a routing trace prices a few placements over many layouts."""


def _stage_loads(
    model: ModelSpec, loads: tuple[ExpertLoad, ...], per_chunk: tuple[int, ...], stages: int, chunks_per_stage: int
) -> tuple[StageExpertLoad, ...]:
    """``stage_expert_loads`` of the MoE layers' ``loads`` (model order) over chunks of ``per_chunk`` layers."""
    ordinal = {layer: i for i, layer in enumerate(i for i in range(model.num_hidden_layers) if model.is_moe_layer(i))}
    first = (0, *itertools.accumulate(per_chunk))  # each chunk's first layer, then the end
    out = []
    for stage in range(stages):
        mine = [
            loads[ordinal[i]]
            for chunk in chunks_of_stage(stages, chunks_per_stage, stage)
            for i in range(first[chunk], first[chunk + 1])
            if i in ordinal
        ]
        out.append(
            StageExpertLoad(
                moe_layers=len(mine),
                compute_sum=sum(x.compute_factor for x in mine),
                exchange_sum=sum(x.exchange_factor for x in mine),
                compute_max=max((x.compute_factor for x in mine), default=1.0),
                sent_pairs_share=sum(x.sent_share for x in mine),
            )
        )
    return tuple(out)


@functools.lru_cache(maxsize=1024)
def _uniform_loads(moe_layers: tuple[int, ...], ep: int) -> tuple[StageExpertLoad, ...]:
    """Balanced MoE layers, ``moe_layers[s]`` of them on stage s."""
    return tuple(
        StageExpertLoad(
            moe_layers=n,
            compute_sum=float(n),
            exchange_sum=float(n),
            compute_max=1.0,
            sent_pairs_share=n * (ep - 1) / ep,
        )
        for n in moe_layers
    )


def dropped_share(model: ModelSpec, training: TrainingSpec, routing: RoutingStats | None = None) -> float:
    """Share of all routed pairs that the capacity factor drops, over the model's MoE layers (any
    placement: every rank drops its own pairs before dispatch). 0 dropless, padded, or under
    uniform routing with a factor of at least 1."""
    one_rank = Layout(data_parallel_degree=1, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=1)
    loads = layer_loads(model, training, one_rank, routing)
    return sum(x.dropped_share for x in loads) / len(loads) if loads else 0.0


def routed_pairs(model: ModelSpec, training: TrainingSpec, layout: Layout) -> int:
    """P: (token, expert) pairs one rank routes per MoE layer and micro-batch, k s b / cp (its
    share of the sequence under context parallelism); k s b / (cp t) with the experts folded (each
    rank routes its own share of the sequence)."""
    pairs = layout.micro_batch_size * local_seq_len(training, layout) * model.num_experts_per_tok
    return pairs // layout.tensor_parallel_degree if layout.folds_experts else pairs


def expert_parallel_layer_s(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    expert_groups: Iterable[Group],
) -> float:
    """Expert-parallel seconds of one balanced MoE layer and micro-batch; 0 for a dense model or ep = 1.

    Args:
        model: hidden size, experts per token.
        training: sequence length and precision.
        cluster: links and collective records.
        layout: expert-parallel degree, micro-batch size, recompute.
        expert_groups: the expert-parallel groups (devices).

    Returns:
        Seconds: 4 all-to-alls of P h elements (``routed_pairs``; 6 where the MoE block is recomputed) in
        ``Precision.activation_communication``; a layer's ``ExpertLoad.exchange_factor`` scales it.
    """
    if not (model.is_moe and layout.expert_parallel_degree > 1):
        return 0.0
    element_bytes = training.precision.activation_communication.bytes
    a2a_bytes = routed_pairs(model, training, layout) * model.hidden_size * element_bytes
    groups = priced_groups(expert_groups, cluster, rank_order=layout.device_map.is_identity)
    if training.moe_dispatcher is not MoeDispatcher.DEEPEP:  # every group sends all its off-node bytes
        return exchanges_per_micro_batch(layout) * slowest_collective_s(
            CollectiveOp.ALL_TO_ALL, a2a_bytes, groups, cluster
        )
    a2a_s = max(  # each group's share by the nodes it spans
        (
            collective_time_s(
                CollectiveOp.ALL_TO_ALL,
                a2a_bytes,
                group,
                cluster,
                off_node_share=off_node_share(model, nodes_spanned(group, cluster)),
            )
            for group in groups
        ),
        default=0.0,
    )
    return exchanges_per_micro_batch(layout) * a2a_s


def off_node_share(model: ModelSpec, nodes: int) -> float:
    """Share of an all-to-all's off-node bytes that cross when each token goes once to each remote
    node it is routed to (``MoeDispatcher.DEEPEP``), under uniform routing over an expert-parallel
    group spanning ``nodes`` nodes that hold the experts in equal contiguous blocks.

    A plain all-to-all sends each token's k pairs, k (N - 1) / N of them off-node on average. Deduplicated,
    a token crosses once to each remote node among those its experts touch: (N - 1) (1 - u) on
    average, u the chance that a given node holds none of them. Its k experts are a uniform
    k-subset of the E: u = C(E - E/N, k) / C(E, k). With group-limited routing (DeepSeek's
    ``n_group`` groups of contiguous experts, ``topk_group`` of them per token; DeepSeek-V3 report
    sec. 2.1.2, its node-limited routing) whose groups fall whole on nodes (N divides n_group),
    the token's experts lie in ``topk_group`` uniform groups, each taken to hold at least one of
    them: u = C(G - G/N, g) / C(G, g). Example: DeepSeek-V3 (E 256, k 8, G 8, g 4) over 8 nodes:
    u = C(7, 4) / C(8, 4) = 1/2, 3.5 remote nodes against 7 pairs off-node: 0.5.

    Returns:
        The share in (0, 1]; 1 on one node.
    """
    if nodes <= 1:
        return 1.0
    k, experts = model.num_experts_per_tok, model.num_local_experts
    groups, per_token = model.n_group or 1, model.topk_group or 1
    if groups > 1 and per_token < groups and groups % nodes == 0:
        untouched = math.comb(groups - groups // nodes, per_token) / math.comb(groups, per_token)
    else:
        untouched = math.comb(experts - experts // nodes, k) / math.comb(experts, k)
    return min(1.0, (1.0 - untouched) / (k / nodes))


def exchanges_per_micro_batch(layout: Layout) -> int:
    """All-to-alls of one MoE layer and micro-batch: dispatch and combine, forward and backward,
    and the forward's two again where the backward re-runs the MoE block: under full
    recomputation, and under selective with ``moe`` among its modules (Megatron-Core's
    ``MoELayer.forward`` checkpoints route, dispatch, experts and combine together)."""
    return 4 + (2 if layout.recomputes(RecomputeModule.MOE) else 0)


def sent_bytes_per_step(
    model: ModelSpec, training: TrainingSpec, layout: Layout, micro_batches: int, routing: RoutingStats | None = None
) -> tuple[float, ...]:
    """Bytes one rank of each pipeline stage sends to other ranks of its expert-parallel group
    in one step (every all-to-all, mean rank): P x sent share x h elements in
    ``Precision.activation_communication`` per exchange, summed over the stage's MoE layers,
    exchanges and micro-batches. 0 without expert parallelism."""
    if not (model.is_moe and layout.expert_parallel_degree > 1):
        return (0.0,) * layout.pipeline_parallel_degree
    pair_bytes = model.hidden_size * training.precision.activation_communication.bytes
    per_layer = routed_pairs(model, training, layout) * pair_bytes * exchanges_per_micro_batch(layout) * micro_batches
    return tuple(per_layer * stage.sent_pairs_share for stage in stage_expert_loads(model, training, layout, routing))
