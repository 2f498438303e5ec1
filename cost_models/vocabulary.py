"""The vocabulary layers split over the pipeline ranks: what every rank holds, keeps and sends.

Vocabulary Parallelism (Yeung, Qi, Lin, Wan, "Balancing Pipeline Parallelism with Vocabulary
Parallelism", MLSys 2025; its code, github.com/sail-sg/VocabularyParallelism) splits the input
embedding and the output layer by vocabulary rows over all p pipeline ranks
(``schemas.geometry.vocabulary_rows``), so each rank holds V/p rows of each and does 1/p of
their work (``geometry.vocabulary_share``; under tensor parallelism, below). Per micro-batch, over the pipeline group:

- output layer: the last stage broadcasts its final hidden states X in fp32 with one more
  column (the previous micro-batch's per-token loss gradient), s b (h + 1) x 4 bytes; every
  rank all-reduces three per-token fp32 statistics (max, target logit, sum of exp), 3 s b x 4
  bytes; the input gradient dX, s b h x 4 bytes, is summed with an all-reduce;
- input embedding: the partial lookups, s b h elements in ``Precision.activation_communication``,
  are summed with an all-reduce; the gradient of the embedding's output, as many bytes, is
  broadcast back.

Run as the paper's own schedule runs them (``TrainingSpec.vocabulary_overlap``, on GPUs), the
collectives run on their own stream beside the transformer layers (the paper's Fig. 5), so only
what does not fit behind a stage's layers is exposed, plus each all-reduce barrier the next step
waits on: Algorithm 1 (``VOCAB_1``) waits twice (statistics, then dX), Algorithm 2 (``VOCAB_2``)
once; to keep the pipeline busy meanwhile they run 2 and 1 more micro-batches in flight
(``VocabularyLayout.extra_in_flight``; the paper's p + 2 and p + 1 under 1F1B), and every rank
keeps two micro-batches' vocabulary state (``KEPT_MICRO_BATCHES``). A broadcast moves what an
all-gather of the same buffer moves per rank ((n - 1)/n of it, a pipelined ring), and is priced
as one.

Otherwise (the default, and always where communication cannot hide behind compute:
``overlap.hides_communication``, CPU ranks whose gloo collectives run on the cores that compute)
the passes run as this planner's runtime runs them (``runtime.vocabulary_parallel``):
synchronously, when the stage that needs one reaches it, within torch's 1F1B (no extra
micro-batch in flight), each pass's state alive during the pass only (its peak two micro-batches'
worth, ``KEPT_MICRO_BATCHES``). The
first stage then waits for the embedding's collectives in full, the last stage for the output
layer's, and the other stages join both from service threads beside their own layers, waiting
for neither. The peers compute their share of a pass beside their own layers on the cores they
share, so the stage running it waits for that share as well, and cores the other stages free do
not shorten the wait (every pipeline rank takes part). On a CPU cluster whose ranks share cores
the last stage spent several times its output pass's compute waiting in it, well beyond the
barrier an overlapped pricing gave it, so vocab-2 plans so priced ran slower than predicted
while their pinned twins did not; priced this way, they run as predicted.

Every rank keeps, for each micro-batch between its two vocabulary passes (one awaiting its
gradient pass while the next is computed: two), its fp32 softmax shard (``logits_bytes`` / p),
X in fp32, and under Algorithm 2 the two fp32 dX partials of the fused reduction.

Under tensor parallelism the vocabulary is split over the pipeline only, as the runtime runs it
(``runtime.vocabulary_parallel``; the paper splits it over p t ranks): every tensor-parallel rank
of a stage holds that stage's V/p rows and repeats its vocabulary passes, over its whole
sequence, or over its 1/t of it with sequence parallelism (``vocabulary_tokens``).
Units: seconds, bytes.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from cost_models.activations import logits_bytes
from cost_models.comm import Group, priced_groups, slowest_collective_s
from cost_models.context_parallel import local_seq_len
from planner.schemas import ClusterProfile, CollectiveOp, Layout, ModelSpec, TrainingSpec, VocabularyLayout, geometry

FP32_BYTES = 4
STATISTICS = 3
"""Per-token fp32 values all-reduced in the output layer's forward: max, target logit, sum of exp."""
KEPT_MICRO_BATCHES = 2
"""Micro-batches' worth of vocabulary state a rank holds at once. Under the paper's schedule: one
awaiting its gradient pass, one being computed. Run synchronously, one pass's own, whose fp32
softmax shard is joined by its lower-precision copies (the logits' gradient, the probabilities
multiplied by the shard) at its peak: counting one micro-batch's state leaves the last stage of
a dry run well under its tracked peak, two nearer."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VocabularyComm:
    """One micro-batch's vocabulary collectives on one rank of the pipeline group."""

    embedding_s: float
    """The input embedding's: the partial lookups' all-reduce and its gradient's broadcast."""
    output_s: float
    """The output layer's: X's broadcast, the statistics' and dX's all-reduces."""
    barrier_s: float
    """The all-reduces the next computation waits on (statistics; and dX under Algorithm 1)."""

    @property
    def total_s(self) -> float:
        """All of them, back to back."""
        return self.embedding_s + self.output_s

    def exposed_s(
        self,
        overlap_window_s: float,
        *,
        overlapped: bool = True,
        first: bool = False,
        last: bool = False,
        embedding_share_s: float = 0.0,
        output_share_s: float = 0.0,
    ) -> float:
        """What a stage waits (module docstring).

        Args:
            overlap_window_s: its layers' compute of one micro-batch.
            overlapped: whether the passes run behind the layers (the paper's schedule, on ranks
                whose communication can hide behind compute): then every stage waits for the
                barriers and whatever of the rest the window does not hide. Otherwise the stage
                that runs a pass waits for its collectives in full, and for its peers' share of
                the pass, which they compute beside their own layers rather than alongside its
                own share.
            first: the stage embeds the tokens (it runs the embedding's passes).
            last: the stage computes the loss (it runs the output layer's pass).
            embedding_share_s, output_share_s: one rank's share of the passes' compute.
        """
        if not overlapped:
            embedding = self.embedding_s + embedding_share_s if first else 0.0
            return embedding + (self.output_s + output_share_s if last else 0.0)
        return self.barrier_s + max(0.0, self.total_s - self.barrier_s - overlap_window_s)


