"""Per-rank memory of a layout, per pipeline stage, in bytes.

Sources: model states under ZeRO from Rajbhandari et al. (SC20) sec. 5 (``cost_models.sharding``,
with ZeRO-3's gathered buffer); activations from Korthikanti et al. 2022
(``cost_models.activations``); micro-batches in flight from ``schemas.geometry``; the stage's
parameters from ``cost_models.params``.

Constants (conventions, stated once here):
  - ``CUDA_WORKSPACE_BYTES`` = 1 GiB per rank on a CUDA device: the CUDA context with PyTorch's
    kernels loaded (about 0.3-0.6 GiB on A100/H100 with CUDA 12 lazy loading), cuBLAS workspaces
    (PyTorch's default on Hopper is 32 MiB per handle and stream), NCCL's per-communicator
    buffers (NCCL_BUFFSIZE 4 MiB per channel and peer, over the tp/dp/pp communicators) and
    some caching-allocator slack. 0 on a device whose name contains "cpu". This is not a
    fragmentation margin: callers keep their own safety margin on top.
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
  - One MLP's backward (``activations.mlp_backward_bytes``): the largest set of temporaries a
    layer's backward holds at once (2, 6 or 7 tensors of the MLP's width for GELU, SwiGLU,
    GeGLU), beside every activation the rank holds then. A stage without the loss peaks in a
    backward (as dry runs trace: on Mixtral, the 6 x 8,192 x 14,336 x 2 bytes of its expert's
    backward); the stage with the loss adds what it exceeds one micro-batch's logits by, freed
    before it runs.
Under context parallelism every s above is the rank's s / cp tokens of each sequence, and a
stage with layers adds one layer's context-parallel buffers (``context_parallel.context_buffer_bytes``:
the ring's blocks in flight, or the all-to-all's head-split q, k, v and output).
"""

from typing import Final

from cost_models.activations import (
    LOGIT_ELEMENT_BYTES,
    embedding_activation_bytes,
    kept_bytes,
    layer_activations,
    logits_bytes,
    mlp_backward_bytes,
    output_layer_activation_bytes,
    rematerialized_bytes,
)
from cost_models.context_parallel import context_buffer_bytes, kv_replication, local_seq_len
from cost_models.expert_parallel import StageExpertLoad, stage_expert_loads
from cost_models.layout_validity import check_stage
from cost_models.params import StageParams, all_stage_params, stage_moe_layers, stage_params
from cost_models.sharding import ModelStates, stage_model_states
from cost_models.vocabulary import vocabulary_activation_bytes, vocabulary_logits_bytes
from planner.schemas import (
    ClusterProfile,
    DeviceKind,
    DType,
    Layout,
    MemoryBreakdown,
    ModelSpec,
    PipelineBuffers,
    Schedule,
    TrainingSpec,
)
from planner.schemas.buffers import grad_bucket_elements
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.geometry import (
    chunk_stage,
    embedding_chunk,
    in_flight_micro_batches,
    num_micro_batches,
    output_chunk,
    pipeline_schedules,
    stage_chunks,
    stage_layers,
    tied_copy_stages,
)
from planner.schemas.routing import RoutingStats

CUDA_WORKSPACE_BYTES: Final = 1 << 30


def stage_activation_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    layout: Layout,
    stage: int,
    params: StageParams,
    load: StageExpertLoad | None = None,
) -> float:
    """Activation bytes one rank of stage ``stage`` holds at its peak (``LayoutMemory`` adds one
    MLP's backward transient beside them, against the logits freed before it: ``_mlp_backward_bytes``).

    Per-layer bytes (``kept_bytes`` of ``layer_activations``, with ``training.attention_kernel``,
    for its dense and its MoE layers, ``params.stage_moe_layers``) x the stage's layers of each
    kind x micro-batches in flight (``in_flight_micro_batches``, whole-stage units, so
    interleaving needs no further factor), plus the larger kind's one-layer recompute working set; the
    stage holding the embedding adds its ids and dropout mask per in-flight micro-batch
    (Korthikanti sec. 4.3); the stage holding the output layer adds the final norm and
    output-projection inputs of the micro-batches whose loss awaits its backward: all m under
    GPipe, one otherwise (the last chunk runs its backward right after its forward). Split over
    the pipeline, every stage keeps the ids and its vocabulary passes' tensors
    (``vocabulary.vocabulary_activation_bytes``), and the last the final norm's input.

    Args:
        model: the model.
        training: sequence length, precision, attention kernel.
        layout: degrees, micro-batch size, schedule, recompute.
        stage: pipeline rank.
        params: what the rank holds (``params.stage_params``): which vocabulary layers.
        load: the stage's MoE layers' loads (``expert_parallel.stage_expert_loads``): the hottest
            rank keeps its routed copies, the mean compute factor times the balanced rank's; None: balanced.

    Returns:
        Bytes.
    """
    check_stage(layout, stage)
    m = _micro_batches(training, layout)
    per_micro_batch, once = _activation_terms(
        model,
        training,
        layout,
        params,
        load,
        stage_layers(model, layout)[stage],
        stage_moe_layers(model, layout)[stage],
        stage == chunk_stage(layout, output_chunk(layout)),
        m,
    )
    return (
        per_micro_batch * in_flight_micro_batches(layout, stage, m, vocabulary_warmup=training.vocabulary_overlap)
        + once
    )


