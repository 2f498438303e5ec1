"""Stacks: how a training framework runs a layout, as named bundles of the training's behaviours.

The same layout costs a different step time and memory under Megatron-LM than under torchtitan:
one frees each pipeline receive buffer after its transfer, the other keeps one per micro-batch;
one fuses the norms and activations, another runs them op by op. A ``Stack`` names the values of
every such behaviour a ``TrainingSpec`` carries (``BEHAVIOURS``), each with the source that states
it, for one framework as its own code runs it by default (its recipes where the framework is a
library of recipes). ``STACKS`` is the one table: the CLI's ``--stack``, the Python API, the
exports (a plan is re-priced under its target's stack) and the published-run benchmark read it.

A training's own value of a behaviour overrides its stack's (``TrainingSpec.overrides``): a
stack is where the values start, not a lock.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from planner.schemas.enums import (
    AttentionKernel,
    DType,
    Kernels,
    LossMethod,
    MoeDispatcher,
    PipelineBuffers,
    SelectiveRecompute,
)
from planner.schemas.errors import SchemaError
from planner.schemas.fp8 import RECIPE_RUNS, Fp8Library, Fp8Recipe, RecipeRun


class StackName(StrEnum):
    """The training frameworks a plan can be priced for (``STACKS``)."""

    PLANNER_RUNTIME = "planner-runtime"
    MEGATRON_LM = "megatron-lm"
    MEGATRON_BRIDGE = "megatron-bridge"
    TORCHTITAN = "torchtitan"
    NEMO_AUTOMODEL = "nemo-automodel"
    DEEPSPEED = "deepspeed"
    LLM_FOUNDRY = "llm-foundry"


BEHAVIOURS = (
    "attention_kernel",
    "kernels",
    "loss_kernels",
    "loss_method",
    "selective_recompute",
    "tp_comm_overlap",
    "pp_comm_overlap",
    "pipeline_buffers",
    "pipeline_flushes",
    "vocabulary_overlap",
    "grad_reduce_dtype",
    "moe_dispatcher",
)
"""The ``TrainingSpec`` fields a stack sets: how the framework runs the step, not what it trains."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    """One framework's values of the behaviours (``BEHAVIOURS``), each with its source."""

    name: StackName
    summary: str
    """One line: what the stack is, as ``planner stacks`` lists it."""
    attention_kernel: AttentionKernel
    kernels: Kernels
    loss_kernels: Kernels | None
    """None: the loss runs as ``kernels``."""
    loss_method: LossMethod
    selective_recompute: SelectiveRecompute
    tp_comm_overlap: bool
    pp_comm_overlap: bool
    pipeline_buffers: PipelineBuffers
    pipeline_flushes: int
    schedule_per_accumulation_step: bool
    """Whether the framework runs each gradient-accumulation step as its own pipeline schedule
    (torchtitan's and NeMo AutoModel's trainers), so that a run's accumulation steps are its
    ``pipeline_flushes``; otherwise every micro-batch of a step runs in one schedule."""
    vocabulary_overlap: bool
    reduce_in_training_dtype: bool
    """Whether gradients are summed in the training precision (bf16 under bf16) rather than the
    common default, fp32 under bf16 (``TrainingSpec.grad_reduce_dtype`` None)."""
    moe_dispatcher: MoeDispatcher
    sources: Mapping[str, str]
    """Where each behaviour's value comes from, by field name (every field of ``BEHAVIOURS``)."""
    fp8_library: Fp8Library | None
    """The library that runs the stack's FP8 linear layers; None: the stack trains in FP8 not at all."""
    fp8_recipes: tuple[Fp8Recipe, ...]
    """The FP8 recipes the stack offers (each one its library runs: ``fp8.RECIPE_RUNS``)."""
    fp8_source: str
    """Where the stack's FP8 library and recipes come from."""
    gradients_on_demand: bool
    """Whether each gradient is allocated by the backward that produces it and dropped after the
    update (torch's ``param.grad`` under ``zero_grad(set_to_none=True)``, FSDP2's sharded
    gradients), rather than held in a buffer allocated once for the run (Megatron-Core's
    contiguous gradient buffer). On demand, a stage that runs no forward after its first backward
    (one micro-batch, or all of them in flight) fills its gradients while that backward frees its
    activations: they add to the peak only what they exceed the freed activations by."""
    gradients_source: str
    """Where ``gradients_on_demand`` comes from."""
    offloads_master_weights: bool = True
    """Whether an optimizer offload (``Layout.optimizer_offload_fraction``) takes the fp32 master
    weights off the device with the moments, 12 bytes a parameter in mixed precision (DeepSpeed's
    ZeRO-Offload keeps "the fp32 parameters" on the host, SC20/ATC21 sec. 3; the planner's runtime
    moves master slices), or the moments alone, 8 (Megatron-Core's hybrid device optimizer:
    Megatron-Bridge's CPU offloading guide says it offloads "optimizer states (Adam momentum +
    variance)"; ``benchmarks/published_offload.py`` checks the savings its guide and NeMo-RL
    measured). The host holds the master either way."""
    overlaps_activation_offload: bool = False
    """Whether an activation offload (``Layout.activation_offload_layers``) copies on a side stream
    behind the compute (Transformer Engine's CPU offload context under Megatron-Core: a layer's
    saved tensors go down while the next layer computes, and come back while the later layers'
    backward runs), or on the compute's stream, in series with it (torch's ``save_on_cpu``, which
    the planner's runtime uses: a blocking copy down in the forward, up at first use in the
    backward)."""
    fp8_experts: bool = True
    """Whether its FP8 recipes run the routed experts' GEMMs in FP8 by default: Transformer Engine's
    grouped linear layers do, and the planner's runtime converts each expert's linear layers;
    torchtitan and NeMo AutoModel run them as grouped GEMMs that torchao's Float8Linear does not
    convert (``TrainingSpec.fp8_experts`` chooses otherwise where ``fp8_expert_recipes`` allows)."""
    fp8_experts_source: str = "Transformer Engine's grouped linear layers run under its fp8_autocast with the others"
    """Where ``fp8_experts`` (and ``fp8_expert_recipes``) come from."""
    fp8_expert_recipes: tuple[Fp8Recipe, ...] = ()
    """The FP8 recipes under which a plan may run the routed experts in FP8 where the stack does not by
    default (``TrainingSpec.fp8_experts``): torchtitan's grouped-GEMM converters, rowwise
    (``quantize.grouped_mm.float8``) and MXFP8 (``quantize.grouped_mm.mx``)."""

    def chooses_fp8_experts(self, recipe: Fp8Recipe, experts: bool | None) -> bool:
        """Whether a plan under ``recipe`` may run the routed experts as ``experts`` says (True: in
        FP8; False: in the training precision; None: as the stack does): its default, or a choice
        ``fp8_expert_recipes`` allows."""
        return experts is None or experts == self.fp8_experts or (experts and recipe in self.fp8_expert_recipes)

    def fp8_run(self, recipe: Fp8Recipe | str) -> RecipeRun:
        """What this stack does under FP8 ``recipe``.

        Raises:
            SchemaError: the stack does not offer the recipe (the message says which it does, or that
                it trains in FP8 not at all).
        """
        wanted = Fp8Recipe(recipe)
        if self.fp8_library is None:
            raise SchemaError(
                f"fp8 recipe {wanted.value!r}: {self.name} does not train in FP8 ({self.fp8_source}); "
                "train in bf16, or give a --stack that does (planner stacks)"
            )
        if wanted not in self.fp8_recipes:
            offered = ", ".join(r.value for r in self.fp8_recipes)
            raise SchemaError(
                f"fp8 recipe {wanted.value!r}: {self.name} runs FP8 with {self.fp8_library.value} and offers "
                f"{offered}; give one of those, or another --stack"
            )
        return RECIPE_RUNS[self.fp8_library, wanted]

    def behaviours(self, dtype: DType | str) -> dict[str, object]:
        """The TrainingSpec fields this stack sets, for a training in ``dtype``."""
        values: dict[str, object] = {name: getattr(self, name) for name in BEHAVIOURS if name != "grad_reduce_dtype"}
        values["grad_reduce_dtype"] = DType(dtype) if self.reduce_in_training_dtype else None
        return values


