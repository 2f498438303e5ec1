"""Activation bytes one rank of a pipeline stage holds at its peak, in bytes.

A stage's layers keep their activations for every micro-batch in flight; recomputation rebuilds
one layer's dropped terms at a time; the stages holding the vocabulary layers keep their inputs;
one MLP's backward holds its temporaries beside all of them. ``cost_models.memory`` sums these
with the model states, logits and buffers.

Sources: per-layer activations from Korthikanti et al. 2022 (``cost_models.activations``);
micro-batches in flight from ``schemas.geometry``; the stage's parameters and layers from
``cost_models.params``; the MoE layers' loads from ``cost_models.expert_parallel``.

Conventions:
  - One MLP's backward (``activations.mlp_backward_bytes``): the largest set of temporaries a
    layer's backward holds at once (2, 6 or 7 tensors of the MLP's width for GELU, SwiGLU,
    GeGLU), beside every activation the rank holds then. A stage without the loss peaks in a
    backward (as dry runs trace: on Mixtral, the 6 x 8,192 x 14,336 x 2 bytes of its expert's
    backward); the stage with the loss adds what it exceeds one micro-batch's logits by, freed
    before it runs.
  - Micro-batches are one pipeline schedule's (``schedule_micro_batches``): what is in flight,
    and what GPipe keeps, is one schedule's.
Under context parallelism every s above is the rank's s / cp tokens of each sequence, and a
stage with layers adds one layer's context-parallel buffers (``context_parallel.context_buffer_bytes``:
the ring's blocks in flight, or the all-to-all's head-split q, k, v and output).
"""

from cost_models.activations import (
    embedding_activation_bytes,
    kept_bytes,
    layer_activations,
    mlp_backward_bytes,
    output_layer_activation_bytes,
    rematerialized_bytes,
)
from cost_models.context_parallel import context_buffer_bytes, kv_replication, local_seq_len
from cost_models.expert_parallel import StageExpertLoad
from cost_models.layout_validity import check_stage
from cost_models.params import StageParams, activation_offloaded, partially_recomputed, stage_moe_layers, stage_params
from cost_models.vocabulary import vocabulary_activation_bytes
from planner.schemas import Layout, ModelSpec, Recompute, Schedule, TrainingSpec
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.geometry import (
    chunk_stage,
    in_flight_micro_batches,
    num_micro_batches,
    output_chunk,
    pipeline_schedules,
    stage_layers,
)


def stage_activation_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    layout: Layout,
    stage: int,
    params: StageParams,
    load: StageExpertLoad | None = None,
) -> float:
    """Activation bytes one rank of stage ``stage`` holds at its peak (``memory.LayoutMemory`` adds
    one MLP's backward transient beside them, against the logits freed before it:
    ``stage_mlp_backward_bytes``).

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
    m = schedule_micro_batches(training, layout)
    per_micro_batch, once, rematerialized, _ = stage_activation_terms(
        model,
        training,
        layout,
        params,
        load,
        stage_layers(model, layout)[stage],
        stage_moe_layers(model, layout)[stage],
        stage == chunk_stage(layout, output_chunk(layout)),
        m,
        partially_recomputed(model, layout)[stage],
        activation_offloaded(model, layout),
    )
    return (
        per_micro_batch * in_flight_micro_batches(layout, stage, m, vocabulary_warmup=training.vocabulary_overlap)
        + once
        + rematerialized
    )


def offloaded_activation_bytes(
    model: ModelSpec, training: TrainingSpec, layout: Layout, load: StageExpertLoad | None = None
) -> float:
    """Bytes per micro-batch the layers ``Layout.activation_offload_layers`` offloads keep on the
    host (the layout has one stage then; ``load``: its MoE layers', None balanced)."""
    if not layout.activation_offload_layers:
        return 0.0
    return stage_activation_terms(
        model,
        training,
        layout,
        stage_params(model, layout, 0),
        load,
        stage_layers(model, layout)[0],
        stage_moe_layers(model, layout)[0],
        True,
        schedule_micro_batches(training, layout),
        offloaded=activation_offloaded(model, layout),
    )[3]


def stage_activation_terms(
    model: ModelSpec,
    training: TrainingSpec,
    layout: Layout,
    params: StageParams,
    load: StageExpertLoad | None,
    layers_here: int,
    moe_here: int,
    last_stage: bool,
    micro_batches: int,
    recomputed: tuple[int, int] = (0, 0),
    offloaded: tuple[int, int] = (0, 0),
) -> tuple[float, float, float, float]:
    """``stage_activation_bytes`` as (bytes per micro-batch in flight, bytes held once, bytes one
    layer rematerializes in its backward under recompute, bytes per micro-batch on the host) of a
    stage holding ``params``, ``layers_here`` layers of which ``moe_here`` MoE, and the last chunk
    if ``last_stage``: stages alike in these differ only in their micro-batches in flight. Under
    ``Layout.recompute_layers`` the stage recomputes ``recomputed`` (dense, MoE) of its layers in
    full and keeps everything of the others (``params.partially_recomputed``); under
    ``Layout.activation_offload_layers`` what ``offloaded`` (dense, MoE) of its layers keep is the
    host's (``params.activation_offloaded``). The rematerialized layer lives in the backward only
    (``memory.LayoutMemory`` weighs it against the loss freed before it)."""
    s, b, t = training.seq_len, layout.micro_batch_size, layout.tensor_parallel_degree
    sp, activation_dtype, modules = layout.sequence_parallel, training.precision.activations, layout.recompute_modules
    recompute = Recompute.NONE if layout.recompute_layers is not None else layout.recompute
    selective = training.selective_recompute
    s_local = local_seq_len(training, layout)  # the rank's tokens of each sequence (s / cp)
    per_micro_batch, once, host = 0.0, 0.0, 0.0
    working = [0.0]
    rebuilt, kept_whole = [0.0], 0.0  # partial recompute: one recomputed layer rebuilt; the layers kept whole
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
            fp8_inputs=training.precision.fp8 is not None and training.precision.fp8.saves_fp8_inputs,
        )
        full, away = recomputed[moe], offloaded[moe]
        whole = kept_bytes(terms, recompute, modules, selective) * (count - full)  # the layers not recomputed in full
        per_micro_batch += whole + kept_bytes(terms, Recompute.FULL) * full
        host += kept_bytes(terms, recompute, modules, selective) * away  # no recompute beside an activation offload
        per_micro_batch -= kept_bytes(terms, recompute, modules, selective) * away
        working.append(rematerialized_bytes(terms, recompute, modules, selective))
        kept_whole += whole
        if full:
            rebuilt.append(rematerialized_bytes(terms, Recompute.FULL))
    # The recomputed layers are a stage's first: their backward runs after the layers kept whole
    # have freed that micro-batch's activations, so a rebuilt layer adds what it exceeds them by.
    working.append(max(0.0, max(rebuilt) - kept_whole))
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
        once += output * loss_micro_batches(layout, micro_batches)
    elif params.output_share:  # split over the pipeline: the last stage keeps its final norm's input
        once += vocabulary_activation_bytes(model, training, layout)
        once += output / 2 if last_stage else 0.0
    return per_micro_batch, once, max(working), host


def stage_mlp_backward_bytes(
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


def schedule_micro_batches(training: TrainingSpec, layout: Layout) -> int:
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


def loss_micro_batches(layout: Layout, micro_batches: int) -> int:
    """Micro-batches whose output layer and loss await their backward on the last stage."""
    return micro_batches if layout.schedule is Schedule.GPIPE else 1
