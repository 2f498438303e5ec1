"""Verify a plan's memory without its hardware: build the real runtime for one rank of the plan's
world under a fake process group and fake tensors (nothing is allocated, no peer is needed), and
measure a training step with torch's MemTracker, the method a real CPU run reports.

A first step leaves the optimizer's state in place, as a real run's traced step finds it; then
one step is traced. Without pipeline parallelism the rank runs the trainer's own step, of at
most 3 micro-batches (``TRACED_MICRO_BATCHES``: the same peak). With it, the rank's stage is
driven as its schedule would at its peak: in steady state (one micro-batch forward and backward
first, so the accumulated gradients are there), as many chunk forwards as the schedule keeps in
flight on that rank (schemas.geometry.in_flight_micro_batches, torch's schedules, without the
warm-up Vocabulary Parallelism's own schedule adds), in the schedule's order
(``forward_order``), with activations in the plan's precision received into the buffers the
schedule keeps (``_ReceiveBuffers``: torch's, one per micro-batch), then their backward, then, as the
trainer's step, the sum of a tied embedding's two copies' gradients and the optimizer step.
Under a vocabulary split over the pipeline the rank also runs the passes it joins as a peer, at
its peak (``_stage_step``).
"""

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _State
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode

from planner.schemas import Layout, PipelineBuffers, Plan
from planner.schemas.errors import InfeasibleConfigError
from planner.schemas.geometry import (
    embedding_chunk,
    in_flight_micro_batches,
    num_micro_batches,
    output_chunk,
    pipeline_schedules,
    stage_chunks,
)
from planner.schemas.runtime_support import check_buildable, check_recompute_modules
from runtime.expert_parallel import ExpertExchange, JointOptimizer, Traffic, all_to_all
from runtime.mesh import context_mesh, expert_mesh, layout_mesh, sharding_meshes
from runtime.mlp import MoE, add_rows
from runtime.model import TORCH_DTYPES, loss_fn
from runtime.optim import DataParallelOptimizer
from runtime.trainer import OneCall, Trainer


@dataclass(frozen=True, slots=True)
class DryRunResult:
    """One rank's traced peak memory beside the plan's estimate for its stage."""

    rank: int
    stage: int
    peak_bytes: int
    breakdown_bytes: dict[str, int]
    predicted_bytes: float
    """The estimate's total for the rank's stage, its workspace included."""
    workspace_bytes: float
    """The estimate's workspace (CUDA context, library buffers): no tensor, so no trace sees it."""
    seconds: float


TRACED_MICRO_BATCHES = 3
"""Without a pipeline, a step's peak is reached within its first 3 micro-batches: the first
allocates the accumulated gradients, every later one but the last runs as the second does, and
the last also reduces the gradients (then the optimizer steps). A step of m > 3 micro-batches is
traced as one of 3 with the same micro-batch: the same peak (``test_dry_run_micro_batches``) in
a fraction of the time (the README's llama3-8b rank of 8 micro-batches: 42 s -> 17 s, the same peak
to the byte)."""


def traced_global_batch(plan: Plan, cap: int = TRACED_MICRO_BATCHES) -> int:
    """The global batch a dry run of ``plan`` steps: with a pipeline, one schedule's (the plan's
    over its ``pipeline_flushes``: each schedule holds the same, and gradients accumulate in
    place), or without one that of at most ``cap`` micro-batches per replica
    (``TRACED_MICRO_BATCHES``)."""
    layout, global_batch = plan.layout, plan.training.global_batch_size
    if layout.pipeline_parallel_degree > 1:
        return global_batch // pipeline_schedules(layout, plan.training.pipeline_flushes)
    micro_batches = num_micro_batches(global_batch, layout)
    return global_batch if micro_batches <= cap else layout.data_parallel_degree * layout.micro_batch_size * cap


