"""Routing traces: read, check, summarize, and generate them.

A trace is a NumPy ``.npz`` file with three arrays (the runtime writes it with
``planner run --trace-routing``; ``write_trace`` writes the same format):

- ``expert_ids``: integers of shape (tokens, MoE layers, k): for each routed token and each MoE
  layer in model order, the ids of its top-k experts;
- ``num_experts``: a scalar integer, the experts per MoE layer (E);
- ``model``: a string, the name of the model the trace was captured from.

``summarize`` turns a trace into ``RoutingStats`` (tokens per expert, co-activation between
consecutive layers), which the expert-placement refiner reads. ``synthetic_trace`` draws a
trace with a stated skew and affinity, seeded, for benchmarks and tests.
"""

import logging
import zipfile
from pathlib import Path

import numpy as np

from planner.schemas import ModelSpec, RoutingStats
from planner.schemas.errors import SchemaError
from planner.schemas.routing import IntArray

log = logging.getLogger(__name__)

KEYS = ("expert_ids", "num_experts", "model")
"""The arrays a trace file holds."""
_DENSE_PAIRS_MAX = 1 << 22
"""Up to this many expert pairs (E^2), co-activation is counted densely with bincount."""


def read_trace(path: Path | str, model: ModelSpec | None = None) -> tuple[IntArray, int, str]:
    """The trace in ``path``: (expert_ids, num_experts, model name), checked.

    Args:
        path: a ``.npz`` trace file.
        model: when given, the trace must match its MoE layers, experts and experts per token.

    Raises:
        SchemaError: the file is not a trace, or not one of ``model``; the message names the
            file, the value and the fix.
    """
    where = f"routing trace {str(path)!r}"
    try:
        with open(path, "rb") as file:
            if not zipfile.is_zipfile(file):  # np.load would return a .npy's array, or unpickle a text file
                raise SchemaError(
                    f"{where} is not a NumPy .npz file (a zip of arrays); write one with planner run --trace-routing"
                )
            file.seek(0)
            with np.load(file, allow_pickle=False) as data:
                missing = [k for k in KEYS if k not in data.files]
                if missing:
                    raise SchemaError(
                        f"{where} lacks {missing}; a trace holds {list(KEYS)} (see planner.files.routing_trace)"
                    )
                ids, experts, name = data["expert_ids"], data["num_experts"], data["model"]
    except FileNotFoundError as e:
        raise SchemaError(f"{where} does not exist; give the path of a trace file (planner run --trace-routing)") from e
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise SchemaError(f"{where} is not a NumPy .npz file ({e}); write one with planner run --trace-routing") from e
    if experts.ndim != 0 or not np.issubdtype(experts.dtype, np.integer) or int(experts) < 1:
        raise SchemaError(f"{where}: num_experts={experts!r} must be one whole number >= 1")
    if name.ndim != 0 or name.dtype.kind != "U":
        raise SchemaError(f"{where}: model={name!r} must be one string, the model's name")
    check_expert_ids(ids, int(experts), where)
    if model is not None:
        check_trace_model(ids, int(experts), model, where)
    check_distinct_experts(ids, where)
    return ids.astype(np.int64), int(experts), str(name)


def check_expert_ids(ids: np.ndarray, num_experts: int, where: str) -> None:
    """Raise SchemaError unless ``ids`` is a (tokens, layers, k) integer array of ids below E."""
    if ids.ndim != 3 or 0 in ids.shape:
        raise SchemaError(
            f"{where}: expert_ids has shape {ids.shape}; it needs 3 non-empty dims (tokens, MoE layers, k)"
        )
    if not np.issubdtype(ids.dtype, np.integer):
        raise SchemaError(f"{where}: expert_ids has dtype {ids.dtype}; expert ids are integers")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= num_experts:
        raise SchemaError(
            f"{where}: expert ids span {low}..{high}, outside 0..{num_experts - 1} for num_experts={num_experts}; "
            "check num_experts or the ids"
        )


def check_distinct_experts(ids: np.ndarray, where: str) -> None:
    """Raise SchemaError if a token goes to the same expert twice in a layer: a router's top-k are k
    distinct experts, and a trace that repeats one counts that expert's load twice."""
    repeats = np.diff(np.sort(ids, axis=-1), axis=-1) == 0
    if repeats.any():
        token, layer, _ = (int(i) for i in np.argwhere(repeats)[0])
        raise SchemaError(
            f"{where}: token {token} goes to expert {int(ids[token, layer].min())} twice or more in MoE layer "
            f"{layer} ({ids[token, layer].tolist()}); a token's top-k are k distinct experts: check the trace"
        )


