"""Context parallelism: each rank's share of a sequence, the exchange of ring attention or of
the all-to-all kind per layer and micro-batch, and the memory of what it receives.

The cp ranks of a context-parallel group (``groups.context_groups``) each hold 1/cp of every
sequence of the micro-batch (the ring: two of its 2 cp chunks, ``schemas.geometry.context_chunks``,
the zig-zag split; the all-to-all: one contiguous chunk), so every rank's projections, MLP,
norms, loss and collectives see b s / cp tokens (``local_seq_len``) and, under causal attention,
every rank does 1/cp of the layer's attention (the ring: its s / cp queries against the whole
sequence's keys, half of them masked; the all-to-all: all s queries of 1/cp of the heads).

Ring exchange (Liu et al. 2023, "Ring Attention with Blockwise Transformers"; the p2p exchange of
Megatron-Core's context parallelism through Transformer Engine, and torch's
``context_parallel``): attention runs cp steps; at each the rank computes its queries against the
key/value block it holds while it sends that block to the next rank of the ring and receives the
previous rank's. A block is the k and v of the rank's tokens, b (s / cp) (k_v + v_w) / t elements
in what activations are sent in (``Precision.activation_communication``, ``kv_block_bytes``;
k_v, v_w the key and value widths of all heads, split over the tensor-parallel group). With the
zig-zag split every step computes the same work, half of a full (s/cp) x (s/cp) block, so a
step's compute is 1/cp of the layer's attention: the diagonal step's under the causal mask, the
others' without one, each at the kernel's rate for its mask and block (``attention_calls``).
- forward: cp - 1 sends of a k/v block, each behind one step's compute;
- backward: cp - 1 sends of the k/v block again and cp - 1 sends of the dk/dv being accumulated
  for a block, fp32 (``GRADIENT_ELEMENT_BYTES``): the accumulator of rank j's block starts at rank
  j + 1, gathers each rank's share as it passes and reaches j after cp - 1 hops (this runtime's
  ring, ``runtime.ring_attention``; torch's own ring attention sends it cp times, its last hop
  returning it). Step 0 sends the k/v block behind its compute, steps 1 .. cp - 2 a k/v block and
  an accumulator, and the last accumulator hop follows the last compute, exposed;
- recomputation (full, or selective with core_attn among its modules) repeats the
  forward's exchange.
A step's transfer runs behind its compute at the overlap's cost (``overlap.overlapped_comm_cost_s``:
what the compute cannot hold, at least sigma / (1 + sigma) of it); on a CPU, where gloo cannot run
behind compute (``overlap.hides_communication``), all of it is exposed. A hop is priced over the
slowest link between consecutive ranks of the ring (``comm.device_link``); all ranks send at once,
each over its own link.

Memory (beyond the rank's own k and v, which its activations count): the blocks in flight,
double-buffered (the one computed on and the one arriving): forward 2 k/v blocks and the fp32
partial output and log-sum-exp merged step by step (b s/cp a/t (v + 1) x 4); backward 2 k/v blocks,
2 fp32 dk/dv blocks and the fp32 dq accumulator (b s/cp q/t x 4). The larger is held while one
layer's attention runs (``ring_buffer_bytes``).

All-to-all (``ContextParallelKind.ALL_TO_ALL``; Jacobs et al. 2023, "DeepSpeed Ulysses",
arXiv 2309.14509; Megatron-Core's ``--cp-comm-type a2a``). The sequence is split contiguously (rank
r holds tokens [r s/cp, (r+1) s/cp)): every rank attends over the whole sequence, so no split
balances anything. Per attention, an all-to-all over the context group turns each of q, k and v
from the rank's s/cp tokens of all of a tensor-parallel rank's heads into all s tokens of 1/cp of
them; attention runs locally, its work 1/cp of the layer's as the ring's, one causal call over the
whole sequence (``attention_calls``); a fourth all-to-all turns the output back. Each rank's buffer
per all-to-all is b (s/cp) w / t elements, w the width of q (a heads), k, v (``kv_heads_exchanged``
heads) or the output (a heads); it keeps 1/cp and sends (cp - 1)/cp of it to the other ranks
(``all_to_all_elements``).
- forward: the 4 all-to-alls; backward: their 4 reverses (the output's gradient to the head split,
  dq, dk, dv back to the sequence split), in ``Precision.activation_communication``;
- full recomputation repeats the forward's 4; selective recomputation (of the attention core)
  the 3 of q, k and v: the output's all-to-all is not run again, the backward needing nothing it
  made (torch's non-reentrant checkpoint stops once the saved tensors are back; this runtime).
They run in line with the compute (Ulysses has no block to hide them behind): all exposed, each
priced as the project's all-to-all over the context groups (``comm.collective_time_s``, the
slowest group that needs pricing). Grouped-query attention: a tensor-parallel rank's kv heads are
handed out as they are when cp divides them; else each is first repeated so that there are
lcm(kv / t, cp), each rank receiving the copies its query heads read (as DeepSpeed-Ulysses
replicates kv heads). Memory: the head-split q, k, v and output of one layer, transient
(``all_to_all_buffer_bytes``); the attention core keeps the head-split k and v for its backward,
more than the sequence split's where they were replicated (``kv_replication``).
Units: bytes, seconds.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from cost_models.comm import Group, device_link, priced_groups, slowest_collective_s, transfer_time_s
from cost_models.memo import HeldMemo
from cost_models.overlap import OVERLAP_COMPUTE_SLOWDOWN, hides_communication, overlapped_comm_cost_s
from planner.schemas import (
    ClusterProfile,
    CollectiveOp,
    ContextParallelKind,
    Layout,
    LinkProfile,
    ModelSpec,
    Recompute,
    TrainingSpec,
)
from planner.schemas.geometry import num_micro_batches, stage_layers

GRADIENT_ELEMENT_BYTES: Final = 4
"""One dk/dv element as the backward passes it around the ring: fp32 (this runtime's ring and
torch's accumulate the key/value gradients in fp32, torch's ``_cp_options.convert_to_f32``)."""
STATISTIC_ELEMENT_BYTES: Final = 4
"""One fp32 partial-output, log-sum-exp or dq element the ring keeps while it merges blocks."""


def local_seq_len(training: TrainingSpec, layout: Layout) -> int:
    """Tokens of each sequence one rank holds: s / cp (s without context parallelism)."""
    return training.seq_len // layout.context_parallel_degree


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionCall:
    """One kind of attention-kernel call a rank makes for its share of a layer's attention core."""

    share: float
    """Of the rank's attention work (its causal FLOPs, ``layer_work``), the part run this way."""
    seq_len: int
    """Tokens per sequence the kernel sees, whose rate applies (the side of a square block of the
    same work)."""
    causal: bool
    """Whether the call runs under a causal mask (else every query attends every key)."""