def dry_run(
    plan: Plan, rank: int, *, optimizer: str = "adamw", micro_batches_cap: int = TRACED_MICRO_BATCHES
) -> DryRunResult:
    """Trace plan rank ``rank`` of ``plan`` (played, as in a real run, by the process of the device
    its DeviceMap gives it), a step of at most ``micro_batches_cap`` micro-batches without a
    pipeline (``TRACED_MICRO_BATCHES``); raises InfeasibleConfigError for a rank outside the world
    for recompute modules the runtime does not checkpoint (it would trace them kept), and for a
    model whose layers the runtime does not build (``schemas.runtime_support.check_buildable``)."""
    world, layout = plan.cluster.world_size, plan.layout
    if not 0 <= rank < world:
        raise InfeasibleConfigError(f"--rank {rank} is outside the plan's world of {world} ranks (0..{world - 1})")
    check_buildable(plan.model)  # else it would trace another model than the estimate priced
    check_recompute_modules(layout)
    if layout.parameter_offload or layout.activation_offload_layers:
        what = (
            "ZeRO-3's weight shards on the host (parameter_offload), which FSDP2 offloads"
            if layout.parameter_offload
            else f"{layout.activation_offload_layers} layers' activations on the host, which the runtime copies there"
        )
        raise InfeasibleConfigError(
            f"the plan keeps {what} from a GPU only: the dry run traces on the CPU and cannot separate them; its "
            "device memory is the estimate's"
        )
    start = time.perf_counter()
    dist.init_process_group("fake", store=FakeStore(), rank=layout.device_map.device_of(rank), world_size=world)
    try:
        mesh = layout_mesh(layout, "cpu")
        experts = expert_mesh(layout, "cpu") if layout.expert_parallel_degree > 1 or layout.folds_experts else None
        sharding = sharding_meshes(layout, "cpu", mesh)
        contexts = context_mesh(layout, "cpu") if layout.context_parallel_degree > 1 else None
        # The backend the real run picks on a CPU (fake tensors would otherwise fall back to the
        # math kernel, which keeps the s x s attention weights for the backward).
        backend = SDPBackend.FLASH_ATTENTION if plan.training.attention_kernel.fused else SDPBackend.MATH
        with (
            FakeTensorMode(allow_non_fake_inputs=True),
            sdpa_kernel(backend),
            _CudaAttentionLayout(),  # type: ignore[no-untyped-call]
            _real_mesh_concatenation(),
        ):
            trainer = Trainer(
                plan.model,
                layout,
                global_batch_size=traced_global_batch(plan, micro_batches_cap),
                seed=0,
                optimizer=optimizer,
                lr=1e-3,
                device=torch.device("cpu"),
                mesh=mesh,
                pipeline_schedule=False,
                dtype=plan.training.dtype,
                reduce_dtype=plan.training.reduce_dtype,
                fp8=plan.training.precision.fp8,
                fp8_param_gather=plan.training.fp8_param_gather,
                fp8_bf16_layers=plan.training.fp8_bf16_layers,
                experts_mesh=experts,
                sharding=sharding,
                contexts_mesh=contexts,
            )
            trainer.report_loss = False
            trainer.fp8_scales_after_step = False  # torchao would read the scales' values
            _route_evenly(trainer)
            peak = _traced_peak(trainer, plan)
    finally:
        dist.destroy_process_group()
    stage = trainer.pp_rank
    # The rank holds the whole step's token ids as its input (int64); those of the sequences a
    # capped trace leaves out are added back, so the peak is the whole step's to the byte.
    untraced_bytes = (plan.training.global_batch_size - trainer.global_batch_size) * plan.training.seq_len * 8
    peak["act"] = peak.get("act", 0) + untraced_bytes
    # Offloaded optimizer states are traced beside the rest (the trace runs on the CPU, which is
    # the host): they live through the whole step, so the device's peak is the traced one less them.
    masters, moments = _host_bytes(trainer.optimizer)
    peak["oth"], peak["opt"] = peak.get("oth", 0) - masters, peak.get("opt", 0) - moments
    total = int(peak.pop("Total")) + untraced_bytes - masters - moments
    return DryRunResult(
        rank,
        stage,
        total,
        {k: int(v) for k, v in peak.items()},
        plan.estimate.stages[stage].memory.total_bytes,
        plan.estimate.stages[stage].memory.workspace_bytes,
        time.perf_counter() - start,
    )


def _host_bytes(optimizer: object) -> tuple[int, int]:
    """The fp32 masters' and the moments' bytes ``optimizer`` keeps on the host (offloaded)."""
    if isinstance(optimizer, DataParallelOptimizer):
        return optimizer.host_bytes()
    if isinstance(optimizer, JointOptimizer):
        parts = [_host_bytes(part) for part in optimizer.parts]
        return sum(m for m, _ in parts), sum(v for _, v in parts)
    return 0, 0