def _activation_terms(
    model: ModelSpec,
    training: TrainingSpec,
    layout: Layout,
    params: StageParams,
    load: StageExpertLoad | None,
    layers_here: int,
    moe_here: int,
    last_stage: bool,
    micro_batches: int,
) -> tuple[float, float]:
    """``stage_activation_bytes`` as (bytes per micro-batch in flight, bytes held once) of a stage
    holding ``params``, ``layers_here`` layers of which ``moe_here`` MoE, and the last chunk if
    ``last_stage``: stages alike in these differ only in their micro-batches in flight."""
    s, b, t = training.seq_len, layout.micro_batch_size, layout.tensor_parallel_degree
    sp, activation_dtype, recompute = layout.sequence_parallel, training.precision.activations, layout.recompute
    s_local = local_seq_len(training, layout)  # the rank's tokens of each sequence (s / cp)
    per_micro_batch, once = 0.0, 0.0
    working = [0.0]
    for moe, count in ((False, layers_here - moe_here), (True, moe_here)):
        if not count:
            continue
        terms = layer_activations(
            model,
            seq_len=s,
            micro_batch_size=b,
            activation_dtype=activation_dtype,
            tensor_parallel_degree=t,
            sequence_parallel=sp,
            attention_kernel=training.attention_kernel,
            moe=moe,
            expert_load=load.compute_sum / load.moe_layers if moe and load and load.moe_layers else 1.0,
            context_parallel_degree=layout.context_parallel_degree,
            kv_replication=kv_replication(model, layout),
        )
        per_micro_batch += kept_bytes(terms, recompute, layout.recompute_modules) * count
        working.append(rematerialized_bytes(terms, recompute, layout.recompute_modules))
    once += max(working)
    if layers_here:  # one layer's context-parallel attention at a time: what it receives
        once += context_buffer_bytes(model, training, layout)
    if params.embedding_share:  # its token ids (every rank of a vocabulary split looks them up)
        per_micro_batch += embedding_activation_bytes(
            model, seq_len=s_local, micro_batch_size=b, tensor_parallel_degree=t, sequence_parallel=sp
        )
    output = output_layer_activation_bytes(
        model,
        seq_len=s_local,
        micro_batch_size=b,
        activation_dtype=activation_dtype,
        tensor_parallel_degree=t,
        sequence_parallel=sp,
    )
    if params.holds_output_layer:
        once += output * _loss_micro_batches(layout, micro_batches)
    elif params.output_share:  # split over the pipeline: the last stage keeps its final norm's input
        once += vocabulary_activation_bytes(model, training, layout)
        once += output / 2 if last_stage else 0.0
    return per_micro_batch, once