def attention_calls(training: TrainingSpec, layout: Layout) -> tuple[AttentionCall, ...]:
    """How the kernel runs a rank's attention work, whose rates differ by length and mask.

    Without context parallelism: one causal call over the sequence. The ring (zig-zag split):
    of its cp steps (each the same work, module docstring), step 0 is the rank's two chunks
    against themselves, one causal call of s / cp; each other step is half of the rank's queries
    against all of another rank's keys or all its queries against half the keys, a block of
    (s / cp) x (s / 2 cp) every pair of which is visible, run without a mask
    (``runtime.ring_attention.visible_block``; Transformer Engine's p2p context parallelism and
    torch's ring run the same calls), priced at the rate of a square block of its work,
    s / (cp sqrt 2). The all-to-all: one causal call over the whole sequence for 1/cp of the heads.
    """
    s, cp = training.seq_len, layout.context_parallel_degree
    if cp == 1 or layout.context_parallel_kind is ContextParallelKind.ALL_TO_ALL:
        return (AttentionCall(share=1.0, seq_len=s, causal=True),)
    return (
        AttentionCall(share=1 / cp, seq_len=s // cp, causal=True),
        AttentionCall(share=(cp - 1) / cp, seq_len=round(s / (cp * math.sqrt(2))), causal=False),
    )


def kv_block_elements(model: ModelSpec, training: TrainingSpec, layout: Layout) -> int:
    """Elements of one rank's key and value block, one micro-batch and layer:
    b (s / cp) (k_v + v_w) / t, k_v and v_w the key and value widths of all heads (GQA's kv heads;
    MLA's up-projected keys and values, a heads each)."""
    if model.is_mla:
        width = model.num_attention_heads * (model.qk_head_size + model.v_head_size)
    else:
        width = 2 * model.kv_heads * model.head_size
    tokens = layout.micro_batch_size * local_seq_len(training, layout)
    return tokens * width // layout.tensor_parallel_degree


def kv_block_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout) -> int:
    """Bytes of one rank's k/v block as the ring sends it (``kv_block_elements`` in
    ``Precision.activation_communication``)."""
    return kv_block_elements(model, training, layout) * training.precision.activation_communication.bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextBytes:
    """Bytes one rank sends to other ranks of its context-parallel group."""

    forward_bytes: float
    """Forward (and, under recomputation, the repeated forward): the ring's k/v blocks; the
    all-to-all's shares of q, k, v and the output."""
    backward_bytes: float
    """Backward: the ring's k/v blocks and fp32 dk/dv blocks; the all-to-all's shares of the
    gradients of the output, q, k and v."""

    @property
    def total_bytes(self) -> float:
        """Both directions of the step."""
        return self.forward_bytes + self.backward_bytes