def _route_evenly(trainer: Trainer) -> None:
    """Give every MoE layer of the rank an even dispatch (``_EvenDispatch``): which expert a
    token goes to depends on the tokens' values, which fake tensors do not have."""
    for chunk in trainer.chunks:
        for module in chunk.modules():
            if isinstance(module, MoE):
                exchange = module.dispatch
                group = exchange.group if isinstance(exchange, ExpertExchange) else None
                module.dispatch = _EvenDispatch(group)


class _EvenDispatch:
    """An MoE layer's dispatch under balanced routing, the cost model's assumption without a
    routing trace: each expert held here gets k n / E of the n tokens' routed pairs from each
    rank of the expert-parallel group. It holds what the runtime's dispatch
    (``runtime.expert_parallel.ExpertExchange``, ``runtime.model.local_experts``) holds for its
    backward: each expert's input rows, its intermediates and the exchanged-back outputs the
    weighted combine keeps, with the same exchanges, whose split sizes are fixed here."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.traffic = Traffic()

    def __call__(
        self, experts: nn.ModuleDict, tokens: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        pairs = expert_ids.numel()
        ep = dist.get_world_size(self.group) if self.group is not None else 1
        token = torch.arange(pairs, device=tokens.device) // expert_ids.shape[1]
        splits = [pairs // ep] * ep
        routed = tokens[token]
        received = all_to_all(routed, splits, splits, self.group, self.traffic) if self.group else routed
        rows_per_expert = received.shape[0] // len(experts)
        outputs = torch.zeros_like(received)
        for i, expert in enumerate(experts.values()):
            rows = torch.arange(i * rows_per_expert, (i + 1) * rows_per_expert, device=tokens.device)
            outputs = add_rows(outputs, rows, expert(received[rows]))
        back = all_to_all(outputs, splits, splits, self.group, self.traffic) if self.group else outputs
        return add_rows(torch.zeros_like(tokens), token, back * weights.reshape(-1)[:, None])


def _traced_peak(trainer: Trainer, plan: Plan) -> dict[str, int]:
    training = plan.training
    batch = torch.randint(0, plan.model.vocab_size, (trainer.global_batch_size, training.seq_len))

    def one_step() -> None:
        if trainer.layout.pipeline_parallel_degree == 1:
            trainer.step(batch, batch)
        else:
            _stage_step(trainer, plan)

    # A real run's traced step follows a whole first step (a shorter one, or zero gradients, leaves
    # the tracker counting the next step's gradients twice).
    one_step()
    return tracked_peak(trainer, one_step)


@contextmanager
def _real_mesh_concatenation() -> Iterator[None]:
    """FSDP over tensor-parallel parameters joins the data- and tensor-parallel meshes
    (``DeviceMesh._concatenate``), which finds this rank's coordinates from the rank table's
    values: under fake tensors it has none. The join is bookkeeping on that small table and
    allocates nothing a rank holds, so it runs on real tensors."""
    original = DeviceMesh._concatenate

    def concatenate(meshes: list[DeviceMesh]) -> DeviceMesh:
        with unset_fake_temporarily():
            return original(meshes)

    DeviceMesh._concatenate = staticmethod(concatenate)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        DeviceMesh._concatenate = staticmethod(original)  # type: ignore[method-assign]


class _CudaAttentionLayout(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves __init_subclass__ untyped
    """Lays the CPU flash kernel's output out as the CUDA kernels lay theirs: (b, s, heads, d) in
    memory, seen as (b, heads, s, d). The CUDA flash and memory-efficient kernels run on the
    (b, s, heads, d) transposes of their inputs and return the transpose of their output
    (aten's ``_scaled_dot_product_flash_attention_cuda``), so the output projection's input,
    ``out.transpose(1, 2).reshape(b, s, -1)``, is a view of the output the kernel keeps for its
    backward. The CPU kernel returns (b, heads, s, d) in memory, and that reshape is a second
    copy the GPU run does not hold (one activation of the attention's width per layer)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is not torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default:
            return out
        attention, *rest = out
        b, heads, s, d = attention.shape
        laid_out = attention.new_empty((b, s, heads, d)).transpose(1, 2)
        laid_out.copy_(attention)
        return (laid_out, *rest)


class _RankPeakTracker(MemTracker):  # type: ignore[no-untyped-call]  # torch leaves __init_subclass__ untyped
    """MemTracker keeping the rank's peak only. Its per-module peaks walk every tracked module at
    every allocation, most of a large stage's traced step (cProfile), and are unused here.
    The categories still come from its module hooks, so the peak is the same to the byte. It also
    follows a module called again as the root within a step, as pipeline schedules do."""

    def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
        # A root module called again in the same step (each micro-batch of a pipeline schedule):
        # MemTracker refuses it for the sake of its per-module statistics, which are unused here.
        # Its parameters are tracked already; only its inputs are new.
        if module in self.memory_tracking and not self._mod_tracker.is_bw:
            self._track_inputs_or_outputs(inputs)
            return
        super()._pre_fw_hook(module, inputs)

    def _update_peak_stats(self, peak_state: _State) -> None:
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                self._peak_mem[dev] = snap[_TOTAL_KEY]
                self._peak_mem_snap[dev] = dict(snap)


def tracked_peak(trainer: Trainer, step: Callable[[], None]) -> dict[str, int]:
    """Peak bytes of the tensors PyTorch tracks during ``step`` (MemTracker), by category, and "Total".
    ZeRO-0/1's fp32 master weights are no module's parameters: they count as "oth"."""
    tracker = _RankPeakTracker()
    opt = trainer.optimizer
    external = opt.tracked() if isinstance(opt, DataParallelOptimizer | JointOptimizer) else [opt]
    tracker.track_external(*trainer.modules(), *external)
    trainer.fresh_roots = True
    try:
        with tracker:
            step()
    finally:
        trainer.fresh_roots = False
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    return {str(k).rsplit(".", 1)[-1].lower() if str(k) != "Total" else "Total": int(v) for k, v in peak.items()}


def _stage_step(trainer: Trainer, plan: Plan) -> None:
    """Forward the micro-batches the schedule keeps in flight on this rank, backward them, sum a
    tied embedding's copies' gradients and step (``Trainer.step``'s order: the sum's copy in the
    reduce precision is held after the backward). With more micro-batches in the step than in
    flight, one goes forward and backward first: in the schedule's steady state the stage holds
    its accumulated gradients beside them.

    Under a vocabulary split over the pipeline the first and last stage run their passes from
    their chunks, as in a real run; the passes the rank joins as a peer (from service threads in
    a real run, at whatever point of its own schedule the stage needing them reaches them) run
    here in this thread, where memory is tracked: one of each kind at the stage's peak, with its
    micro-batches in flight."""
    layout = trainer.layout
    in_flight = in_flight_micro_batches(layout, trainer.pp_rank, trainer.micro_batches, vocabulary_warmup=False)
    held = forward_order(layout, round(in_flight * layout.virtual_stages))
    vocabulary = trainer.vocabulary
    peers: list[Callable[[], object]] = []
    trainer.optimizer.zero_grad()
    if vocabulary is not None:  # after zero_grad, as Trainer.step: it sets the shards' gradients
        b, s = trainer.layout.micro_batch_size, plan.training.seq_len
        tokens = torch.randint(0, plan.model.vocab_size, (b * trainer.micro_batches, s))
        peers = [kind[0] for kind in vocabulary.begin_step(tokens, tokens, trainer.micro_batches, serve=False)]
    buffers = _ReceiveBuffers(trainer, plan)
    with trainer.loss_context():
        if trainer.micro_batches * layout.virtual_stages > len(held):
            # one micro-batch through each chunk
            _forward_backward(trainer, plan, buffers, range(layout.virtual_stages))
        _forward_backward(trainer, plan, buffers, held, at_peak=peers)
    if vocabulary is not None:
        vocabulary.end_step()
    trainer.tied.sync(trainer.chunks)
    trainer.optimizer.step()


def forward_order(layout: Layout, steps: int) -> list[int]:
    """The rank's chunk (its position among the rank's chunks) of each of its first ``steps``
    forwards in the schedule: with v chunks, groups of p micro-batches through each chunk in turn
    (Megatron-LM's and torch's interleaved 1F1B); one chunk, every forward through it."""
    p, v = layout.pipeline_parallel_degree, layout.virtual_stages
    return [(j % (p * v)) // p for j in range(steps)]


class _ReceiveBuffers:
    """Where the rank's chunks receive their inputs and their outputs' gradients
    (``TrainingSpec.pipeline_buffers``), each (b, s or s / t under sequence parallelism, h) in the
    plan's precision.

    Per micro-batch, as torch 2.13's pipeline stage, the real run's schedule: allocated at
    its first step and kept, for each of the rank's chunks one buffer per micro-batch of the
    schedule to receive its input activations (all chunks but the model's first:
    ``args_recv_info``) and one to receive its output's gradient (all but the last:
    ``grad_recv_info``); a micro-batch's forward takes its input from its buffer and its backward
    its gradient (``next``: the chunk's micro-batches in turn). Per transfer (Megatron-LM's): each
    input allocated as it arrives, each gradient as its backward begins."""

    def __init__(self, trainer: Trainer, plan: Plan) -> None:
        layout, model = trainer.layout, plan.model
        kept = plan.training.pipeline_buffers is PipelineBuffers.PER_MICRO_BATCH
        s = plan.training.seq_len
        local_s = s // layout.tensor_parallel_degree if layout.sequence_parallel else s
        self._shape, self._dtype = (
            (layout.micro_batch_size, local_s, model.hidden_size),
            TORCH_DTYPES[plan.training.dtype],
        )
        m, chunks = (trainer.micro_batches if kept else 0), stage_chunks(layout, trainer.pp_rank)
        self._receives = [(chunk != embedding_chunk(layout), chunk != output_chunk(layout)) for chunk in chunks]
        self._inputs = [[self._empty() for _ in range(m)] if inputs else [] for inputs, _ in self._receives]
        self._gradients = [[self._empty() for _ in range(m)] if grads else [] for _, grads in self._receives]
        self._turns = [0] * len(chunks)

    def _empty(self) -> torch.Tensor:
        return torch.empty(self._shape, dtype=self._dtype)

    def _take(self, kept: list[torch.Tensor], turn: int) -> torch.Tensor:
        """The kept buffer of micro-batch ``turn``, or one allocated now where none is kept."""
        return kept[turn % len(kept)] if kept else self._empty()

    def next(self, position: int) -> tuple[torch.Tensor | None, Callable[[], torch.Tensor] | None]:
        """The input buffer of the next micro-batch through the chunk at ``position`` and what
        gives its output's gradient when its backward begins (None where the chunk receives none)."""
        turn, self._turns[position] = self._turns[position], self._turns[position] + 1
        receives_input, receives_gradient = self._receives[position]
        inputs, gradients = self._inputs[position], self._gradients[position]
        received = self._take(inputs, turn) if receives_input else None
        return received, (lambda: self._take(gradients, turn)) if receives_gradient else None


def _forward_backward(
    trainer: Trainer,
    plan: Plan,
    buffers: _ReceiveBuffers,
    positions: Sequence[int],
    *,
    at_peak: Sequence[Callable[[], object]] = (),
) -> None:
    """A micro-batch through each of the rank's chunks at ``positions`` forward (the chunks'
    activations the schedule holds at once), its input and gradient in ``buffers``, then
    ``at_peak`` (the rank's vocabulary peer passes), then all of them backward."""
    layout, model, training = trainer.layout, plan.model, plan.training
    b, s = layout.micro_batch_size, training.seq_len
    last = output_chunk(layout)
    chunks = stage_chunks(layout, trainer.pp_rank)
    outputs: list[tuple[torch.Tensor, Callable[[], torch.Tensor] | None]] = []
    kept: list[torch.Tensor | None] = []  # per output: what the schedule keeps until its backward
    for position in positions:
        chunk, index = trainer.chunks[position], chunks[position]
        received, gradient = buffers.next(position)
        # the embedding's token ids, or the previous stage's activations in their buffer
        x = torch.randint(0, model.vocab_size, (b, s)) if received is None else received.detach().requires_grad_()
        out = OneCall(chunk)(x)
        if index == last:  # the loss; the schedule keeps the stage's output (the logits) as well
            loss = trainer.vocabulary.loss if trainer.vocabulary is not None else loss_fn
            outputs.append((loss(out, torch.randint(0, model.vocab_size, (b, s))), None))
            kept.append(out)
        else:  # the schedule keeps the output until its backward, whose gradient is received
            outputs.append((out, gradient))
            kept.append(None)
    for run_pass in at_peak:
        run_pass()
    for i, (out, grad) in enumerate(outputs):
        torch.autograd.backward(out, None if grad is None else grad())
        kept[i] = None
