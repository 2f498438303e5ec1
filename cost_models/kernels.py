"""The elementwise kernels around the GEMMs as they run: fused, or eager (``TrainingSpec.kernels``).

Each function gives the forward ``Traffic`` of one operation: the bytes its kernels read and
write through device memory, and how many kernels it launches. Fused (Transformer Engine,
Megatron-Core, torch.compile) means one kernel per operation that reads its inputs and writes
its output once. Eager means one kernel per tensor operation, as eager PyTorch runs them and as
the planner's own runtime writes them (``runtime.model``, ``runtime.kernels``, ``runtime.loss``,
``runtime.optim``), each intermediate written out and read back. Counts below are per element
of the operation's tensor, with e bytes per activation element, fp32 intermediates 4 bytes;
per-row statistics (a norm's mean, a softmax's maximum and sum) are rows / h of the bytes and
are left out.

- Norm. LayerNorm is one native kernel either way (``F.layer_norm``): read and write, 2e.
  RMSNorm fused: 2e, one kernel. RMSNorm eager (widen to fp32, square, mean, add eps, rsqrt,
  scale, narrow, times the weight; Hugging Face's ``LlamaRMSNorm`` runs the same): (e + 4) +
  8 + 4 + 8 + (4 + e) + 2e = 28 + 4e, seven kernels; in fp32 the widening and narrowing vanish
  (28 bytes, five kernels).
- Activation over the MLP's width. GELU: one kernel, 2e, either way. SwiGLU fused: read gate
  and up, write the product, 3e, one kernel; eager: SiLU (2e) then the product (3e), 5e, two.
- Rotary embedding over the query and key elements. Fused: 2e, one kernel per tensor (two);
  eager (``runtime.model.rotary``): x1 cos, x2 sin and their difference, x1 sin, x2 cos and
  their sum, each product reading and writing half the elements and each sum reading all and
  writing half, then the interleaving stack (2e): 2 (1 + 1 + 1.5) e + 2e = 9e, seven kernels
  per tensor.
- Residual add with dropout. Fused bias-dropout-add: read 2, write 1, plus a 1-byte mask, one
  kernel; eager: dropout (2e + mask) then the add (3e), two kernels; without dropout one add
  (3e) either way.
- The attention core's output back to (tokens, heads x head size): eager copies it (2e, one
  kernel: transpose then reshape); fused attention writes that layout directly.
- Cross-entropy over the logits, forward and backward together. Fused: write the fp32 logits,
  read them for the softmax, write the gradient, 3 x 4 bytes, two kernels. Eager
  (``runtime.loss``): widen (e + 4), maximum (4), subtract (8), exponential (8), sum (4),
  divide (8); backward scale (8) and narrow (4 + e): 48 + 2e, ten kernels. Megatron-LM runs
  the same passes without ``--cross-entropy-loss-fusion``, its default (core_r0.8.0
  ``tensor_parallel/cross_entropy.py``: ``.float()``, ``max``, ``-=``, ``exp(out=)``, ``sum``,
  ``div_``; backward ``mul_`` and the cast back), whatever its other kernels
  (``TrainingSpec.loss_kernels``).
- Adam, per parameter of the rank's shard. Fused (one pass): read and write the fp32 weight
  and both moments, read the gradient, write the training-precision copy, 28 bytes. Eager
  (torch's single-tensor loop, the runtime's fallback): lerp the first moment (12), scale (8)
  and add the square (16) into the second, its root (8), divide (8), add eps (8), the update
  (16), and write the copy (2): 78 bytes.

The backward of a layer's elementwise work moves about twice the forward's bytes through twice
its kernels (``cost_models.layer_time``). Each kernel also costs the device's launch overhead
(``MatmulModel.launch_overhead_s``, as every GEMM does). Units: bytes, kernels.
"""

from dataclasses import dataclass

from planner.schemas import Kernels, NormKind

FP32_BYTES = 4


@dataclass(frozen=True, slots=True)
class Traffic:
    """Bytes moved through device memory and kernels launched."""

    bytes: float = 0.0
    kernels: int = 0

    def __add__(self, other: "Traffic") -> "Traffic":
        return Traffic(self.bytes + other.bytes, self.kernels + other.kernels)


NONE = Traffic()


def norm(kind: NormKind, elements: int, e: int, kernels: Kernels) -> Traffic:
    """One norm over ``elements`` activations of ``e`` bytes (see module docstring)."""
    if kind is NormKind.LAYERNORM or kernels is Kernels.FUSED:
        return Traffic(2.0 * e * elements, 1)
    widen = e < FP32_BYTES  # the widening to fp32 and narrowing back are kernels of their own
    per_element = 20 + 2 * e + (2 * (e + FP32_BYTES) if widen else 0)
    return Traffic(float(per_element * elements), 7 if widen else 5)


def activation(gated: bool, elements: int, e: int, kernels: Kernels) -> Traffic:
    """GELU, or SwiGLU over ``elements`` outputs (the MLP's width times its tokens)."""
    if not gated:
        return Traffic(2.0 * e * elements, 1)
    if kernels is Kernels.FUSED:
        return Traffic(3.0 * e * elements, 1)
    return Traffic(5.0 * e * elements, 2)


def rotary(query_elements: int, key_elements: int, e: int, kernels: Kernels) -> Traffic:
    """Rotary embedding of the query and key slices."""
    per_element, per_tensor = (2, 1) if kernels is Kernels.FUSED else (9, 7)
    return Traffic(float(per_element * e * (query_elements + key_elements)), 2 * per_tensor)


def residual_add(elements: int, e: int, dropout: bool, kernels: Kernels) -> Traffic:
    """Dropout (if any) and the residual add over ``elements`` activations."""
    mask = 1 if dropout else 0
    if not dropout or kernels is Kernels.FUSED:
        return Traffic(float((3 * e + mask) * elements), 1)
    return Traffic(float((5 * e + mask) * elements), 2)


def attention_output(elements: int, e: int, kernels: Kernels) -> Traffic:
    """The attention core's output copied back to token-major layout (eager only)."""
    return NONE if kernels is Kernels.FUSED else Traffic(2.0 * e * elements, 1)


def cross_entropy(logits: int, e: int, kernels: Kernels) -> Traffic:
    """Forward and backward of the loss over ``logits`` elements (tokens x vocabulary shard)."""
    if kernels is Kernels.FUSED:
        return Traffic(3.0 * FP32_BYTES * logits, 2)
    return Traffic(float((48 + 2 * e) * logits), 10)


ADAM_FUSED_BYTES_PER_PARAM = 28
ADAM_EAGER_BYTES_PER_PARAM = 78


def adam_bytes_per_param(kernels: Kernels) -> int:
    """Bytes one Adam step reads and writes per parameter of the rank's shard."""
    return ADAM_FUSED_BYTES_PER_PARAM if kernels is Kernels.FUSED else ADAM_EAGER_BYTES_PER_PARAM