def _mlp_backward_bytes(
    model: ModelSpec, training: TrainingSpec, layout: Layout, load: StageExpertLoad | None, layers: int, moe: int
) -> float:
    """The largest transient one MLP's backward holds on a stage with ``layers`` layers of which
    ``moe`` MoE (``activations.mlp_backward_bytes``): a dense MLP over the rank's s b tokens at
    width f / t; a routed expert over the tokens routed to it, k s b / (E / ep) at width f_e / t
    (the runtime runs a rank's experts one after another; the hottest rank's load,
    ``StageExpertLoad.compute_max``); a shared expert over every token."""
    t = layout.tensor_parallel_degree
    tokens = local_seq_len(training, layout) * layout.micro_batch_size
    widest = tokens * model.ffn_size / t if layers > moe else 0.0
    if moe:
        experts_here = max(1, model.num_local_experts // layout.expert_parallel_degree)
        routed = model.num_experts_per_tok * tokens * (load.compute_max if load else 1.0) / experts_here
        widest = max(widest, routed * model.expert_ffn_size / t, tokens * model.shared_ffn_size / t)
    return mlp_backward_bytes(model, widest, training.precision.activations) if widest else 0.0


def stage_logits_bytes(
    model: ModelSpec, training: TrainingSpec, layout: Layout, stage: int, params: StageParams
) -> float:
    """Logits on the stage holding the output layer: what each micro-batch awaiting its backward
    keeps, plus one micro-batch's transient copies (``loss_element_bytes``). Split over the
    pipeline, every stage's softmax shards (``vocabulary.vocabulary_logits_bytes``).

    Zero on other stages (``params.holds_output_layer``).

    Returns:
        Bytes.
    """
    check_stage(layout, stage)
    if not params.holds_output_layer:
        return vocabulary_logits_bytes(model, training, layout)
    fp32_copy = logits_bytes(
        model,
        seq_len=local_seq_len(training, layout),
        micro_batch_size=layout.micro_batch_size,
        tensor_parallel_degree=layout.tensor_parallel_degree,
    )
    kept, transient = loss_element_bytes(training.precision.activations, layout)
    held = _loss_micro_batches(layout, _micro_batches(training, layout))
    return fp32_copy * (held * kept + transient) / LOGIT_ELEMENT_BYTES


def loss_element_bytes(activation_dtype: DType, layout: Layout) -> tuple[int, int]:
    """Bytes per logit element (s b V / t of them per micro-batch) that the loss keeps for each
    micro-batch awaiting its backward, and that one micro-batch adds at its worst moment.

    Kept: the fp32 softmax, 4 (Megatron-LM's ``vocab_parallel_cross_entropy`` keeps it and
    turns it into the gradient in place; so does our runtime's loss, ``runtime.loss``); under a
    pipeline also the logits in ``activation_dtype`` (``Precision.activations``), act:
    torch.distributed.pipelining's stage
    (our runtime's schedule, as torchtitan's) keeps each stage's output until its backward.
    Without a pipeline the logits die with the loss's forward.
    Transient: in the forward, the logits while their fp32 copy is made (act, already kept under
    a pipeline); in the backward, the fp32 gradient's cast to ``activation_dtype`` (act; none in
    fp32, where the cast is the same tensor).
    bf16/fp16: (4, 2) without a pipeline, (6, 2) with one (2 fp32 copies, as a dry run of a
    pipeline traces them); fp32: (4, 4) and (8, 0).
    """
    act = activation_dtype.bytes
    cast = act if act < LOGIT_ELEMENT_BYTES else 0
    if layout.pipeline_parallel_degree > 1:
        return LOGIT_ELEMENT_BYTES + act, cast
    return LOGIT_ELEMENT_BYTES, act


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


def workspace_bytes(cluster: ClusterProfile) -> float:
    """Framework workspace of one rank: ``CUDA_WORKSPACE_BYTES``, or 0 on a CPU device."""
    return 0.0 if cluster.pricing_device.kind is DeviceKind.CPU else float(CUDA_WORKSPACE_BYTES)


def stage_memory(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    stage: int,
    routing: RoutingStats | None = None,
) -> MemoryBreakdown:
    """Peak bytes of one rank of pipeline stage ``stage``, by term (``LayoutMemory.stage``).

    Raises:
        SchemaError: ``stage`` is not a pipeline rank of ``layout``.
        InfeasibleConfigError: the global batch gives no whole micro-batch per replica.
    """
    check_stage(layout, stage)
    return LayoutMemory(model, training, cluster, layout, routing).stage(stage)


class LayoutMemory:
    """The memory of each pipeline stage of one layout, priced on demand.

    Model states of ``stage_params`` under ZeRO from ``sharding.stage_model_states`` (ZeRO-3's
    gathered buffer counted with the weights; under a pipeline ZeRO 2-3 hold what ZeRO-1 holds).
    Activations from ``stage_activation_bytes``, plus what one MLP's backward transient
    (``_mlp_backward_bytes``) and the staging buffer beside it exceed the loss freed before that
    backward by (``_freed_loss_bytes``: on the stage with the output layer one micro-batch's
    logits, elsewhere nothing), less the staging buffer's own excess; logits from
    ``stage_logits_bytes``; buffers from ``communication_buffer_bytes`` and
    ``pipeline_buffer_bytes`` and what ``reduce_scatter_staging_bytes`` exceeds the logits by and
    ``tied_gradient_sum_bytes`` the activations and logits by (they live after them); workspace
    from ``workspace_bytes``. Terms are summed as if they peak together (an upper bound). A
    calibrated cluster scales the activations, logits and buffers and adds its memory overhead to
    the workspace.

    What the stages share is computed once: the micro-batches, the MoE loads and layers per stage,
    and every term of stages that hold the same parameters, layers and loads (a pipeline's middle
    stages), which then differ only in their micro-batches in flight. A search asks for the
    first stage alone (most layouts that do not fit fail there) and for the others only if needed.

    Raises (on construction):
        InfeasibleConfigError: the global batch gives no whole micro-batch per replica.
    """

    def __init__(
        self,
        model: ModelSpec,
        training: TrainingSpec,
        cluster: ClusterProfile,
        layout: Layout,
        routing: RoutingStats | None = None,
    ) -> None:
        self._model, self._training, self._layout = model, training, layout
        self._micro_batches = _micro_batches(training, layout)
        self._loads = stage_expert_loads(model, training, layout, routing)
        self._layers = stage_layers(model, layout)
        self._moe_layers = stage_moe_layers(model, layout)
        self._params = all_stage_params(model, layout)
        self._last_stage = chunk_stage(layout, output_chunk(layout))
        cal = cluster.calibration
        self._scales = (
            (cal.activation_memory_scale, cal.logits_memory_scale, cal.buffer_memory_scale) if cal else (1.0, 1.0, 1.0)
        )
        self._workspace_bytes = _calibrated_workspace_bytes(cluster)
        self._terms: dict[object, tuple[ModelStates, float, float, float, float]] = {}

    def stage(self, stage: int) -> MemoryBreakdown:
        """Peak bytes of one rank of pipeline stage ``stage``, by term.

        Raises:
            SchemaError: ``stage`` is not a pipeline rank of the layout.
        """
        model, training, layout = self._model, self._training, self._layout
        check_stage(layout, stage)
        params, load = self._params[stage], self._loads[stage]
        layers, moe, last = self._layers[stage], self._moe_layers[stage], stage == self._last_stage
        key = (params, load, layers, moe, last)
        terms = self._terms.get(key)
        if terms is None:
            per_micro_batch, once = _activation_terms(
                model, training, layout, params, load, layers, moe, last, self._micro_batches
            )
            backward = _mlp_backward_bytes(model, training, layout, load, layers, moe)
            logits = stage_logits_bytes(model, training, layout, stage, params)
            # The staging buffer lives after the loss's backward: it adds what it exceeds the logits by.
            # A layer's MLP backward runs beside it, after one micro-batch's loss is freed: the two add
            # what they exceed that loss by, of which the staging buffer's share is counted already
            staging = reduce_scatter_staging_bytes(training, layout, params)
            freed = _freed_loss_bytes(training, layout, params, logits, self._micro_batches)
            terms = (
                stage_model_states(model, layout, params, training.precision),
                per_micro_batch,
                once + max(0.0, staging + backward - freed) - max(0.0, staging - freed),
                logits,
                communication_buffer_bytes(model, training, layout, params, load.compute_max)
                + max(0.0, staging - logits),
            )
            self._terms[key] = terms
        states, per_micro_batch, once, logits, buffers = terms
        activation_scale, logits_scale, buffer_scale = self._scales
        in_flight = in_flight_micro_batches(
            layout, stage, self._micro_batches, vocabulary_warmup=training.vocabulary_overlap
        )
        activations = per_micro_batch * in_flight + once
        # The tied gradient sum's copy lives after the backward: it adds what it exceeds them by
        tied = max(0.0, tied_gradient_sum_bytes(model, training, layout, stage) - activations - logits)
        buffers += pipeline_buffer_bytes(model, training, layout, stage, self._micro_batches, in_flight)
        return MemoryBreakdown(
            weights_bytes=states.weights_bytes,
            gradients_bytes=states.gradients_bytes,
            optimizer_states_bytes=states.optimizer_states_bytes,
            activations_bytes=activations * activation_scale,
            logits_bytes=logits * logits_scale,
            communication_buffers_bytes=(buffers + tied) * buffer_scale,
            workspace_bytes=self._workspace_bytes,
        )

    def all(self) -> tuple[MemoryBreakdown, ...]:
        """Every stage's, in pipeline order."""
        return tuple(self.stage(s) for s in range(self._layout.pipeline_parallel_degree))


def stage_memory_floor(
    model: ModelSpec, training: TrainingSpec, cluster: ClusterProfile, layout: Layout, stage: int
) -> MemoryBreakdown:
    """The terms of ``stage_memory`` that no micro-batch size, recompute, sequence parallelism
    or kind of context parallelism changes: model states and workspace, the other terms 0.

    Its total is at most ``stage_memory``'s (the terms left at 0 are never negative, and rounding
    a sum of floats is monotone in each term), so a layout whose floor does not fit does not fit
    with any micro-batch size, recompute or sequence parallelism: a search prunes with it.

    Raises:
        SchemaError: ``stage`` is not a pipeline rank of ``layout``.
    """
    states = stage_model_states(model, layout, stage_params(model, layout, stage), training.precision)
    return MemoryBreakdown(
        weights_bytes=states.weights_bytes,
        gradients_bytes=states.gradients_bytes,
        optimizer_states_bytes=states.optimizer_states_bytes,
        activations_bytes=0.0,
        logits_bytes=0.0,
        communication_buffers_bytes=0.0,
        workspace_bytes=_calibrated_workspace_bytes(cluster),
    )


def _calibrated_workspace_bytes(cluster: ClusterProfile) -> float:
    """``workspace_bytes`` plus a calibrated cluster's memory overhead (which may be negative)."""
    cal = cluster.calibration
    return workspace_bytes(cluster) + (cal.memory_overhead_bytes if cal else 0.0)


def all_stage_memory(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    routing: RoutingStats | None = None,
) -> tuple[MemoryBreakdown, ...]:
    """``stage_memory`` of every pipeline stage, in pipeline order."""
    return LayoutMemory(model, training, cluster, layout, routing).all()


def peak_stage_memory(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: ClusterProfile,
    layout: Layout,
    routing: RoutingStats | None = None,
) -> MemoryBreakdown:
    """The breakdown of the stage whose rank needs the most memory (the first such stage on ties)."""
    return max(all_stage_memory(model, training, cluster, layout, routing), key=lambda mem: mem.total_bytes)


def _micro_batches(training: TrainingSpec, layout: Layout) -> int:
    """Micro-batches of one pipeline schedule: the step's, over ``TrainingSpec.pipeline_flushes``
    (what is in flight, and what GPipe keeps, is one schedule's)."""
    m = num_micro_batches(training.global_batch_size, layout)
    if m < 1:
        raise InfeasibleConfigError(
            f"global_batch_size={training.global_batch_size} is smaller than data_parallel_degree x "
            f"micro_batch_size = {layout.data_parallel_degree} x {layout.micro_batch_size}; "
            "lower one of them or raise the global batch"
        )
    return max(1, m // pipeline_schedules(layout, training.pipeline_flushes))


def _freed_loss_bytes(
    training: TrainingSpec, layout: Layout, params: StageParams, logits: float, micro_batches: int
) -> float:
    """Of a stage's ``logits`` (``stage_logits_bytes``), what one micro-batch's loss frees before
    its layers' backward: on the stage holding the output layer, that micro-batch's kept logits
    and its transient copy (all of them but GPipe's other micro-batches); elsewhere nothing (the
    softmax shards of a vocabulary split over the pipeline are counted as held)."""
    if not params.holds_output_layer or not logits:
        return 0.0
    kept, transient = loss_element_bytes(training.precision.activations, layout)
    held = _loss_micro_batches(layout, micro_batches)
    return logits * (kept + transient) / (held * kept + transient)


def _loss_micro_batches(layout: Layout, micro_batches: int) -> int:
    """Micro-batches whose output layer and loss await their backward on the last stage."""
    return micro_batches if layout.schedule is Schedule.GPIPE else 1