NO_COMM = VocabularyComm(embedding_s=0.0, output_s=0.0, barrier_s=0.0)


def vocabulary_tokens(training: TrainingSpec, layout: Layout) -> float:
    """Tokens of one micro-batch whose vocabulary passes one rank takes part in: s b / cp (its
    share under context parallelism), or s b / (cp t) with sequence parallelism (each
    tensor-parallel rank its part of the sequence)."""
    tokens = local_seq_len(training, layout) * layout.micro_batch_size
    return tokens / layout.tensor_parallel_degree if layout.sequence_parallel else tokens


def vocabulary_comm(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    pipeline_groups: Iterable[Group],
) -> VocabularyComm:
    """The vocabulary collectives of one micro-batch (module docstring); none when pinned.

    Args:
        model: hidden size.
        training: sequence length and precision.
        cluster: links and collective records.
        layout: the vocabulary layout and micro-batch size.
        pipeline_groups: the pipeline groups (devices), the slowest of which is priced.
    """
    if not layout.vocabulary_layout.over_pipeline:
        return NO_COMM
    groups = priced_groups(pipeline_groups, cluster, rank_order=layout.device_map.is_identity)
    tokens = vocabulary_tokens(training, layout)
    hidden = tokens * model.hidden_size

    def cost(op: CollectiveOp, message_bytes: float) -> float:
        return slowest_collective_s(op, message_bytes, groups, cluster)

    statistics_s = cost(CollectiveOp.ALL_REDUCE, STATISTICS * tokens * FP32_BYTES)
    input_grad_s = cost(CollectiveOp.ALL_REDUCE, hidden * FP32_BYTES)
    output_s = (
        cost(CollectiveOp.ALL_GATHER, tokens * (model.hidden_size + 1) * FP32_BYTES)  # broadcast X and dloss
        + statistics_s
        + input_grad_s
    )
    element_bytes = training.precision.activation_communication.bytes
    embedding_s = (
        cost(CollectiveOp.ALL_REDUCE, hidden * element_bytes)  # the embedding's partial lookups
        + cost(CollectiveOp.ALL_GATHER, hidden * element_bytes)  # broadcast of its output's gradient
    )
    barrier = statistics_s + (input_grad_s if layout.vocabulary_layout is VocabularyLayout.VOCAB_1 else 0.0)
    return VocabularyComm(embedding_s=embedding_s, output_s=output_s, barrier_s=barrier)


def vocabulary_logits_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout) -> float:
    """The fp32 softmax shards one rank keeps for its vocabulary passes, ``KEPT_MICRO_BATCHES`` x
    4 x ``vocabulary_tokens`` x V/p (module docstring); 0 when pinned."""
    if not layout.vocabulary_layout.over_pipeline:
        return 0.0
    one = logits_bytes(model, seq_len=1, micro_batch_size=1) * vocabulary_tokens(training, layout)
    return KEPT_MICRO_BATCHES * one / layout.pipeline_parallel_degree


def vocabulary_activation_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout) -> float:
    """The other fp32 tensors one rank keeps for its vocabulary passes (module docstring): X for
    ``KEPT_MICRO_BATCHES`` micro-batches, 4 x tokens x h each (``vocabulary_tokens``), and under
    Algorithm 2 the two dX partials, twice that; 0 when pinned."""
    vocabulary = layout.vocabulary_layout
    if not vocabulary.over_pipeline:
        return 0.0
    hidden = FP32_BYTES * vocabulary_tokens(training, layout) * model.hidden_size
    partials = 2 * hidden if vocabulary is VocabularyLayout.VOCAB_2 else 0.0
    return KEPT_MICRO_BATCHES * hidden + partials


def tied_embedding_sync_s(model: ModelSpec, training: TrainingSpec, cluster: ClusterProfile, layout: Layout) -> float:
    """Seconds a step waits to sum the two copies of a tied embedding's gradient when the
    embedding and the output layer sit on different pipeline ranks (Megatron-LM's embedding
    group, the runtime's ``TiedEmbedding``): one all-reduce of the rank's V/t x h rows in the
    precision gradients are summed in (``Precision.gradient_reduce``) between the two ranks of
    each (replica, tensor shard) coordinate, after the last backward and before the update,
    behind no compute. 0 without tied embeddings, with one stage, with both layers on one rank,
    or with the vocabulary split over the pipeline (each rank's rows then serve both)."""
    stages = geometry.tied_copy_stages(model, layout)
    if stages is None:
        return 0.0
    first, last = stages
    device = layout.device_map.device_of
    pairs = (
        Group((device(geometry.rank_of(layout, first, r, j)), device(geometry.rank_of(layout, last, r, j))))
        for r in range(layout.dense_replicas)
        for j in range(layout.tensor_parallel_degree)
    )
    rows = -(-model.vocab_size // layout.tensor_parallel_degree)
    grad_bytes = rows * model.hidden_size * training.precision.gradient_reduce.bytes
    groups = priced_groups(pairs, cluster, rank_order=layout.device_map.is_identity)
    return slowest_collective_s(CollectiveOp.ALL_REDUCE, grad_bytes, groups, cluster)