def ring_bytes_per_layer(model: ModelSpec, training: TrainingSpec, layout: Layout) -> ContextBytes:
    """Bytes one rank sends for one attention layer and micro-batch (module docstring):
    forward (cp - 1) B, twice under recomputation; backward (cp - 1) (B + B'), B the k/v block in
    ``Precision.activation_communication``, B' the same elements in fp32. Zero without context
    parallelism."""
    cp = layout.context_parallel_degree
    if cp == 1:
        return ContextBytes(forward_bytes=0.0, backward_bytes=0.0)
    elements = kv_block_elements(model, training, layout)
    forward = float((cp - 1) * elements * training.precision.activation_communication.bytes)
    backward = forward + (cp - 1) * elements * GRADIENT_ELEMENT_BYTES
    forwards = 2 if layout.recomputes_attention_core else 1
    return ContextBytes(forward_bytes=forwards * forward, backward_bytes=backward)


def ring_links(cluster: ClusterProfile, layout: Layout, context_groups: Iterable[Group]) -> frozenset[LinkProfile]:
    """The links between consecutive members of the context-parallel groups (the last sends to
    the first), of the groups that need pricing (``comm.priced_groups``): those of them on the
    front of the slowest (``slowest_links``)."""
    groups = priced_groups(context_groups, cluster, rank_order=layout.device_map.is_identity)
    return _RING_LINKS.get(cluster, (groups,), lambda: _ring_links(cluster, groups))


def _ring_links(cluster: ClusterProfile, groups: Iterable[Group]) -> frozenset[LinkProfile]:
    links = {
        device_link(cluster, devices[i], devices[(i + 1) % len(devices)])
        for devices in (g.devices for g in groups)
        for i in range(len(devices))
    }
    return frozenset(slowest_links(links))


def slowest_links(links: Iterable[LinkProfile]) -> list[LinkProfile]:
    """Those of ``links`` that no other is slower than on both counts (lower or equal bandwidth,
    higher or equal latency): the slowest send over the set, ``ring_hop_s`` for any bytes, is
    over one of them. On a measured cluster every node's links differ; few are on that front."""
    front: list[LinkProfile] = []
    for link in sorted(links, key=lambda k: (k.bandwidth_bytes_per_s, -k.latency_s)):
        if not front or link.latency_s > front[-1].latency_s:
            front.append(link)
    return front