def check_trace_model(ids: np.ndarray, num_experts: int, model: ModelSpec, where: str) -> None:
    """Raise SchemaError unless the trace's layers, experts and k are ``model``'s."""
    if not model.is_moe:
        raise SchemaError(f"{where} routes tokens to experts, but {model.name!r} has none; drop the routing trace")
    _, layers, k = ids.shape
    expected = (model.num_moe_layers, model.num_local_experts, model.num_experts_per_tok)
    if (layers, num_experts, k) != expected:
        raise SchemaError(
            f"{where} has {layers} MoE layers, {num_experts} experts and top-{k}, but {model.name!r} has "
            f"{expected[0]} MoE layers, {expected[1]} experts and top-{expected[2]}; use a trace of this model"
        )


def write_trace(path: Path | str, expert_ids: np.ndarray, num_experts: int, model: str) -> None:
    """Write a trace file (the format ``read_trace`` reads)."""
    check_expert_ids(expert_ids, num_experts, f"routing trace for {str(path)!r}")
    np.savez(path, expert_ids=expert_ids, num_experts=np.int64(num_experts), model=np.str_(model))


def summarize(expert_ids: np.ndarray, num_experts: int, model: str) -> RoutingStats:
    """Tokens per expert and co-activation between consecutive MoE layers of a checked trace.

    Co-activation of layers (l, l + 1) counts, for every token, each of its k experts in layer l
    paired with each of its k experts in layer l + 1 (k^2 pairs per token).
    """
    ids = np.asarray(expert_ids, dtype=np.int64)
    tokens, layers, k = ids.shape
    counts = np.stack([np.bincount(ids[:, layer, :].ravel(), minlength=num_experts) for layer in range(layers)])
    pairs = []
    for layer in range(layers - 1):
        keys = (ids[:, layer, :, None] * num_experts + ids[:, layer + 1, None, :]).ravel()
        if num_experts**2 <= _DENSE_PAIRS_MAX:
            dense = np.bincount(keys, minlength=num_experts**2)
            nonzero = np.flatnonzero(dense)
            unique, together = nonzero, dense[nonzero]
        else:
            unique, together = np.unique(keys, return_counts=True)
        pairs.append((unique // num_experts, unique % num_experts, together.astype(np.int64)))
    return RoutingStats(
        model=model,
        num_experts=num_experts,
        experts_per_token=k,
        routed_tokens=tokens,
        expert_tokens=counts.astype(np.int64),
        coactivation=tuple(pairs),
    )


def load_routing_stats(path: Path | str, model: ModelSpec | None = None) -> RoutingStats:
    """``summarize(read_trace(path, model))``: the stats of a trace file, checked against ``model``."""
    ids, experts, name = read_trace(path, model)
    if model is not None and name != model.name:
        log.info("routing trace %s names model %r; using it for %r (same shape)", path, name, model.name)
    return summarize(ids, experts, name)


def synthetic_trace(
    *,
    tokens: int,
    layers: int,
    num_experts: int,
    experts_per_token: int,
    skew: float,
    affinity: float,
    seed: int,
) -> IntArray:
    """A (tokens, layers, k) trace with Zipf-like popularity and inter-layer affinity.

    Popularity: in each layer the expert of popularity rank q (1 = hottest; ranks shuffled per
    layer) is chosen with weight q^-skew (skew 0 is uniform). Affinity: each expert i of layer l
    has a fixed partner in layer l + 1 (a random permutation per layer); each of a token's k
    experts in layer l is followed by its partner with probability ``affinity``. The rest of the
    token's k experts in layer l + 1 are drawn by popularity, without repeats (Gumbel top-k).
    """
    if not (0.0 <= affinity <= 1.0 and skew >= 0 and 1 <= experts_per_token <= num_experts):
        raise SchemaError(
            f"synthetic trace: affinity={affinity} must be in [0, 1], skew={skew} >= 0, and "
            f"k={experts_per_token} in 1..{num_experts}"
        )
    rng = np.random.default_rng(seed)
    weights = np.arange(1, num_experts + 1, dtype=np.float64) ** -skew
    ids = np.empty((tokens, layers, experts_per_token), dtype=np.int64)
    rows = np.arange(tokens)[:, None]
    for layer in range(layers):
        log_popularity = np.log(weights[rng.permutation(num_experts)])
        scores = log_popularity + rng.gumbel(size=(tokens, num_experts))
        if layer > 0:
            partner = rng.permutation(num_experts)
            follows = rng.random((tokens, experts_per_token)) < affinity
            scores[rows, partner[ids[:, layer - 1, :]]] += np.where(follows, np.inf, 0.0)
        ids[:, layer, :] = np.argpartition(-scores, experts_per_token - 1, axis=1)[:, :experts_per_token]
    return ids
