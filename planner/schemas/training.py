"""TrainingSpec: what one optimizer step processes, in which precision, and under which stack."""

from collections.abc import Mapping
from typing import Any, Self

from pydantic import Field, ValidationError, model_validator

from planner.schemas._base import FrozenModel
from planner.schemas.bounds import MAX_GLOBAL_BATCH, MAX_SEQ_LEN, check_at_most
from planner.schemas.enums import (
    AttentionKernel,
    DType,
    Kernels,
    LossMethod,
    MoeDispatcher,
    Optimizer,
    PipelineBuffers,
    SelectiveRecompute,
)
from planner.schemas.errors import SchemaError
from planner.schemas.fp8 import Fp8Recipe, check_param_gather
from planner.schemas.precision import Precision, precision_of
from planner.schemas.stacks import BEHAVIOURS, DEFAULT_STACK, StackName, stack_named


class TrainingSpec(FrozenModel):
    """Global batch, sequence length, precision and optimizer of a training run, and how its
    framework runs it: the ``stack`` gives every behaviour (``stacks.BEHAVIOURS``) a value unless
    the spec is given its own (``overrides``)."""

    __slots__ = ("_precision_memo",)

    global_batch_size: int = Field(ge=1, description="Sequences per optimizer step (B).")
    seq_len: int = Field(ge=1, description="Tokens per sequence (s).")
    dtype: DType = Field(default=DType.BF16, description="bf16/fp16 mean mixed precision with fp32 master weights.")
    fp8: Fp8Recipe | None = Field(
        default=None,
        description=(
            "The FP8 recipe the transformer layers' linear GEMMs run (``fp8.Fp8Recipe``), through the stack's FP8 "
            "library (``Stack.fp8_library``); attention, norms, embeddings, the output layer, the router, the loss "
            "and the optimizer stay in ``dtype``. None: every GEMM in ``dtype``."
        ),
    )
    fp8_bf16_layers: int = Field(
        default=0,
        ge=0,
        description=(
            "With ``fp8``: the first and the last this many transformer layers run in ``dtype`` (Megatron-LM's "
            "--first-last-layers-bf16 with --num-layers-at-start/end-in-bf16; Megatron Bridge's current-scaling "
            "recipes keep 1 and 1)."
        ),
    )
    fp8_param_gather: bool = Field(
        default=False,
        description=(
            "With ``fp8``: sharded weights are all-gathered in FP8 and held in FP8 (Megatron-LM's "
            "--fp8-param-gather, torchao's enable_fsdp_float8_all_gather), for the recipes whose library does it."
        ),
    )
    fp8_experts: bool | None = Field(
        default=None,
        description=(
            "With ``fp8`` and an MoE model: whether the routed experts' GEMMs run in FP8 too. None: as the stack "
            "runs them (``Stack.fp8_experts``: Transformer Engine's grouped linear layers and the planner's runtime "
            "do; torchtitan only where its [quantize.grouped_mm] converters are turned on, for rowwise and mxfp8)."
        ),
    )
    optimizer: Optimizer = Field(default=Optimizer.ADAM)
    stack: StackName = Field(
        default=DEFAULT_STACK,
        description=(
            "The training framework the step is priced for (``stacks.STACKS``): it sets every behaviour below "
            "that is not given. 'planner-runtime' is what `planner run` runs."
        ),
    )
    attention_kernel: AttentionKernel = Field(
        default=AttentionKernel.FLASH,
        description=(
            "'flash' (FlashAttention-2) and 'cudnn' (cuDNN's fused attention, Transformer Engine's default on "
            "Hopper) never store the s x s scores, each at its own rates; 'eager' does (as Megatron-LM did in 2021)."
        ),
    )
    kernels: Kernels = Field(
        default=Kernels.EAGER,
        description=(
            "'fused': the norms, activations, rotary embedding, loss and optimizer step each run as one kernel "
            "(Transformer Engine, Megatron-Core, torch.compile); 'eager': one kernel per tensor operation, each "
            "through memory (eager PyTorch, as the planner's own runtime runs them)."
        ),
    )
    loss_kernels: Kernels | None = Field(
        default=None,
        description=(
            "How the cross-entropy over the logits runs where it differs from 'kernels': 'eager' as Megatron-LM "
            "computes it without --cross-entropy-loss-fusion (its default), one fp32 pass per tensor operation; "
            "None: as 'kernels'."
        ),
    )
    loss_method: LossMethod = Field(
        default=LossMethod.FP32_IN_PLACE,
        description=(
            "What the cross-entropy keeps and allocates per logit: 'fp32-in-place' one fp32 softmax made the gradient "
            "in place (Megatron-LM, the planner's runtime); 'fp32-eager' torch's cross_entropy over fp32 logits, "
            "eager (12 bytes a logit at its worst); 'eager' the same over the logits as they are (NeMo AutoModel's); "
            "'fused' one kernel each way that keeps the logits (torch.compile, flash-attn's Triton loss)."
        ),
    )
    selective_recompute: SelectiveRecompute = Field(
        default=SelectiveRecompute.MODULES,
        description=(
            "What selective recompute keeps and re-runs: 'modules' the layout's recompute_modules (Megatron-Core's "
            "--recompute-modules); 'every-other-matmul' torchtitan's per-op policy, which keeps the attention "
            "kernel's and every other matmul's outputs and re-runs the rest."
        ),
    )
    tp_comm_overlap: bool = Field(
        default=False,
        description=(
            "Tensor parallelism with sequence parallelism: each all-gather and reduce-scatter runs in chunks behind "
            "the GEMM it feeds or follows (Megatron-Core's --tp-comm-overlap with Transformer Engine's userbuffers, "
            "torch's async tensor parallelism). Priced on GPUs; the planner's own runtime runs them synchronously."
        ),
    )
    vocabulary_overlap: bool = Field(
        default=False,
        description=(
            "A vocabulary split over the pipeline (vocab-1, vocab-2) run as Vocabulary Parallelism's own schedule "
            "runs it (its authors' Megatron-LM fork): its collectives behind the transformer layers, with 1 or 2 "
            "more micro-batches in flight. Off: as this planner's runtime runs it, each pass when the stage "
            "that needs it reaches it, within torch's 1F1B."
        ),
    )
    pp_comm_overlap: bool = Field(
        default=True,
        description=(
            "Interleaved pipelines: each steady-state send and receive runs behind the next chunk's compute, as "
            "Megatron-LM runs them by default (--overlap-p2p-communication; Megatron Bridge turns it on with virtual "
            "stages); the transfers that fill and drain the pipeline stay exposed. Priced on GPUs."
        ),
    )
    pipeline_flushes: int = Field(
        default=1,
        ge=1,
        description=(
            "Pipeline schedules a step runs its micro-batches in, gradients accumulated between them: 1 as "
            "Megatron-LM runs every micro-batch in one schedule; the gradient accumulation steps of torchtitan "
            "and NeMo AutoModel, which run one schedule per local batch. Each schedule fills and drains the "
            "pipeline. The planner's runtime runs either (not with the vocabulary split over the pipeline)."
        ),
    )
    pipeline_buffers: PipelineBuffers = Field(
        default=PipelineBuffers.PER_MICRO_BATCH,
        description=(
            "Where pipeline stages receive activations and gradients: 'per-micro-batch' as torch.distributed."
            "pipelining keeps them (a buffer per micro-batch of the schedule, for each chunk's input and output "
            "gradient, for the run), which the planner's runtime and torchtitan run; 'per-transfer' as Megatron-LM "
            "allocates each for its transfer."
        ),
    )
    grad_reduce_dtype: DType | None = Field(
        default=None,
        description=(
            "Precision in which data-parallel ranks sum gradients (all-reduce, reduce-scatter, a tied embedding's "
            "copies); parameter gathers stay in the training precision. None: the frameworks' default, fp32 under "
            "bf16 (Megatron-LM's accumulate_allreduce_grads_in_fp32, forced under bf16; torchtitan's FSDP "
            "reduce_dtype; the planner's own runtime) and the training precision under fp16 and fp32. 'bf16' under "
            "bf16 is Megatron-LM's --grad-reduce-in-bf16."
        ),
    )
    moe_capacity_factor: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Mixture of experts: each expert takes at most this many times its even share of a rank's routed "
            "tokens and drops the rest (GShard, Switch; Megatron-LM's --moe-expert-capacity-factor). "
            "None: dropless, every routed token is computed."
        ),
    )
    moe_pad_to_capacity: bool = Field(
        default=False,
        description="With a capacity factor, every expert computes and exchanges its full capacity, padded.",
    )
    moe_dispatcher: MoeDispatcher = Field(
        default=MoeDispatcher.ALLTOALL,
        description=(
            "Mixture of experts: 'alltoall' sends every (token, expert) pair; 'deepep' sends a token once to each "
            "remote node it is routed to and forwards it there over NVLink (DeepEP, Megatron-Core's flex dispatcher). "
            "The planner's own runtime runs 'alltoall'."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _stack_values(cls, data: Any) -> Any:
        """Fill each behaviour not given from the stack (``stacks.Stack.behaviours``)."""
        if not isinstance(data, dict):
            return data
        stack = stack_named(data.get("stack", DEFAULT_STACK))
        return {**stack.behaviours(data.get("dtype", DType.BF16)), **data}

    @model_validator(mode="after")
    def _check(self) -> Self:
        check_at_most("", {"global_batch_size": self.global_batch_size}, MAX_GLOBAL_BATCH, "any batch")
        check_at_most("", {"seq_len": self.seq_len}, MAX_SEQ_LEN, "any sequence")
        if self.moe_pad_to_capacity and self.moe_capacity_factor is None:
            raise SchemaError(
                "moe_pad_to_capacity needs a moe_capacity_factor (e.g. 1.25); give one or drop the padding"
            )
        self._check_fp8()
        self.precision  # raises where grad_reduce_dtype is neither fp32 nor dtype  # noqa: B018
        return self

    def _check_fp8(self) -> None:
        """Refuse a training precision no run trains in, and an FP8 recipe over fp32, under a stack
        that lacks it, or with an FP8 parameter gather its library cannot do."""
        if not self.dtype.trains:
            raise SchemaError(
                f"dtype={self.dtype.value!r}: runs train in bf16, fp16 or fp32, with FP8 as a recipe over bf16; "
                "give --dtype bf16 --fp8 tensorwise (or another recipe: planner stacks lists each stack's)"
            )
        if self.fp8 is None:
            if self.fp8_bf16_layers:
                raise SchemaError(
                    f"--fp8-bf16-layers {self.fp8_bf16_layers} keeps layers of an FP8 recipe in bf16, but no --fp8 "
                    "recipe is given; give --fp8 RECIPE or drop --fp8-bf16-layers"
                )
            if self.fp8_param_gather:
                raise SchemaError(
                    "--fp8-param-gather gathers the weights of an FP8 recipe, but no --fp8 recipe is given; "
                    "give --fp8 RECIPE or drop --fp8-param-gather"
                )
            if self.fp8_experts:
                raise SchemaError(
                    "--fp8-experts runs the routed experts under an FP8 recipe, but no --fp8 recipe is given; "
                    "give --fp8 RECIPE or drop --fp8-experts"
                )
            return
        if self.dtype is DType.FP32:
            raise SchemaError(
                f"fp8 recipe {self.fp8.value!r} with dtype='fp32': FP8 recipes run over bf16 or fp16 mixed "
                "precision, keeping the weights' copy and every other op in it; give --dtype bf16"
            )
        stack = stack_named(self.stack)
        run = stack.fp8_run(self.fp8)  # raises where the stack lacks the recipe
        if self.fp8_param_gather:
            check_param_gather(run, where=str(self.stack))
        if stack.chooses_fp8_experts(self.fp8, self.fp8_experts):
            return
        if stack.fp8_experts:
            raise SchemaError(
                f"--no-fp8-experts: {self.stack} runs the routed experts under the FP8 recipe with the other linear "
                "layers, and cannot keep them apart; drop --no-fp8-experts, or plan with another --stack"
            )
        if not stack.fp8_expert_recipes:
            raise SchemaError(
                f"--fp8-experts: {self.stack} keeps the routed experts in {self.dtype.value} under every FP8 recipe; "
                "drop --fp8-experts, or plan with another --stack"
            )
        offered = ", ".join(r.value for r in stack.fp8_expert_recipes)
        raise SchemaError(
            f"--fp8-experts with fp8 recipe {self.fp8.value!r}: {self.stack} runs the routed experts' grouped GEMMs "
            f"in FP8 under {offered} only; give one of those, or drop --fp8-experts"
        )

    @property
    def precision(self) -> Precision:
        """What each role is stored, computed and communicated in (``precision.precision_of``):
        derived from ``dtype``, ``grad_reduce_dtype``, ``fp8`` and ``fp8_param_gather``, not
        stored; computed once per object (a search reads it millions of times) and kept in a slot
        that equality, copies and serialization do not see, as ``FrozenModel``'s hash."""
        memo: Precision | None = getattr(self, "_precision_memo", None)
        if memo is None:
            stack = stack_named(self.stack)
            run = None if self.fp8 is None else stack.fp8_run(self.fp8)
            memo = precision_of(
                self.dtype,
                self.grad_reduce_dtype,
                run,
                param_gather=self.fp8_param_gather,
                fp8_experts=stack.fp8_experts if self.fp8_experts is None else self.fp8_experts,
            )
            object.__setattr__(self, "_precision_memo", memo)
        return memo

    @property
    def reduce_dtype(self) -> DType:
        """The precision gradients are summed in: ``grad_reduce_dtype``, or ``default_reduce_dtype``
        (``Precision.gradient_reduce``)."""
        return self.precision.gradient_reduce

    @property
    def overrides(self) -> dict[str, Any]:
        """The behaviours whose values differ from the stack's, by field name (what ``--kernels``
        and the other behaviour options changed)."""
        stack_values = stack_named(self.stack).behaviours(self.dtype)
        return {name: getattr(self, name) for name in BEHAVIOURS if getattr(self, name) != stack_values[name]}

    def under(self, stack: StackName | str) -> "TrainingSpec":
        """This training under another stack: that stack's behaviours, with this training's
        ``overrides`` kept (a value the user chose holds under any framework that runs it)."""
        kept = self.model_dump(exclude={*BEHAVIOURS, "stack"})
        return TrainingSpec.model_validate({**kept, **self.overrides, "stack": StackName(stack)})

    def with_options(self, updates: Mapping[str, Any]) -> "TrainingSpec":
        """This training with some fields given anew (a command's options over a plan's training):
        a new ``stack`` first (``under``), then the other fields over it.

        Raises:
            SchemaError: the fields make no valid training (the message names them).
        """
        base = self.under(updates["stack"]) if "stack" in updates else self
        fields = {name: value for name, value in updates.items() if name != "stack"}
        return training_from({**base.model_dump(), **fields})

    @property
    def tokens_per_step(self) -> int:
        """Tokens processed by one optimizer step."""
        return self.global_batch_size * self.seq_len


def training_from(fields: Mapping[str, Any]) -> TrainingSpec:
    """The TrainingSpec of ``fields`` (a command's options, a plan's training and options over it).

    Raises:
        SchemaError: a value the spec refuses (a number out of its range), named with the reason.
    """
    try:
        return TrainingSpec.model_validate(dict(fields))
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}={err['input']!r}: {err['msg']}" for err in e.errors())
        raise SchemaError(f"training: {problems}") from e


def default_reduce_dtype(dtype: DType) -> DType:
    """The precision data-parallel ranks sum gradients in when training in ``dtype``, unless told:
    fp32 under bf16 (Megatron-LM forces accumulate_allreduce_grads_in_fp32 under bf16; torchtitan's
    FSDP reduces in fp32), else ``dtype`` (Megatron-LM's default under fp16): ``precision_of``'s."""
    return precision_of(dtype).gradient_reduce
