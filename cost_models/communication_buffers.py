"""Buffers one rank holds for communication beyond its model states and activations, in bytes:
gradient buckets, collective staging, a pipeline's receive buffers, and the copy a tied
embedding's gradient sum makes. ``cost_models.memory`` sums them into a stage's
``communication_buffers_bytes``.

Conventions (stated once here):
  - Data-parallel gradient buckets (``planner.schemas.buffers``, which the runtime allocates
    too): 2 buckets of 25 M elements in the precision gradients are summed in
    (``Precision.gradient_reduce``), capped by the gradients the rank reduces; present
    when the rank has a data-parallel peer and reduces outside FSDP (ZeRO-0/1, experts).
  - Tensor-parallel staging: one activation, s b h elements in ``Precision.activation_communication``,
    when t > 1 (Megatron-LM's global buffer for the sequence-parallel all-gather / all-reduce).
  - Expert-parallel staging: send and receive buffers of one micro-batch's routed tokens,
    2 x k s b h elements in ``Precision.activation_communication`` (split by t with sequence
    parallelism), when ep > 1.
  - FSDP's reduce-scatter staging (ZeRO-2/3 without a pipeline, d > 1;
    ``reduce_scatter_staging_bytes``): the largest unit reduced during the backward, its
    gradients flat in ``Precision.gradient_reduce`` plus the 1/g shard they reduce to (and,
    under ZeRO-2, its gradients in ``Precision.gradients`` beside its gathered weights). Alive from
    that unit's reduction to the next unit's, after the loss's backward: it stands in for the
    logits, and adds only what it exceeds them by.
  - A tied embedding's gradient sum (``tied_gradient_sum_bytes``): on the two pipeline ranks
    holding its copies, the copy of the rows' gradients in ``Precision.gradient_reduce`` made
    after the backward; it adds what it exceeds the activations and logits by, which are freed
    by then.
  - A pipeline's receive buffers (``pipeline_buffer_bytes``, ``TrainingSpec.pipeline_buffers``):
    torch.distributed.pipelining, which our runtime runs, keeps one per micro-batch of the
    schedule for each chunk's input and each chunk's output gradient, and each output until its
    backward; Megatron-LM allocates them per transfer (none counted).
Under context parallelism every s above is the rank's s / cp tokens of each sequence.
"""

from cost_models.context_parallel import local_seq_len
from cost_models.params import StageParams
from planner.schemas import Layout, ModelSpec, PipelineBuffers, TrainingSpec
from planner.schemas.buffers import grad_bucket_elements
from planner.schemas.geometry import embedding_chunk, output_chunk, stage_chunks, tied_copy_stages


def communication_buffer_bytes(
    model: ModelSpec, training: TrainingSpec, layout: Layout, params: StageParams, compute_max: float = 1.0
) -> float:
    """Gradient buckets and collective staging buffers of one rank (conventions in the module doc).

    Data parallel: min(2 x 25 M, gradients reduced) elements in ``Precision.gradient_reduce``,
    counting dense gradients when d > 1 under ZeRO-0/1 and expert gradients when more than one
    rank holds the same experts (d / ep > 1, or d t / ep folded) (PyTorch DDP's reducer buckets;
    our runtime holds the same buckets for the run, ``runtime.optim.DataParallelOptimizer``).
    Under ZeRO-2/3 FSDP reduces the dense gradients unit by unit from the unit's own gradients
    and keeps no bucket between its reductions. Tensor parallel: s b h elements when t > 1
    (attention's, with the experts folded). Expert parallel: 2 x k s b h elements (/t with
    sequence parallelism, which folding needs: each rank routes its s b / t tokens) when ep > 1
    on an MoE, times ``compute_max``, the hottest rank's load in its hottest MoE layer
    (``expert_parallel.StageExpertLoad``): what it receives. Both staging buffers in
    ``Precision.activation_communication``.
    """
    d, t = layout.dense_replicas, layout.tensor_parallel_degree
    ep = layout.expert_parallel_degree if model.is_moe else 1
    buckets_dense = d > 1 and not layout.zero_stage.shards_gradients
    reduced = (params.dense if buckets_dense else 0.0) + (
        params.expert if layout.expert_data_parallel_degree > 1 else 0.0
    )
    precision = training.precision
    total = precision.gradient_reduce.bytes * grad_bucket_elements(reduced)
    tokens = local_seq_len(training, layout) * layout.micro_batch_size
    if t > 1:
        total += tokens * model.hidden_size * precision.activation_communication.bytes
    if ep > 1:
        sp = t if layout.sequence_parallel else 1
        routed = model.num_experts_per_tok * tokens * model.hidden_size / sp
        total += 2 * routed * precision.activation_communication.bytes * compute_max
    return total