_RING_LINKS: HeldMemo[frozenset[LinkProfile]] = HeldMemo(limit=4096)
"""``ring_links`` by cluster and groups: every layout of a context-parallel axis asks again, and
on an explicit node matrix every group is priced."""


def ring_hop_s(message_bytes: float, links: Iterable[LinkProfile]) -> float:
    """Seconds of one ring step's send of ``message_bytes`` by every rank at once, each over its
    own link to the next: the slowest of ``links`` (``ring_links``)."""
    return max(transfer_time_s(message_bytes, link) for link in links)


def ring_exposed_s(
    step_transfers_s: Iterable[float],
    step_compute_s: float,
    *,
    hides: bool = True,
    slowdown: float = OVERLAP_COMPUTE_SLOWDOWN,
) -> float:
    """Seconds a ring's transfers add to its steps' compute: for each step, what of its transfer
    the step's ``step_compute_s`` does not hold (``overlap.overlapped_comm_cost_s``, which with
    ``slowdown`` 0 is max(0, transfer - compute)); every transfer in full when not ``hides``."""
    if not hides:
        return sum(step_transfers_s)
    return sum(overlapped_comm_cost_s(c, step_compute_s, slowdown) for c in step_transfers_s)


def context_parallel_layer_s(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    context_groups: Iterable[Group],
    attention_s: tuple[float, float],
) -> float:
    """Exposed seconds of one layer's context-parallel exchange, one micro-batch, of the layout's
    kind: ``ring_layer_s`` or ``all_to_all_layer_s`` (which ignores ``attention_s``: nothing hides
    it); 0 with cp = 1."""
    if layout.context_parallel_kind is ContextParallelKind.ALL_TO_ALL:
        return all_to_all_layer_s(model, training, cluster, layout, context_groups)
    return ring_layer_s(model, training, cluster, layout, context_groups, attention_s)


def context_buffer_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout) -> float:
    """Transient bytes of one layer's context-parallel attention on one rank, of the layout's kind:
    ``ring_buffer_bytes`` or ``all_to_all_buffer_bytes``; 0 with cp = 1."""
    if layout.context_parallel_kind is ContextParallelKind.ALL_TO_ALL:
        return all_to_all_buffer_bytes(model, training, layout)
    return ring_buffer_bytes(model, training, layout)


def context_bytes_sent_per_step(
    model: ModelSpec, training: TrainingSpec, layout: Layout, stage: int = 0
) -> ContextBytes:
    """Bytes one rank of pipeline stage ``stage`` sends to the other ranks of its context-parallel
    group in one optimizer step: the layout kind's bytes per layer (``ring_bytes_per_layer``,
    ``all_to_all_bytes_per_layer``) x the stage's layers x the step's micro-batches
    (``schemas.geometry.num_micro_batches``). What a runtime counting its sends should measure."""
    all_to_all = layout.context_parallel_kind is ContextParallelKind.ALL_TO_ALL
    per_layer = (all_to_all_bytes_per_layer if all_to_all else ring_bytes_per_layer)(model, training, layout)
    times = stage_layers(model, layout)[stage] * num_micro_batches(training.global_batch_size, layout)
    return ContextBytes(forward_bytes=per_layer.forward_bytes * times, backward_bytes=per_layer.backward_bytes * times)


