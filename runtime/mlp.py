"""The MLPs of the reference decoder (``runtime.model``): a dense layer's MLP, and an MoE layer's
routed experts and shared experts.

An MoE layer is Mixtral's sparse block (a router and top-k experts), with the shapes the
Hugging Face families give it and the cost model prices (``cost_models.params``): experts
``moe_intermediate_size`` wide (Qwen-MoE, DeepSeek), and shared experts every token passes
through, built as one MLP ``ModelSpec.shared_ffn_size`` wide (DeepSeek's n_shared_experts x
moe_intermediate_size, transformers' ``DeepseekV3MoE.shared_experts``; Qwen2-MoE's
shared_expert_intermediate_size, scaled per token by a sigmoid gate h x 1). DeepSeek's
group-limited routing (n_group, topk_group) confines each token's experts to its best groups.
"""

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from planner.schemas import Activation, ModelSpec
from runtime.kernels import geglu, swiglu


class MLP(nn.Module):
    """GELU (up, down), or SwiGLU or GEGLU (gate, up, down; ``runtime.kernels.swiglu``, ``geglu``),
    ``width`` wide (default the dense layer's f, ``ModelSpec.ffn_size``)."""

    row_block: int = 1
    """Rows a call's (n, h) input is padded to a multiple of, with zero rows dropped from the output:
    a routed expert's under MXFP8, whose weight gradient is quantized in blocks of 32 tokens
    (``runtime.fp8``), sees however many tokens route to it. Zero rows add nothing to the weight
    gradient nor to a block's scale (its largest magnitude)."""

    def __init__(self, model: ModelSpec, width: int | None = None) -> None:
        super().__init__()
        h, f = model.hidden_size, width or model.ffn_size
        self.gated = model.hidden_act.gated
        self.gated_kernel = geglu if model.hidden_act is Activation.GEGLU else swiglu
        self.gate = nn.Linear(h, f, bias=model.mlp_bias) if self.gated else None
        self.up = nn.Linear(h, f, bias=model.mlp_bias)
        self.down = nn.Linear(f, h, bias=model.mlp_bias)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """The activated intermediate (.., f), before the down projection."""
        return self.gated_kernel(self.gate(x), self.up(x)) if self.gate is not None else F.gelu(self.up(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        pad = -rows % self.row_block if x.dim() == 2 else 0
        out: torch.Tensor = self.down(self.hidden(F.pad(x, (0, 0, 0, pad)) if pad else x))
        return out[:rows] if pad else out


class SharedExpert(MLP):
    """An MoE layer's shared experts as one MLP (``ModelSpec.shared_ffn_size`` wide) that every
    token passes through, beside the routed experts. Qwen2-MoE's output is scaled per token by
    sigmoid(``sigmoid_gate``(x)), an h x 1 projection; the scale multiplies the intermediate
    before the down projection (the same product, down being linear without a bias: the runtime
    refuses a gate beside MLP biases, ``schemas.runtime_support.check_buildable``), so that
    under tensor parallelism each rank scales its own columns.

    ``gate_input`` is set by tensor parallelism (``runtime.tensor_parallel``): the gate's input
    whole on each rank, whose gradient through the gate is partial per rank (each rank's columns)
    and is summed over the group."""

    def __init__(self, model: ModelSpec) -> None:
        super().__init__(model, model.shared_ffn_size)
        gated = model.has_shared_expert_gate
        self.sigmoid_gate = nn.Linear(model.hidden_size, 1, bias=False) if gated else None
        self.gate_input: Callable[[torch.Tensor], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.hidden(x)
        if self.sigmoid_gate is not None:
            scale_input = x if self.gate_input is None else self.gate_input(x)
            hidden = hidden * torch.sigmoid(self.sigmoid_gate(scale_input))
        out: torch.Tensor = self.down(hidden)
        return out


Dispatch = Callable[[nn.ModuleDict, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""How an MoE layer's tokens reach its experts: (experts, tokens (n, h), expert ids (n, k),
weights (n, k)) to the weighted sum of the experts' outputs (n, h)."""


def route(
    logits: torch.Tensor, top_k: int, groups: int = 1, groups_per_token: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixtral's routing (Jiang et al. 2024; transformers' ``MixtralSparseMoeBlock``): softmax over
    the experts in fp32, the top-k, their weights renormalized to sum to 1. With ``groups`` > 1
    (DeepSeek-V2's group-limited routing, n_group and topk_group), a token's experts come from
    the ``groups_per_token`` groups of contiguous experts whose best expert scores highest.

    Args:
        logits: router scores (n, E).
        top_k: experts per token.
        groups: groups of E / groups contiguous experts.
        groups_per_token: groups each token may use (default all).

    Returns:
        (weights (n, k) in the logits' precision, expert ids (n, k)).
    """
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)
    scores = probs
    if groups > 1 and (groups_per_token or groups) < groups:
        n, experts = probs.shape
        best = probs.view(n, groups, experts // groups).amax(dim=-1)
        chosen = torch.zeros_like(best).scatter_(1, torch.topk(best, groups_per_token or groups, dim=-1).indices, 1.0)
        allowed = chosen.repeat_interleave(experts // groups, dim=1).bool()
        scores = probs.masked_fill(~allowed, -1.0)
    _, expert_ids = torch.topk(scores, top_k, dim=-1)
    weights = probs.gather(1, expert_ids)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), expert_ids


class _AddRows(torch.autograd.Function):
    """``target.index_add(0, index, source)`` keeping only ``index`` for the backward: autograd's
    own index_add keeps ``source`` too (its formula expands the gradient to the source's shape),
    one tensor of every routed pair's hidden size per use, which no real MoE layer keeps
    (Megatron-Core's unpermute keeps the indices)."""

    @staticmethod
    def forward(ctx: Any, target: torch.Tensor, index: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        return target.index_add(0, index, source)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, torch.Tensor]:
        (index,) = ctx.saved_tensors
        return grad, None, grad.index_select(0, index)


def add_rows(target: torch.Tensor, index: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """``target`` with the rows of ``source`` added at rows ``index`` (out of place), keeping
    only ``index`` for the backward (``_AddRows``)."""
    out: torch.Tensor = _AddRows.apply(target, index, source)  # type: ignore[no-untyped-call]
    return out


def local_experts(
    experts: nn.ModuleDict, tokens: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Every expert of ``experts`` (keyed by expert id) run on the tokens routed to it, outputs
    weighted and summed per token. Dropless: an expert takes all its tokens. An expert with none
    still runs (on zero rows) so that every rank has a gradient for every expert it holds."""
    out = torch.zeros_like(tokens)
    for name, expert in experts.items():
        token, slot = (expert_ids == int(name)).nonzero(as_tuple=True)
        out = add_rows(out, token, expert(tokens[token]) * weights[token, slot, None])
    return out


class MoE(nn.Module):
    """The routed experts of an MoE layer: a bias-free router, top-k routing (``route``) and
    experts that are MLPs of width ``ModelSpec.expert_ffn_size``; no capacity limit (dropless).
    The shared experts, when the model has them, are the block's ``SharedExpert`` beside it.

    ``dispatch`` is set by expert parallelism (tokens go to the ranks holding their experts);
    unset, the experts held here serve every token. Under tensor parallelism each expert holds
    its rank's part and the layer returns the rank's partial sums, which
    ``runtime.tensor_parallel`` reduces over the group. ``routing_trace``, when a list, receives
    each forward's expert ids (n, k).
    """

    def __init__(self, model: ModelSpec, experts: Sequence[int]) -> None:
        super().__init__()
        self.top_k = model.num_experts_per_tok
        self.groups, self.groups_per_token = model.n_group or 1, model.topk_group
        self.router = nn.Linear(model.hidden_size, model.num_local_experts, bias=False)
        self.experts = nn.ModuleDict({str(e): MLP(model, model.expert_ffn_size) for e in experts})
        self.dispatch: Dispatch | None = None
        self.routing_trace: list[torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, expert_ids = route(self.router(tokens), self.top_k, self.groups, self.groups_per_token)
        if self.routing_trace is not None and _first_pass(x):
            self.routing_trace.append(expert_ids.detach().clone())
        combine = self.dispatch or local_experts
        return combine(self.experts, tokens, expert_ids, weights).view_as(x)


def _first_pass(x: torch.Tensor) -> bool:
    """Whether this forward routes tokens for the first time: not a full recompute's rerun inside
    the backward (the same tokens again), nor a forward on meta tensors (no values)."""
    return not x.is_meta and torch._C._current_graph_task_id() == -1


def moe_layers(model: ModelSpec) -> tuple[int, ...]:
    """The layers whose MLP is a mixture of experts, in model order (``ModelSpec.is_moe_layer``:
    DeepSeek's first dense layers and Qwen-MoE's dense layers are not)."""
    return tuple(i for i in range(model.num_hidden_layers) if model.is_moe_layer(i))
