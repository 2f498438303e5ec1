"""Routing: where a mixture-of-experts model's tokens go, and where its experts live.

``RoutingStats`` summarizes a routing trace (``planner.files.routing_trace`` reads one): per MoE layer
how many tokens each expert received, and how many tokens went to expert i of a layer and to
expert j of the next (the inter-layer co-activation ExFlow exploits; Yao et al., "Exploiting
Inter-Layer Expert Affinity for Accelerating Mixture-of-Experts Model Inference", 2024).

``ExpertPlacement`` says, per MoE layer and per expert-parallel rank, which experts the rank
hosts (its slots). An expert hosted by several ranks is replicated, as DeepSeek's EPLB does, and
its tokens are split evenly over its replicas.
"""

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import numpy as np
import numpy.typing as npt

from planner.schemas.errors import SchemaError
from planner.schemas.model import ModelSpec

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertPlacement:
    """Per MoE layer, per expert-parallel rank, the expert ids the rank hosts."""

    slots: tuple[tuple[tuple[int, ...], ...], ...]
    """``slots[layer][rank]``: the experts rank ``rank`` hosts in MoE layer ``layer`` (model
    order); every rank has the same number of slots, every expert is hosted at least once and at
    most once per rank."""

    def __post_init__(self) -> None:
        slots = tuple(tuple(tuple(rank) for rank in layer) for layer in self.slots)
        object.__setattr__(self, "slots", slots)
        if not slots or not slots[0]:
            raise SchemaError("expert_placement needs at least one MoE layer and one rank; omit it for the default")
        ranks, per_rank = len(slots[0]), len(slots[0][0])
        experts = 1 + max((e for layer in slots for rank in layer for e in rank), default=-1)
        for index, layer in enumerate(slots):
            if len(layer) != ranks or any(len(rank) != per_rank for rank in layer):
                raise SchemaError(
                    f"expert_placement layer {index} has {[len(r) for r in layer]} slots on its ranks; "
                    f"every layer needs {ranks} ranks of {per_rank} slots each"
                )
            ids = [e for rank in layer for e in rank]
            if any(not isinstance(e, int) or isinstance(e, bool) or e < 0 for e in ids):
                raise SchemaError(f"expert_placement layer {index} holds {ids[:16]}: expert ids are whole numbers >= 0")
            missing = sorted(set(range(experts)) - set(ids))
            if missing:
                raise SchemaError(
                    f"expert_placement layer {index} hosts no copy of experts {missing[:16]}; "
                    f"host each of the {experts} experts at least once"
                )
            doubled = [r for r, rank in enumerate(layer) if len(set(rank)) != len(rank)]
            if doubled:
                raise SchemaError(
                    f"expert_placement layer {index} hosts an expert twice on ranks {doubled[:16]}; "
                    "put a replica on another rank"
                )

    @property
    def num_layers(self) -> int:
        """MoE layers placed."""
        return len(self.slots)

    @property
    def num_ranks(self) -> int:
        """Expert-parallel ranks (the layout's ep)."""
        return len(self.slots[0])

    @property
    def num_experts(self) -> int:
        """Distinct experts per layer (E)."""
        return 1 + max(e for rank in self.slots[0] for e in rank)

    @property
    def slots_per_rank(self) -> int:
        """Experts each rank hosts per layer: E / ep, plus its replica slots."""
        return len(self.slots[0][0])

    def share(self, layer: int) -> FloatArray:
        """(E, ep) share of each expert's tokens each rank receives in ``layer``: 1 / copies on
        each rank that hosts it, 0 elsewhere."""
        hosted = np.zeros((self.num_experts, self.num_ranks))
        for r, rank in enumerate(self.slots[layer]):
            hosted[list(rank), r] = 1.0
        copies: FloatArray = hosted.sum(axis=1, keepdims=True)
        return hosted / copies

    @staticmethod
    def contiguous(num_experts: int, ranks: int, layers: int) -> "ExpertPlacement":
        """Expert e on rank e // (E / ep) in every layer: what a layout without a placement runs.
        The same object for the same arguments (``_contiguous``)."""
        return _contiguous(num_experts, ranks, layers)

    @classmethod
    def round_robin(cls, num_experts: int, ranks: int, layers: int) -> Self:
        """Expert e on rank e mod ep in every layer: the usual baseline placement."""
        _per_rank(num_experts, ranks)
        layer = tuple(tuple(range(r, num_experts, ranks)) for r in range(ranks))
        return cls(slots=(layer,) * layers)


@functools.lru_cache(maxsize=256)
def _contiguous(num_experts: int, ranks: int, layers: int) -> ExpertPlacement:
    """``ExpertPlacement.contiguous``, built and checked once: pricing a routing trace asks for it
    for every layout of a search (an immutable value, shared)."""
    block = _per_rank(num_experts, ranks)
    layer = tuple(tuple(range(r * block, (r + 1) * block)) for r in range(ranks))
    return ExpertPlacement(slots=(layer,) * layers)