def ring_layer_s(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    context_groups: Iterable[Group],
    attention_s: tuple[float, float],
) -> float:
    """Exposed seconds of one layer's ring exchange, one micro-batch: forward, backward and,
    under recomputation, the forward again (module docstring); 0 with cp = 1.

    Args:
        model: key/value widths.
        training: sequence length and precision.
        cluster: links; whether communication runs behind compute.
        layout: degrees, micro-batch size, recompute, device map.
        context_groups: the context-parallel groups (devices).
        attention_s: the rank's attention core forward and backward seconds for the layer (1/cp
            of the layer's whole attention), of which each step computes 1/cp.
    """
    cp = layout.context_parallel_degree
    if cp == 1:
        return 0.0
    links = ring_links(cluster, layout, context_groups)
    block = kv_block_elements(model, training, layout)
    element_bytes = training.precision.activation_communication.bytes
    kv_s = ring_hop_s(block * element_bytes, links)
    both_s = ring_hop_s(block * (element_bytes + GRADIENT_ELEMENT_BYTES), links)
    dkv_s = ring_hop_s(block * GRADIENT_ELEMENT_BYTES, links)
    hides = hides_communication(cluster)
    fwd_s = ring_exposed_s([kv_s] * (cp - 1), attention_s[0] / cp, hides=hides)
    bwd_s = ring_exposed_s([kv_s] + [both_s] * (cp - 2), attention_s[1] / cp, hides=hides) + dkv_s
    return fwd_s + bwd_s + (fwd_s if layout.recomputes_attention_core else 0.0)


def ring_buffer_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout) -> float:
    """Transient bytes of one layer's ring attention on one rank (module docstring): the larger
    of the forward's (2 k/v blocks as the ring sends them, fp32 partial output and log-sum-exp)
    and the backward's (2 such k/v blocks, 2 fp32 dk/dv blocks, fp32 dq); 0 with cp = 1."""
    if layout.context_parallel_degree == 1:
        return 0.0
    block = kv_block_elements(model, training, layout)
    tokens = layout.micro_batch_size * local_seq_len(training, layout)
    heads = model.num_attention_heads // layout.tensor_parallel_degree
    kv = 2.0 * block * training.precision.activation_communication.bytes
    forward = kv + STATISTIC_ELEMENT_BYTES * tokens * heads * (model.v_head_size + 1)
    backward = kv + 2 * block * GRADIENT_ELEMENT_BYTES + STATISTIC_ELEMENT_BYTES * tokens * heads * model.qk_head_size
    return max(forward, backward)


# --- the all-to-all kind (DeepSpeed-Ulysses) ------------------------------------------------------


def kv_heads_exchanged(model: ModelSpec, layout: Layout) -> int:
    """Key/value heads of a tensor-parallel rank that its all-to-alls hand out: its kv / t (MLA:
    its a / t up-projected heads) when cp divides them, else lcm(kv / t, cp), each repeated so that
    every rank receives the copies its query heads read (module docstring). Needs cp to divide
    the rank's query heads (``schemas.context_split.check_context_split``)."""
    kv = (model.num_attention_heads if model.is_mla else model.kv_heads) // layout.tensor_parallel_degree
    return math.lcm(kv, layout.context_parallel_degree)


def kv_replication(model: ModelSpec, layout: Layout) -> int:
    """How many copies of each key/value head the all-to-all kind hands out (1 when cp divides
    the kv heads of a tensor-parallel rank, and for the ring)."""
    if layout.context_parallel_kind is not ContextParallelKind.ALL_TO_ALL:
        return 1
    kv = (model.num_attention_heads if model.is_mla else model.kv_heads) // layout.tensor_parallel_degree
    return kv_heads_exchanged(model, layout) // kv


@dataclass(frozen=True, slots=True, kw_only=True)
class AllToAllElements:
    """Elements of one rank's buffer in each all-to-all of one attention, one micro-batch:
    b (s / cp) w, w the width the rank holds of all s / cp tokens before the head split."""

    query: int
    key: int
    value: int
    output: int

    @property
    def total(self) -> int:
        """The four buffers."""
        return self.query + self.key + self.value + self.output


