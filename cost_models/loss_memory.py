"""What the loss holds on one rank, in bytes: the logits of each micro-batch awaiting its
backward, one micro-batch's transient copies, and what one micro-batch's loss frees before its
layers' backward.

Sources: one fp32 copy of the logits, s b V / t elements, from ``cost_models.activations.logits_bytes``
(Megatron-LM's ``vocab_parallel_cross_entropy``); what the loss and the pipeline keep of it in
``loss_element_bytes``; the softmax shards of a vocabulary split over the pipeline from
``cost_models.vocabulary``; the micro-batches whose loss awaits its backward from
``cost_models.stage_activations``. Under context parallelism s is the rank's s / cp tokens of
each sequence.
"""

from cost_models.activations import LOGIT_ELEMENT_BYTES, logits_bytes
from cost_models.context_parallel import local_seq_len
from cost_models.layout_validity import check_stage
from cost_models.params import StageParams
from cost_models.stage_activations import loss_micro_batches, schedule_micro_batches
from cost_models.vocabulary import vocabulary_logits_bytes
from planner.schemas import DType, Layout, LossMethod, ModelSpec, TrainingSpec


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
    kept, transient = loss_element_bytes(training.precision.activations, layout, training.loss_method)
    held = loss_micro_batches(layout, schedule_micro_batches(training, layout))
    return fp32_copy * (held * kept + transient) / LOGIT_ELEMENT_BYTES


def loss_element_bytes(activation_dtype: DType, layout: Layout, method: LossMethod) -> tuple[int, int]:
    """Bytes per logit element (s b V / t of them per micro-batch) that the loss keeps for each
    micro-batch awaiting its backward, and that one micro-batch adds at its worst moment, as the
    loss's ``method`` (``TrainingSpec.loss_method``) computes it. act: ``activation_dtype``'s bytes
    (``Precision.activations``). Under a pipeline, torch.distributed.pipelining's stage (our
    runtime's schedule, as torchtitan's) keeps each stage's output, the logits, until its
    backward; without one the logits die with the loss's forward unless the loss keeps them.

    - fp32-in-place (Megatron-LM's ``vocab_parallel_cross_entropy``, ``runtime.loss``): kept, the
      fp32 softmax, 4 (+ act under a pipeline); transient, the logits while their fp32 copy is made
      in the forward (act, already kept under a pipeline) and the fp32 gradient's cast in the
      backward (act; none in fp32, where the cast is the same tensor). bf16/fp16: (4, 2), (6, 2)
      with a pipeline (2 fp32 copies, as a dry run of a pipeline traces them); fp32: (4, 4), (8, 0).
    - fp32-eager (torch's ``F.cross_entropy`` over ``logits.float()``): kept, the fp32 log-softmax,
      4 (+ act under a pipeline); transient, its backward's two fp32 gradients, 8, while the kept
      one lives: 12 beyond the logits at the worst moment in every precision. Under tensor
      parallelism the logits are split over the vocabulary and the loss runs under torch's
      ``loss_parallel`` (torchtitan's tensor-parallel plan unless ``disable_loss_parallel``), whose
      log-softmax backward builds one fp32 copy more: 12 transient, 16 in all.
    - eager (the same over the logits in their own precision, NeMo AutoModel's benchmark loss):
      kept, the log-softmax, act (+ act under a pipeline); transient, the two gradients, 2 act; 12
      under ``loss_parallel``, which computes in fp32 whatever the logits' precision.
      As torch's MemTracker traces them (tests/cost_models/test_loss_methods.py).
    - fused: kept, the logits (act; the stage's own under a pipeline), the per-token statistics
      being negligible; transient, the gradient written in act. An inductor-compiled
      ``F.cross_entropy(logits.float())`` saves its input and two (tokens, 1) fp32 tensors and
      allocates one act gradient in its backward, nothing logit-sized in its forward (its
      generated code, torch 2.13).
    """
    act = activation_dtype.bytes
    piped = act if layout.pipeline_parallel_degree > 1 else 0
    if method is LossMethod.FUSED:
        return act, act
    if method in (LossMethod.FP32_EAGER, LossMethod.EAGER):
        kept = LOGIT_ELEMENT_BYTES if method is LossMethod.FP32_EAGER else act
        if layout.tensor_parallel_degree > 1:  # loss_parallel: three fp32 copies in its backward
            return kept + piped, 3 * LOGIT_ELEMENT_BYTES
        return kept + piped, 2 * kept
    cast = act if act < LOGIT_ELEMENT_BYTES else 0
    if piped:
        return LOGIT_ELEMENT_BYTES + piped, cast
    return LOGIT_ELEMENT_BYTES, act


def freed_loss_bytes(
    training: TrainingSpec, layout: Layout, params: StageParams, logits: float, micro_batches: int
) -> float:
    """Of a stage's ``logits`` (``stage_logits_bytes``), what one micro-batch's loss frees before
    its layers' backward: on the stage holding the output layer, that micro-batch's kept logits
    and its transient copy (all of them but GPipe's other micro-batches); elsewhere nothing (the
    softmax shards of a vocabulary split over the pipeline are counted as held)."""
    if not params.holds_output_layer or not logits:
        return 0.0
    kept, transient = loss_element_bytes(training.precision.activations, layout, training.loss_method)
    held = loss_micro_batches(layout, micro_batches)
    return logits * (kept + transient) / (held * kept + transient)