def pipeline_buffer_bytes(
    model: ModelSpec, training: TrainingSpec, layout: Layout, stage: int, micro_batches: int, in_flight: float
) -> float:
    """Bytes the pipeline's transfers keep on a rank of pipeline stage ``stage``, beyond its activations
    (``TrainingSpec.pipeline_buffers``).

    Per transfer: none. Megatron-LM allocates each received tensor for its transfer (the chunk's
    input, counted with the activations) and frees each output's data once sent
    (``deallocate_output_tensor``).

    Per micro-batch, as torch 2.13's ``torch.distributed.pipelining`` stage (our runtime's
    schedule, as torchtitan's): at its first step it allocates, for each of the rank's chunks and
    each of the schedule's ``micro_batches``, one buffer to receive the chunk's input activations
    (all chunks but the model's first) and one to receive its output's gradient (all but the
    last), and keeps them for the run (``_prepare_forward_infra``: ``args_recv_info``;
    ``_prepare_backward_infra``: ``grad_recv_info``). A micro-batch in flight uses its buffer as
    the chunk's input, which its first norm keeps (counted with the activations, so not again
    here), and the stage keeps each chunk's output until that micro-batch's backward
    (``fwd_cache``), but the last chunk's (the logits, ``loss_element_bytes``). Each is b s/cp h
    elements in what the pipeline sends (``Precision.activation_communication``; /t with sequence
    parallelism). ``in_flight`` whole-stage micro-batches
    are held (``in_flight_micro_batches``), the rank's chunks taking alike shares of them (on the
    first rank the model's first chunk takes at most one more or less).

    Measured (torch 2.13, gloo, 2 ranks, 8 micro-batches, after two steps): 1F1B keeps 8 buffers
    on each rank; interleaved over 2 chunks a rank, 16 on each middle chunk, 8 on the two ends.

    Args:
        model: the hidden size.
        training: sequence length and precision.
        layout: degrees, micro-batch size, chunks.
        stage: pipeline rank.
        micro_batches: micro-batches of one schedule.
        in_flight: whole-stage micro-batches the rank holds at its peak.

    Returns:
        Bytes; 0 without a pipeline.
    """
    if layout.pipeline_parallel_degree == 1 or training.pipeline_buffers is PipelineBuffers.PER_TRANSFER:
        return 0.0
    chunks = stage_chunks(layout, stage)
    receive_inputs = sum(chunk != embedding_chunk(layout) for chunk in chunks)
    receive_gradients = sum(chunk != output_chunk(layout) for chunk in chunks)
    split = layout.tensor_parallel_degree if layout.sequence_parallel else 1
    element_bytes = training.precision.activation_communication.bytes
    one = local_seq_len(training, layout) * layout.micro_batch_size / split * model.hidden_size * element_bytes
    buffers = micro_batches * (receive_inputs + receive_gradients)
    return one * (buffers - in_flight * receive_inputs + in_flight * receive_gradients)