_P2P_SOURCE = (
    "Megatron-LM's p2p_communication allocates each received tensor for its transfer and frees each sent "
    "output's data once sent (deallocate_pipeline_outputs)"
)
_FP32_REDUCE = (
    "fp32 under bf16: Megatron-Core forces accumulate_allreduce_grads_in_fp32 under bf16 (--grad-reduce-in-bf16 "
    "to change it)"
)
_NO_VOCABULARY_OVERLAP = "only Vocabulary Parallelism's own Megatron-LM fork overlaps the split vocabulary's passes"
_ONE_FLUSH = "every micro-batch of a step in one pipeline schedule"
_PER_LOCAL_BATCH = (
    "one pipeline schedule per local batch, gradients accumulated over them: 1 unless the run accumulates "
    "gradients (give --pipeline-flushes with its accumulation steps)"
)
_PIPELINING_OVERLAP = (
    "torch.distributed.pipelining's multi-stage schedules post a step's sends and receives beside its compute"
)
_PIPELINING_BUFFERS = "torch.distributed.pipelining keeps a receive buffer per micro-batch"
_ALLTOALL = "the all-to-all dispatcher (DeepEP: --moe-dispatcher deepep)"
_TE_ATTENTION = (
    "Transformer Engine's attention: its backend selection prefers cuDNN's FusedAttention over FlashAttention "
    "on Hopper and later (dot_product_attention/utils.py get_attention_backend, 'for performance reasons')"
)

