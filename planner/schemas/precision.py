"""Precision: what each role of training is stored, computed and communicated in.

One ``DType`` per role, so that a recipe whose roles differ (FP8 GEMM inputs beside bf16
weights, weights all-gathered in FP8, ...) has a place to say so, and each cost model reads the
role it prices. ``precision_of`` maps the plan's one ``--dtype`` (and ``grad_reduce_dtype``)
onto it: every role in that precision but the master weights, the optimizer states and the
gradient accumulators, fp32 (mixed precision, Micikevicius et al. 2018; the ZeRO paper's
2 + 2 + 12 bytes a parameter), and the gradients' sum across data-parallel ranks, fp32 under
bf16 unless told otherwise.
"""

import functools
from dataclasses import dataclass
from typing import Final

from planner.schemas.enums import DType
from planner.schemas.errors import SchemaError
from planner.schemas.fp8 import Fp8Devices, RecipeRun

ADAM_MOMENTS: Final = 2
"""Optimizer states a parameter has under Adam: its first and second moments."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Precision:
    """The precision of each role of a training run (module docstring)."""

    weights: DType
    """The copy of the weights the model computes with (the ZeRO paper's fp16 parameters)."""
    gradients: DType
    """The gradients as the backward produces them and the model holds them (the ZeRO paper's
    fp16 gradients)."""
    master_weights: DType | None
    """The optimizer's copy of the weights, which it updates and the compute copy is cast from;
    None where the weights are the master copy (training in fp32)."""
    optimizer_states: DType
    """Each of Adam's moments (``ADAM_MOMENTS`` of them a parameter)."""
    gradient_accumulation: DType
    """What a parameter's gradients are summed into across a step's micro-batches and kept in
    until the optimizer reads them: Megatron-LM's ``main_grad``, FSDP2's sharded gradient (the
    precision of its sharded parameters)."""
    activations: DType
    """The tensors the forward keeps for the backward, the logits before their fp32 loss, and the
    elementwise kernels' inputs and outputs."""
    gemm_inputs: DType
    """What the GEMMs (projections, MLP, experts, output layer) compute in: it picks the device's
    peak FLOP/s and the measured GEMM records that price them. Under an FP8 recipe, what the GEMMs
    it leaves out compute in (the output layer; a linear layer too small for it: ``linear_gemms``)."""
    linear_gemms: DType
    """What the transformer layers' linear GEMMs (projections, MLP, shared and routed experts)
    compute in: ``gemm_inputs``, or fp8/mxfp8 under an FP8 recipe (``fp8``)."""
    fp8: RecipeRun | None
    """The FP8 recipe the linear layers run, as the stack's library runs it (which GEMMs, the
    quantization passes, the weight copies and saved inputs it keeps); None: no FP8."""
    fp8_experts: bool = True
    """Under ``fp8``, whether the routed experts' GEMMs run in FP8 too (``Stack.fp8_experts``)."""
    attention: DType
    """What the attention core (scores, softmax, their product with the values) computes in: it
    picks the fused kernel's records and the rate of the attention GEMMs. A role apart from
    ``gemm_inputs``, as FP8 recipes keep it in bf16 unless told (Transformer Engine's
    ``fp8_dpa``)."""
    gradient_reduce: DType
    """What data-parallel ranks sum gradients in (all-reduce, reduce-scatter, a tied embedding's
    copies): ``TrainingSpec.grad_reduce_dtype``, or the frameworks' default."""
    parameter_gather: DType
    """What ZeRO-1's updated weights and ZeRO-3/FSDP's weights are all-gathered in, and so the
    gathered units ZeRO-3 holds."""
    sequence_gather: DType
    """What sequence parallelism's forward all-gathers of a linear layer's input carry:
    ``activation_communication``, or fp8 where an FP8 recipe's library gathers the quantized
    input (``RecipeRun.fp8_sequence_gather``)."""
    activation_communication: DType
    """What tensor and sequence parallelism's collectives, context parallelism's ring blocks and
    all-to-alls, expert parallelism's all-to-alls and the pipeline's sends carry, and the buffers
    that stage them."""

    @property
    def mixed(self) -> bool:
        """Whether the optimizer keeps master weights apart from the copy the model computes with."""
        return self.master_weights is not None

    def describe(self) -> str:
        """One line of what a run holds and computes in, e.g. "bf16 weights and compute, fp32
        master weights and optimizer states, gradients summed in fp32" (a run report's precision):
        the runtime holds the weights in ``weights`` and computes in them, with no autocast."""
        master = f", {self.master_weights} master weights and" if self.master_weights else " and"
        fp8 = "" if self.fp8 is None else f", linear layers in FP8 ({self.fp8.recipe}, {self.fp8.library})"
        return (
            f"{self.weights} weights and compute{master} {self.optimizer_states} optimizer states, "
            f"gradients summed in {self.gradient_reduce}{fp8}"
        )

    @property
    def master_weight_bytes_per_param(self) -> int:
        """Bytes of the master copy of one parameter: 0 where the weights are the master copy."""
        return 0 if self.master_weights is None else self.master_weights.bytes

    @property
    def optimizer_bytes_per_param(self) -> int:
        """Bytes the optimizer holds for one parameter: its master copy and Adam's moments
        (the ZeRO paper's K: 12 in mixed precision, 8 in fp32)."""
        return self.master_weight_bytes_per_param + ADAM_MOMENTS * self.optimizer_states.bytes

    @property
    def model_state_bytes_per_param(self) -> int:
        """Bytes of model states of one parameter, none sharded: weights, gradients, optimizer."""
        return self.weights.bytes + self.gradients.bytes + self.optimizer_bytes_per_param


@functools.cache
def precision_of(
    dtype: DType,
    grad_reduce: DType | None = None,
    fp8: RecipeRun | None = None,
    *,
    param_gather: bool = False,
    fp8_experts: bool = True,
) -> Precision:
    """The precision of a run trained in ``dtype`` (``TrainingSpec.dtype``), its gradients summed
    across data-parallel ranks in ``grad_reduce`` (``TrainingSpec.grad_reduce_dtype``), its linear
    layers run under the FP8 recipe ``fp8`` (``Stack.fp8_run``), their weights gathered in FP8
    where ``param_gather`` (``TrainingSpec.fp8_param_gather``; the caller has checked the recipe
    does it: ``fp8.check_param_gather``), the routed experts' GEMMs in FP8 where ``fp8_experts``
    (``Stack.fp8_experts``).

    bf16 and fp16 are mixed precision: weights, gradients, activations, GEMMs, attention, gathers
    and activation transfers in ``dtype``; fp32 master weights, Adam moments and gradient
    accumulators. fp32 has no master copy. Gradients are summed in ``grad_reduce``, else in fp32
    under bf16 (Megatron-LM forces ``accumulate_allreduce_grads_in_fp32`` under bf16;
    torchtitan's FSDP reduces in fp32) and in ``dtype`` otherwise (Megatron-LM's default under
    fp16). Under ``fp8`` the linear GEMMs compute in fp8 (mxfp8 for a recipe on MX tensor cores)
    and every other role is as without it (the recipes keep weights, gradients, optimizer and
    activations in the high precision: ``fp8`` module docstring); with ``param_gather`` the
    weights are all-gathered in FP8. Cached: one object per argument tuple, so that memos keyed
    on it hit.

    Raises:
        SchemaError: ``grad_reduce`` is neither fp32 nor ``dtype``.
    """
    if grad_reduce not in (None, DType.FP32, dtype):
        raise SchemaError(
            f"grad_reduce_dtype={grad_reduce.value!r} under dtype={dtype.value!r}: gradients "
            f"are summed in fp32 or in the training precision; give 'fp32' or {dtype.value!r}"
        )
    default_reduce = DType.FP32 if dtype is DType.BF16 else dtype
    return Precision(
        weights=dtype,
        gradients=dtype,
        master_weights=None if dtype is DType.FP32 else DType.FP32,
        optimizer_states=DType.FP32,
        gradient_accumulation=DType.FP32,
        activations=dtype,
        gemm_inputs=dtype,
        linear_gemms=dtype if fp8 is None else DType.MXFP8 if fp8.devices is Fp8Devices.MXFP8 else DType.FP8,
        fp8=fp8,
        fp8_experts=fp8_experts,
        attention=dtype,
        gradient_reduce=default_reduce if grad_reduce is None else grad_reduce,
        parameter_gather=DType.FP8 if fp8 is not None and param_gather else dtype,
        sequence_gather=DType.FP8 if fp8 is not None and fp8.fp8_sequence_gather else dtype,
        activation_communication=dtype,
    )