def reduce_scatter_staging_bytes(training: TrainingSpec, layout: Layout, params: StageParams) -> float:
    """Bytes FSDP2's reduction of one unit's gradients holds beyond the model states, at its worst.

    Mirrors torch 2.13's ``foreach_reduce`` (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py),
    called from ``FSDPParamGroup.post_backward``: it allocates a flat input of the unit's whole
    unsharded gradients in ``Precision.gradient_reduce``, copies them in, then allocates the sharded output,
    1/g of it (g = ``Layout.shard_degree``). The input is kept (``comm_ctx.reduce_scatter_states``,
    one buffer by default) until the next unit's ``post_backward``, so each unit's is alive
    through the backward of the unit before it; the embedding's unit is reduced last, when no
    activation is left, so the largest of the others counts (``StageParams.largest_reduced_unit``).
    The unit's gradients (``Precision.gradients``) are alive through the copy-in: under ZeRO-3 its
    gathered weights, counted in the gathered buffer, are freed first (resharded), so only
    ZeRO-2 adds them (its weights stay gathered until the step's last backward; counted in
    every step, as its whole weights are, so memory still grows with the micro-batch).

    As dry runs trace (llama3-8b, full recompute, b 1): at a short sequence the peak is the
    output layer's reduction, its fp32 input, shard and bf16 gradients beside the states, which
    the estimate misses without this term under ZeRO-2 and ZeRO-3; at a long one the loss's
    logits outweigh it (the peak is then the last layer's backward with that input held).

    Args:
        training: the gradients' precision and the one they are summed in.
        layout: ZeRO stage, degrees; under a pipeline FSDP reduces once after the last backward
            (``pipeline.defers_gradient_reduction``), when no activation is left: 0.
        params: the rank's parameters before sharding (``params.stage_params``).

    Returns:
        Bytes.
    """
    if not layout.shards_over_replicas or layout.pipeline_parallel_degree > 1:
        return 0.0
    unit, precision = params.largest_reduced_unit, training.precision
    reduced = unit * precision.gradient_reduce.bytes * (1 + 1 / layout.shard_degree)
    gradients = 0.0 if layout.zero_stage.shards_parameters else unit * precision.gradients.bytes
    return reduced + gradients


def tied_gradient_sum_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout, stage: int) -> float:
    """Bytes of the copy a tied embedding's gradient sum makes on pipeline rank ``stage``.

    Mirrors ``runtime.pipeline.TiedEmbedding.sync`` (run by ``Trainer.step`` after the backward,
    before the optimizer step): where the gradient's precision (``Precision.gradients``, or where
    FSDP shards the gradients its accumulator's, ``Precision.gradient_accumulation``) is not the
    one gradients are summed in (``Precision.gradient_reduce``), it all-reduces
    ``grad.to(reduce_dtype)``, a copy of the rank's V/t x h rows (1/g of them where FSDP shards
    the gradients). Held after the backward, when no activation or logit is left:
    ``LayoutMemory`` adds what it exceeds them by.

    As dry runs trace (gpt3-175b's last stage, tp 8, pp 8, ZeRO-0, full recompute, b 1): at long
    sequences the step peaks in the backward, just above the sum; at short ones the sum is the
    step's peak.

    Args:
        model: the model (``tie_word_embeddings``, V, h).
        training: the gradients' precision and the one they are summed in.
        layout: degrees, ZeRO stage, vocabulary layout.
        stage: pipeline rank.

    Returns:
        Bytes; 0 off the two ranks of ``geometry.tied_copy_stages`` or where no copy is made.
    """
    stages = tied_copy_stages(model, layout)
    if stages is None or stage not in stages:
        return 0.0
    fsdp, precision = layout.shards_over_replicas, training.precision
    gradient_dtype = precision.gradient_accumulation if fsdp else precision.gradients
    if gradient_dtype is precision.gradient_reduce:
        return 0.0
    rows = model.vocab_size * model.hidden_size / layout.tensor_parallel_degree
    return rows / (layout.shard_degree if fsdp else 1) * precision.gradient_reduce.bytes