def all_to_all_elements(model: ModelSpec, training: TrainingSpec, layout: Layout) -> AllToAllElements:
    """Each all-to-all's buffer of one rank (``AllToAllElements``): q and the output a / t heads
    (qk and v head widths), k and v ``kv_heads_exchanged`` heads."""
    tokens = layout.micro_batch_size * local_seq_len(training, layout)
    heads = model.num_attention_heads // layout.tensor_parallel_degree
    kv = kv_heads_exchanged(model, layout)
    return AllToAllElements(
        query=tokens * heads * model.qk_head_size,
        key=tokens * kv * model.qk_head_size,
        value=tokens * kv * model.v_head_size,
        output=tokens * heads * model.v_head_size,
    )


def all_to_all_bytes_per_layer(model: ModelSpec, training: TrainingSpec, layout: Layout) -> ContextBytes:
    """Bytes one rank sends to the other ranks of its group for one attention layer and
    micro-batch (module docstring): (cp - 1)/cp of the four buffers in
    ``Precision.activation_communication``, forward and backward, and the forward's again under
    recomputation (but the output's under selective). Zero without context parallelism."""
    cp = layout.context_parallel_degree
    if cp == 1:
        return ContextBytes(forward_bytes=0.0, backward_bytes=0.0)
    buffers = all_to_all_elements(model, training, layout)
    element_bytes = training.precision.activation_communication.bytes
    once = float(buffers.total * (cp - 1) // cp * element_bytes)
    again = float(_recomputed(buffers, attention_recompute(layout)) * (cp - 1) // cp * element_bytes)
    return ContextBytes(forward_bytes=once + again, backward_bytes=once)


def attention_recompute(layout: Layout) -> Recompute:
    """The recomputation attention sees: full, selective where the attention core is among the
    recomputed modules (``Layout.recompute_modules``), none otherwise (the other modules re-run
    nothing of the attention core or its exchanges)."""
    if layout.recompute is Recompute.SELECTIVE and not layout.recomputes_attention_core:
        return Recompute.NONE
    return layout.recompute


def _recomputed(buffers: AllToAllElements, recompute: Recompute) -> int:
    """Elements of the all-to-alls recomputation runs again: all four under full, q, k and v under
    selective (module docstring), none without."""
    if recompute is Recompute.NONE:
        return 0
    return buffers.total - (buffers.output if recompute is Recompute.SELECTIVE else 0)


def all_to_all_layer_s(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    context_groups: Iterable[Group],
) -> float:
    """Seconds of one layer's all-to-alls, one micro-batch, all exposed (module docstring): the
    four of q, k, v and the output forward and backward, and the forward's again under full
    recomputation (q, k and v's under selective); 0 with cp = 1.

    Args:
        model: head counts and widths.
        training: sequence length and precision.
        cluster: links and collective records.
        layout: degrees, micro-batch size, recompute, device map.
        context_groups: the context-parallel groups (devices).
    """
    if layout.context_parallel_degree == 1:
        return 0.0
    groups = priced_groups(context_groups, cluster, rank_order=layout.device_map.is_identity)
    buffers = all_to_all_elements(model, training, layout)
    element_bytes = training.precision.activation_communication.bytes
    qkv_s, out_s = (
        sum(slowest_collective_s(CollectiveOp.ALL_TO_ALL, n * element_bytes, groups, cluster) for n in part)
        for part in ((buffers.query, buffers.key, buffers.value), (buffers.output,))
    )
    again_s = {Recompute.NONE: 0.0, Recompute.SELECTIVE: qkv_s, Recompute.FULL: qkv_s + out_s}[
        attention_recompute(layout)
    ]
    return 2 * (qkv_s + out_s) + again_s


def all_to_all_buffer_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout) -> float:
    """Transient bytes of one layer's all-to-all attention on one rank: the head-split q, k, v
    and output of the whole sequence, as large as the four buffers (``all_to_all_elements``, in
    ``Precision.activation_communication``); 0 with cp = 1."""
    if layout.context_parallel_degree == 1:
        return 0.0
    element_bytes = training.precision.activation_communication.bytes
    return float(all_to_all_elements(model, training, layout).total * element_bytes)