def _per_rank(num_experts: int, ranks: int) -> int:
    if ranks < 1 or num_experts % ranks:
        raise SchemaError(f"ep={ranks} does not divide {num_experts} experts; use an ep that divides it")
    return num_experts // ranks


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class RoutingStats:
    """What a routing trace says about one model's experts (``planner.files.routing_trace.summarize``)."""

    model: str
    """Name of the model the trace was captured from."""
    num_experts: int
    """Experts per MoE layer (E)."""
    experts_per_token: int
    """Experts each token is routed to (k)."""
    routed_tokens: int
    """Tokens in the trace."""
    expert_tokens: IntArray
    """(MoE layers, E): tokens routed to each expert of each MoE layer."""
    coactivation: tuple[tuple[IntArray, IntArray, IntArray], ...]
    """Per pair of consecutive MoE layers (l, l + 1), sparse: (i, j, tokens) arrays, tokens > 0
    routed to expert i in layer l and to expert j in layer l + 1 (k^2 pairs per token)."""

    def __post_init__(self) -> None:
        for array in (self.expert_tokens, *(a for pair in self.coactivation for a in pair)):
            array.setflags(write=False)  # frozen, like the dataclass
        layers = self.expert_tokens.shape[0]
        if self.expert_tokens.shape != (layers, self.num_experts) or len(self.coactivation) != max(layers - 1, 0):
            raise SchemaError(
                f"routing stats of shape {self.expert_tokens.shape} with {len(self.coactivation)} co-activation "
                f"tables do not describe {self.num_experts} experts over consecutive layers"
            )

    @property
    def num_layers(self) -> int:
        """MoE layers in the trace."""
        return int(self.expert_tokens.shape[0])

    def check_model(self, model: ModelSpec) -> None:
        """Raise SchemaError unless these are the MoE layers and experts of ``model``."""
        if (self.num_layers, self.num_experts) != (model.num_moe_layers, model.num_local_experts):
            raise SchemaError(
                f"the routing trace has {self.num_layers} MoE layers of {self.num_experts} experts, but "
                f"{model.name!r} has {model.num_moe_layers} of {model.num_local_experts}; use a trace of this model"
            )

    def coactivation_matrix(self, layer: int) -> IntArray:
        """Dense (E, E) co-activation between MoE layer ``layer`` and the next."""
        i, j, tokens = self.coactivation[layer]
        dense = np.zeros((self.num_experts, self.num_experts), dtype=np.int64)
        np.add.at(dense, (i, j), tokens)
        return dense

    @classmethod
    def from_counts(
        cls,
        *,
        model: str,
        expert_tokens: Sequence[Sequence[int]],
        coactivation: Sequence[Sequence[Sequence[int]]],
        experts_per_token: int,
        routed_tokens: int,
    ) -> Self:
        """Stats from dense counts: ``expert_tokens[l][e]`` and ``coactivation[l][i][j]``."""
        tokens = np.asarray(expert_tokens, dtype=np.int64)
        pairs = []
        for matrix in coactivation:
            dense = np.asarray(matrix, dtype=np.int64)
            i, j = np.nonzero(dense)
            pairs.append((i.astype(np.int64), j.astype(np.int64), dense[i, j]))
        return cls(
            model=model,
            num_experts=int(tokens.shape[1]),
            experts_per_token=experts_per_token,
            routed_tokens=routed_tokens,
            expert_tokens=tokens,
            coactivation=tuple(pairs),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementMetrics:
    """Predicted routing cost of a placement on a trace, in routed tokens.

    share_l[e, r] is the share of expert e's tokens rank r receives in layer l (``share``);
    C_l[i, j] the co-activation of layers l and l + 1. A co-activated pair moves between ranks
    unless both experts' copies meet on one rank: cross-rank tokens =
    sum_l sum_{i,j} C_l[i, j] (1 - sum_r share_l[i, r] share_{l+1}[j, r]), the tokens that must
    leave the rank of their layer-l expert to reach their layer-(l + 1) expert (ExFlow's
    inter-layer affinity). Cross-node tokens likewise with each node's share.
    """

    hottest_rank_tokens: float
    """Sum over MoE layers of the hottest rank's routed tokens, sum_l max_r sum_e n_l[e] share_l[e, r]:
    layers run one after another, each as slow as its hottest rank."""
    mean_rank_tokens: float
    """Sum over MoE layers of the mean rank's routed tokens (the floor of the above)."""
    cross_rank_tokens: float
    """Co-activated token pairs of consecutive layers whose experts sit on different ranks."""
    cross_node_tokens: float
    """... on different nodes."""


def _shares(placement: ExpertPlacement, node_of_rank: tuple[int, ...]) -> tuple[list[FloatArray], list[FloatArray]]:
    nodes = np.zeros((placement.num_ranks, max(node_of_rank) + 1))
    nodes[np.arange(placement.num_ranks), node_of_rank] = 1.0
    ranks = [placement.share(layer) for layer in range(placement.num_layers)]
    return ranks, [share @ nodes for share in ranks]


def placement_metrics(
    stats: RoutingStats, placement: ExpertPlacement, node_of_rank: tuple[int, ...]
) -> PlacementMetrics:
    """Hottest-rank load and cross-rank/cross-node tokens of ``placement`` on ``stats``.

    Args:
        stats: the trace's routing statistics (same layers and experts as the placement).
        placement: the experts of every rank.
        node_of_rank: the node of each expert-parallel rank.
    """
    rank_share, node_share = _shares(placement, node_of_rank)
    loads = [stats.expert_tokens[layer] @ rank_share[layer] for layer in range(stats.num_layers)]
    cross_rank = cross_node = 0.0
    for layer in range(stats.num_layers - 1):
        together = stats.coactivation_matrix(layer)
        total = float(together.sum())
        cross_rank += total - float(np.sum((rank_share[layer].T @ together) * rank_share[layer + 1].T))
        cross_node += total - float(np.sum((node_share[layer].T @ together) * node_share[layer + 1].T))
    return PlacementMetrics(
        hottest_rank_tokens=float(sum(load.max() for load in loads)),
        mean_rank_tokens=float(sum(load.mean() for load in loads)),
        cross_rank_tokens=cross_rank,
        cross_node_tokens=cross_node,
    )