_FSDP2_GRADIENTS = (
    "FSDP2 allocates each sharded gradient at its reduce-scatter and the unsharded ones per unit during the backward"
)
_MEGATRON_GRADIENTS = (
    "Megatron-Core's DistributedDataParallel allocates one contiguous gradient buffer at construction "
    "(param_and_grad_buffer.py), held for the run"
)
_TE_RECIPES = (Fp8Recipe.DELAYED, Fp8Recipe.TENSORWISE, Fp8Recipe.BLOCKWISE, Fp8Recipe.MXFP8)
_TORCHAO_RECIPES = (Fp8Recipe.TENSORWISE, Fp8Recipe.ROWWISE, Fp8Recipe.ROWWISE_GW_HP)

STACKS: Mapping[StackName, Stack] = MappingProxyType(
    {
        StackName.PLANNER_RUNTIME: Stack(
            name=StackName.PLANNER_RUNTIME,
            summary="this planner's own runtime (planner run): eager PyTorch on torch.distributed and FSDP2",
            attention_kernel=AttentionKernel.FLASH,
            kernels=Kernels.EAGER,
            loss_kernels=None,
            loss_method=LossMethod.FP32_IN_PLACE,
            selective_recompute=SelectiveRecompute.MODULES,
            tp_comm_overlap=False,
            pp_comm_overlap=True,
            pipeline_buffers=PipelineBuffers.PER_MICRO_BATCH,
            pipeline_flushes=1,
            schedule_per_accumulation_step=False,
            vocabulary_overlap=False,
            reduce_in_training_dtype=False,
            moe_dispatcher=MoeDispatcher.ALLTOALL,
            sources={
                "attention_kernel": "runtime/model.py: F.scaled_dot_product_attention, FlashAttention-2 on GPUs",
                "kernels": "runtime/model.py runs eager PyTorch, one kernel per tensor operation (no torch.compile)",
                "loss_kernels": "runtime/loss.py: F.cross_entropy over fp32 logits, as the other kernels",
                "loss_method": "runtime/loss.py keeps one fp32 softmax and makes it the gradient in place",
                "selective_recompute": "runtime/model.py checkpoints the layout's recompute_modules",
                "tp_comm_overlap": "runtime's tensor-parallel collectives run synchronously "
                "(runtime_support refuses the overlap)",
                "pp_comm_overlap": _PIPELINING_OVERLAP,
                "pipeline_buffers": _PIPELINING_BUFFERS,
                "pipeline_flushes": _ONE_FLUSH,
                "vocabulary_overlap": "runtime runs each vocabulary pass when its stage reaches it",
                "grad_reduce_dtype": "runtime's FSDP2 MixedPrecisionPolicy reduces in fp32 under bf16",
                "moe_dispatcher": "runtime's expert parallelism is one all-to-all of every (token, expert) pair",
            },
            gradients_on_demand=True,
            gradients_source=_FSDP2_GRADIENTS
            + "; runtime/optim.py leaves ZeRO-0/1 gradients to autograd and its zero_grad sets them "
            "to None (as planner run --dry-run traces)",
            fp8_library=Fp8Library.TORCHAO,
            fp8_recipes=(*_TORCHAO_RECIPES, Fp8Recipe.MXFP8),
            fp8_source="runtime/fp8.py converts the transformer layers' linear layers with torchao's "
            "convert_to_float8_training (recipe_name tensorwise, rowwise, rowwise_with_gw_hp; planner[fp8]), and "
            "for mxfp8 swaps their weights for torchao's MXFP8 training weights (MXFP8TrainingOpConfig, "
            "recipe mxfp8_rceil on Blackwell, its emulation on a CPU)",
            fp8_experts_source="runtime/fp8.py converts each routed expert's linear layers with the others "
            "(runtime_support refuses mxfp8 for them: their tokens are not padded to its blocks)",
        ),
        StackName.MEGATRON_LM: Stack(
            name=StackName.MEGATRON_LM,
            summary="Megatron-LM's pretrain_gpt.py (Megatron-Core with Transformer Engine) at its argument defaults",
            attention_kernel=AttentionKernel.CUDNN,
            kernels=Kernels.FUSED,
            loss_kernels=Kernels.EAGER,
            loss_method=LossMethod.FP32_IN_PLACE,
            selective_recompute=SelectiveRecompute.MODULES,
            tp_comm_overlap=False,
            pp_comm_overlap=True,
            pipeline_buffers=PipelineBuffers.PER_TRANSFER,
            pipeline_flushes=1,
            schedule_per_accumulation_step=False,
            vocabulary_overlap=False,
            reduce_in_training_dtype=False,
            moe_dispatcher=MoeDispatcher.ALLTOALL,
            sources={
                "attention_kernel": "--attention-backend auto lets " + _TE_ATTENTION,
                "kernels": "Transformer Engine's layers and Megatron-Core's fused bias-activation, softmax, "
                "rotary and optimizer kernels",
                "loss_kernels": "arguments.py: --cross-entropy-loss-fusion is store_true, off by default "
                "(vocab_parallel_cross_entropy, one fp32 pass per tensor operation)",
                "loss_method": "vocab_parallel_cross_entropy keeps its fp32 exp-logits, the softmax, and makes them "
                "the gradient in place",
                "selective_recompute": "--recompute-modules (core_attn by default)",
                "tp_comm_overlap": "arguments.py: --tp-comm-overlap is store_true, off by default",
                "pp_comm_overlap": "arguments.py: --no-overlap-p2p-communication is store_false (overlap on with "
                "virtual stages)",
                "pipeline_buffers": _P2P_SOURCE,
                "pipeline_flushes": _ONE_FLUSH,
                "vocabulary_overlap": _NO_VOCABULARY_OVERLAP,
                "grad_reduce_dtype": _FP32_REDUCE,
                "moe_dispatcher": "--moe-token-dispatcher-type alltoall, as its MoE recipes set it (the argument's "
                "default, allgather, is not priced)",
            },
            gradients_on_demand=False,
            offloads_master_weights=False,
            overlaps_activation_offload=True,
            gradients_source=_MEGATRON_GRADIENTS,
            fp8_library=Fp8Library.TRANSFORMER_ENGINE,
            fp8_recipes=_TE_RECIPES,
            fp8_source="arguments.py: --transformer-impl transformer_engine (the default); --fp8-recipe "
            "{tensorwise,delayed,mxfp8,blockwise} with --fp8-format",
        ),
        StackName.MEGATRON_BRIDGE: Stack(
            name=StackName.MEGATRON_BRIDGE,
            summary="NeMo Megatron-Bridge's recipes (Megatron-Core with Transformer Engine, fused loss)",
            attention_kernel=AttentionKernel.CUDNN,
            kernels=Kernels.FUSED,
            loss_kernels=None,
            loss_method=LossMethod.FP32_IN_PLACE,
            selective_recompute=SelectiveRecompute.MODULES,
            tp_comm_overlap=False,
            pp_comm_overlap=True,
            pipeline_buffers=PipelineBuffers.PER_TRANSFER,
            pipeline_flushes=1,
            schedule_per_accumulation_step=False,
            vocabulary_overlap=False,
            reduce_in_training_dtype=False,
            moe_dispatcher=MoeDispatcher.ALLTOALL,
            sources={
                "attention_kernel": _TE_ATTENTION,
                "kernels": "Megatron-Core with Transformer Engine, its model providers' fusions on",
                "loss_kernels": "its GPT model providers set cross_entropy_loss_fusion True",
                "loss_method": "Megatron-Core's fused_vocab_parallel_cross_entropy keeps the fp32 softmax and makes it "
                "the gradient in place, as the unfused one",
                "selective_recompute": "its recipes' recompute_modules (Megatron-Core's)",
                "tp_comm_overlap": "off unless a recipe's CommOverlapConfig turns it on (--tp-comm-overlap)",
                "pp_comm_overlap": "Megatron-Bridge overlaps pipeline transfers with virtual stages",
                "pipeline_buffers": _P2P_SOURCE + " (Megatron-Core's schedules)",
                "pipeline_flushes": _ONE_FLUSH,
                "vocabulary_overlap": _NO_VOCABULARY_OVERLAP,
                "grad_reduce_dtype": _FP32_REDUCE,
                "moe_dispatcher": _ALLTOALL,
            },
            gradients_on_demand=False,
            offloads_master_weights=False,
            overlaps_activation_offload=True,
            gradients_source=_MEGATRON_GRADIENTS,
            fp8_library=Fp8Library.TRANSFORMER_ENGINE,
            fp8_recipes=_TE_RECIPES,
            fp8_source="training/mixed_precision.py: bf16_with_fp8_delayed_scaling_mixed, "
            "bf16_with_fp8_current_scaling_mixed, bf16_with_fp8_subchannel_scaling_mixed, bf16_with_mxfp8_mixed",
        ),
        StackName.TORCHTITAN: Stack(
            name=StackName.TORCHTITAN,
            summary="torchtitan's trainer (FSDP2, torch.distributed.pipelining) with torch.compile on",
            attention_kernel=AttentionKernel.FLASH,
            kernels=Kernels.FUSED,
            loss_kernels=None,
            loss_method=LossMethod.FUSED,
            selective_recompute=SelectiveRecompute.EVERY_OTHER_MATMUL,
            tp_comm_overlap=False,
            pp_comm_overlap=True,
            pipeline_buffers=PipelineBuffers.PER_MICRO_BATCH,
            pipeline_flushes=1,
            schedule_per_accumulation_step=True,
            vocabulary_overlap=False,
            reduce_in_training_dtype=False,
            moe_dispatcher=MoeDispatcher.ALLTOALL,
            sources={
                "attention_kernel": "PyTorch's SDPA, FlashAttention-2 on GPUs",
                "kernels": "its benchmark runs set [compile] enable (torch.compile fuses the elementwise work)",
                "loss_kernels": "the loss is compiled with the model",
                "loss_method": "components/loss.py: build_cross_entropy_loss compiles F.cross_entropy(pred.float()) "
                "where [compile] components holds 'loss', as its default ['model', 'loss'] does (its 2024-12 train.py "
                "left the loss eager: fp32-eager)",
                "selective_recompute": "its llama3 configs set [activation_checkpoint] selective_ac_option 'op': "
                "the policy saves aten.mm outputs but every second one, the SDPA kernels', reduce-scatters' and "
                "max's, and recomputes the rest (distributed/activation_checkpoint.py)",
                "tp_comm_overlap": "async tensor parallelism is off unless [parallelism] enable_async_tensor_parallel",
                "pp_comm_overlap": _PIPELINING_OVERLAP,
                "pipeline_buffers": _PIPELINING_BUFFERS,
                "pipeline_flushes": _PER_LOCAL_BATCH,
                "vocabulary_overlap": _NO_VOCABULARY_OVERLAP,
                "grad_reduce_dtype": "FSDP2's MixedPrecisionPolicy reduce_dtype float32 ([training] "
                "mixed_precision_reduce)",
                "moe_dispatcher": _ALLTOALL,
            },
            gradients_on_demand=True,
            gradients_source=_FSDP2_GRADIENTS + "; train.py's optimizers.zero_grad() sets them to None",
            fp8_library=Fp8Library.TORCHAO,
            fp8_recipes=(*_TORCHAO_RECIPES, Fp8Recipe.MXFP8),
            fp8_source="components/quantization/float8.py and mx.py convert with torchao: [quantize.linear.float8] "
            "recipe_name tensorwise, rowwise, rowwise_with_gw_hp; [quantize.linear.mx] mxfp8_cublas",
            fp8_experts=False,
            fp8_experts_source="components/quantization: [quantize.grouped_mm.float8] (rowwise) and "
            "[quantize.grouped_mm.mx] convert the grouped expert GEMMs of the modules in fqns, empty by default "
            "(prototypes)",
            fp8_expert_recipes=(Fp8Recipe.ROWWISE, Fp8Recipe.MXFP8),
        ),
        StackName.NEMO_AUTOMODEL: Stack(
            name=StackName.NEMO_AUTOMODEL,
            summary="NeMo AutoModel (PyTorch-native FSDP2 and pipelining, Transformer Engine kernels)",
            attention_kernel=AttentionKernel.CUDNN,
            kernels=Kernels.FUSED,
            loss_kernels=None,
            loss_method=LossMethod.EAGER,
            selective_recompute=SelectiveRecompute.MODULES,
            tp_comm_overlap=False,
            pp_comm_overlap=True,
            pipeline_buffers=PipelineBuffers.PER_MICRO_BATCH,
            pipeline_flushes=1,
            schedule_per_accumulation_step=True,
            vocabulary_overlap=False,
            reduce_in_training_dtype=False,
            moe_dispatcher=MoeDispatcher.ALLTOALL,
            sources={
                "attention_kernel": "its performance summary states 'Kernel optimizations: TE': " + _TE_ATTENTION,
                "kernels": "Transformer Engine's fused layers",
                "loss_kernels": "as its other kernels",
                "loss_method": "its benchmark configs (examples/benchmark/configs) set loss_fn MaskedCrossEntropy "
                "with fp32_upcast false: torch's F.cross_entropy over the bf16 logits",
                "selective_recompute": "not checked against its activation checkpointing: priced as "
                "Megatron-Core's modules",
                "tp_comm_overlap": "no tensor-parallel overlap is stated",
                "pp_comm_overlap": _PIPELINING_OVERLAP,
                "pipeline_buffers": "its pipeline is torch.distributed.pipelining's: a receive buffer per micro-batch",
                "pipeline_flushes": _PER_LOCAL_BATCH,
                "vocabulary_overlap": _NO_VOCABULARY_OVERLAP,
                "grad_reduce_dtype": "FSDP2's MixedPrecisionPolicy reduce_dtype float32",
                "moe_dispatcher": _ALLTOALL,
            },
            gradients_on_demand=True,
            gradients_source=_FSDP2_GRADIENTS,
            fp8_library=Fp8Library.TORCHAO,
            fp8_recipes=_TORCHAO_RECIPES,
            fp8_source="components/quantization/fp8.py converts with torchao Float8 (docs/guides/fp8_training.md: "
            "recipe_name tensorwise, rowwise or rowwise_with_gw_hp)",
            fp8_experts=False,
            fp8_experts_source="its MoE runs grouped GEMMs, which torchao's Float8Linear does not convert",
        ),
        StackName.DEEPSPEED: Stack(
            name=StackName.DEEPSPEED,
            summary="DeepSpeed's engine around an eager PyTorch model (ZeRO, its pipeline engine)",
            attention_kernel=AttentionKernel.FLASH,
            kernels=Kernels.EAGER,
            loss_kernels=None,
            loss_method=LossMethod.FP32_EAGER,
            selective_recompute=SelectiveRecompute.MODULES,
            tp_comm_overlap=False,
            pp_comm_overlap=False,
            pipeline_buffers=PipelineBuffers.PER_TRANSFER,
            pipeline_flushes=1,
            schedule_per_accumulation_step=False,
            vocabulary_overlap=False,
            reduce_in_training_dtype=True,
            moe_dispatcher=MoeDispatcher.ALLTOALL,
            sources={
                "attention_kernel": "the model's own attention, PyTorch's SDPA (FlashAttention-2 on GPUs)",
                "kernels": "DeepSpeed wraps the user's eager model; it fuses none of its elementwise work",
                "loss_kernels": "as its other kernels",
                "loss_method": "the model's own loss, eager: torch's cross_entropy over fp32 logits, as Hugging Face's "
                "causal LMs compute it",
                "selective_recompute": "its activation checkpointing re-runs what the model's code checkpoints: "
                "priced as Megatron-Core's modules",
                "tp_comm_overlap": "AutoTP runs its collectives synchronously",
                "pp_comm_overlap": "its PipelineEngine runs 1F1B, no interleaved schedule to overlap",
                "pipeline_buffers": "its PipelineEngine reuses min(stages - stage, micro-batches) buffers, the "
                "micro-batches in flight",
                "pipeline_flushes": _ONE_FLUSH,
                "vocabulary_overlap": _NO_VOCABULARY_OVERLAP,
                "grad_reduce_dtype": "engine.py communication_data_type: the training precision unless the config "
                "sets communication_data_type",
                "moe_dispatcher": "DeepSpeed-MoE's all-to-all",
            },
            gradients_on_demand=False,
            gradients_source="ZeRO-1/2 keep contiguous gradient partitions and reduction buckets (stage_1_and_2.py): "
            "priced as held through the step",
            fp8_library=None,
            fp8_recipes=(),
            fp8_source="DeepSpeed's engine converts no layer to FP8; FP8 comes from the model's own code (Transformer "
            "Engine modules), which a config cannot set",
        ),
        StackName.LLM_FOUNDRY: Stack(
            name=StackName.LLM_FOUNDRY,
            summary="Databricks LLM Foundry on Composer (FSDP, eager PyTorch, flash-attn, fused loss)",
            attention_kernel=AttentionKernel.FLASH,
            kernels=Kernels.EAGER,
            loss_kernels=Kernels.FUSED,
            loss_method=LossMethod.FUSED,
            selective_recompute=SelectiveRecompute.MODULES,
            tp_comm_overlap=False,
            pp_comm_overlap=False,
            pipeline_buffers=PipelineBuffers.PER_TRANSFER,
            pipeline_flushes=1,
            schedule_per_accumulation_step=False,
            vocabulary_overlap=False,
            reduce_in_training_dtype=False,
            moe_dispatcher=MoeDispatcher.ALLTOALL,
            sources={
                "attention_kernel": "MPT's flash-attn 2 (or its Triton FlashAttention), priced at FlashAttention-2",
                "kernels": "Composer's trainer in eager PyTorch: its benchmark scripts set no torch.compile",
                "loss_kernels": "MPT's default loss_fn fused_crossentropy (flash-attn's Triton cross-entropy)",
                "loss_method": "flash-attn's Triton cross_entropy keeps its input logits and the log-sum-exp, and "
                "writes the gradient in their precision",
                "selective_recompute": "Composer's activation_checkpointing checkpoints whole blocks (full "
                "recompute); selective priced as Megatron-Core's modules",
                "tp_comm_overlap": "no tensor parallelism",
                "pp_comm_overlap": "no pipeline parallelism",
                "pipeline_buffers": "no pipeline parallelism",
                "pipeline_flushes": _ONE_FLUSH,
                "vocabulary_overlap": _NO_VOCABULARY_OVERLAP,
                "grad_reduce_dtype": "Composer's FSDP mixed_precision DEFAULT reduces gradients in fp32",
                "moe_dispatcher": _ALLTOALL,
            },
            gradients_on_demand=False,
            gradients_source="not checked against Composer's FSDP: priced as held through the step (an upper bound)",
            fp8_library=Fp8Library.TRANSFORMER_ENGINE,
            fp8_recipes=(Fp8Recipe.DELAYED,),
            fp8_source="Composer's precision amp_fp8 runs Transformer Engine's fp8_autocast with DelayedScaling",
        ),
    }
)
"""Every named stack (one per ``StackName``)."""

DEFAULT_STACK = StackName.PLANNER_RUNTIME
"""What a training is priced for unless told: what ``planner run`` runs."""


def stack_named(name: StackName | str) -> Stack:
    """The stack called ``name``.

    Raises:
        SchemaError: no stack has that name (the message lists them).
    """
    try:
        return STACKS[StackName(name)]
    except ValueError as e:
        raise SchemaError(f"stack {name!r} is not one of {', '.join(STACKS)}; pick one of them") from e
