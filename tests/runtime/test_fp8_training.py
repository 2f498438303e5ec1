"""FP8 training in the runtime (``runtime.fp8``, torchao's float8): the layers converted are
exactly those ``schemas.fp8.converts`` accepts among the transformer layers' projections (the
cost model prices those), layouts train like the single-process bf16 reference within FP8's
noise, and what the runtime cannot do is refused in one line.

FP8 runs on the CPU here: torch's ``_scaled_mm`` has a CPU kernel, so these tests check what is
converted and that the layouts compose with it; FP8's speed needs an H100."""

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Setting, run_ranks
from test_run_cli import _dry
from torch import nn

from cost_models.estimate import estimate
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.plans import make_plan, save_plan
from planner.schemas import DType, Layout, ModelSpec, TrainingSpec
from planner.schemas.errors import InfeasibleConfigError, MissingExtraError
from planner.schemas.fp8 import RECIPE_RUNS, Fp8Library, Fp8Recipe, converts
from planner.schemas.plan import PlannedLayout
from planner.schemas.runtime_support import check_fp8_param_gather, check_runnable
from runtime import checkpoint
from runtime.data import synthetic_batch
from runtime.fp8 import FP8_EXTRA, convert_to_fp8, edge_layers, fp8_candidates, fp8_layer_names
from runtime.mlp import MLP
from runtime.model import Decoder, default_dtype, loss_fn
from runtime.optim import make_optimizer
from runtime.trainer import Trainer

TENSORWISE = RECIPE_RUNS[Fp8Library.TORCHAO, Fp8Recipe.TENSORWISE]
MXFP8 = RECIPE_RUNS[Fp8Library.TORCHAO, Fp8Recipe.MXFP8]

# hidden 256, f 2048: under tensorwise (torchao skips K <= 4096 and N <= 1024) gate and up
# (256 -> 2048) convert; q/k/v/o (256 -> 256) and down (2048 -> 256) stay in bf16.
DENSE = ModelSpec(
    name="fp8-dense",
    hidden_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    intermediate_size=2048,
    vocab_size=512,
    hidden_act="silu",
    tie_word_embeddings=False,
)
# 4 experts and a gated shared expert, each 2048 wide: their gate and up convert.
MOE = DENSE.model_copy(
    update={
        "name": "fp8-moe",
        "moe_intermediate_size": 2048,
        "shared_expert_intermediate_size": 2048,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    }
)
SETTING = Setting(batch=4, seq_len=64, steps=4, lr=0.5)
"""lr 0.5: the steps move the loss by up to 0.036 from an untrained model's, well beyond FP8's noise."""

FP8_LOSS_TOLERANCE = 5e-3
"""Losses of an FP8 (tensorwise) layout against the single-process bf16 reference, absolute.
Measured with ``SETTING`` on the dense layouts below: at most 1.7e-3; bf16 layouts without FP8
stay within 1e-4 of the reference."""
MOE_FP8_LOSS_TOLERANCE = 8e-3
"""The MoE's, whose top-2 routing FP8's noise can turn: its ep2 layout measured 3.4e-3 on one
machine and 5.3e-3 on another (an AMD EPYC: the same code and seeds, CPU kernels that round
differently), the MoE under tp2 (each rank scaling its slice of every expert) 7e-3. Still well
under the 0.036 the steps move the loss by."""


def _bf16_reference(model: ModelSpec) -> list[float]:
    """``runtime.reference``'s training, in bf16 (the FP8 layouts' high precision), with SGD."""
    torch.manual_seed(SETTING.seed)
    with default_dtype(torch.bfloat16):
        net = Decoder(model, seed=SETTING.seed)
    opt = make_optimizer("sgd", list(net.parameters()), SETTING.lr)
    losses = []
    for step in range(SETTING.steps):
        inputs, targets = synthetic_batch(
            model.vocab_size, SETTING.batch, SETTING.seq_len, step=step, seed=SETTING.seed
        )
        opt.zero_grad()
        loss = loss_fn(net(inputs), targets)
        torch.autograd.backward(loss)
        opt.step()
        losses.append(loss.item())
    return losses


def _fp8_layouts(cases: list[tuple[ModelSpec, dict[str, Any], bool]], workdir: str) -> dict[str, Any]:
    """Each case's losses, its FP8 layers (by name, on this rank) and whether its weights are
    gathered in FP8; the bf16 references (every rank computes them: two cores, no waiting); and
    a checkpoint of FP8-gathered weights resumed (``_fp8_gathered_resume``), in the same launch."""
    from torchao.float8.float8_linear import Float8Linear
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    results = []
    for model, kw, gather in cases:
        trainer = SETTING.trainer(model, Layout(**kw), dtype=DType.BF16, fp8=TENSORWISE, fp8_param_gather=gather)
        converted = sorted(n for c in trainer.chunks for n, m in c.named_modules() if isinstance(m, Float8Linear))
        fp8_weights = [
            isinstance(getattr(m.weight, "_local_tensor", None), WeightWithDynamicFloat8CastTensor)
            for c in trainer.chunks
            for m in c.modules()
            if isinstance(m, Float8Linear)
        ]
        results.append({"losses": SETTING.losses(model, trainer), "converted": converted, "fp8_weights": fp8_weights})
    references = {m.name: _bf16_reference(m) for m in (DENSE, MOE)}
    return {
        "layouts": results,
        "references": references,
        "resume": _fp8_gathered_resume(Path(workdir) / "ckpt"),
        "mxfp8": [_mxfp8_layout(model, kw) for model, kw in MX_CASES],
    }


def _mxfp8_layout(model: ModelSpec, kw: dict[str, Any]) -> dict[str, Any]:
    """An MXFP8 layout's losses, and its linear layers whose weight (or its shard) is torchao's
    MXFP8 training weight, by name on this rank (torchao's emulation on the CPU)."""
    from torchao.prototype.moe_training.tensor import MXFP8TrainingWeightWrapperTensor

    trainer = SETTING.trainer(model, Layout(**kw), dtype=DType.BF16, fp8=MXFP8)
    converted = sorted(
        name
        for chunk in trainer.chunks
        for name, m in chunk.named_modules()
        if isinstance(m, nn.Linear)
        and isinstance(getattr(m.weight, "_local_tensor", m.weight).data, MXFP8TrainingWeightWrapperTensor)
    )
    return {"losses": SETTING.losses(model, trainer), "converted": converted}


RESUMED_AT = 2


def _fp8_gathered_resume(directory: Path) -> dict[str, Any]:
    """FSDP2 with torchao's FP8 all-gather (dp2 ZeRO-3, tensorwise): the losses of an uninterrupted
    run, and of one saved after ``RESUMED_AT`` steps and resumed by a fresh trainer; and whether a
    bf16 trainer of the same layout without FP8 resumes the same weights from that checkpoint (the
    checkpoint holds the weights in the training precision, not torchao's FP8-gather wrappers)."""
    layout = Layout(**L(2, 1, 1, 1, zero_stage=3))

    def trainer(fp8: bool) -> Trainer:
        return SETTING.trainer(DENSE, layout, dtype=DType.BF16, fp8=TENSORWISE if fp8 else None, fp8_param_gather=fp8)

    def steps(run: Trainer, first: int, last: int) -> list[float]:
        return [run.step(*_batch(step)) for step in range(first, last)]

    whole = steps(trainer(True), 0, SETTING.steps)
    saved = trainer(True)
    steps(saved, 0, RESUMED_AT)
    checkpoint.save(saved, directory, RESUMED_AT, plan_sha256="p")
    resumed, plain = trainer(True), trainer(False)
    at = checkpoint.resume(resumed, directory, plan_sha256="p").step
    checkpoint.resume(plain, directory, plan_sha256="p")
    same = all(
        torch.equal(_full(a), _full(b))
        for a, b in zip(saved.chunks[0].parameters(), plain.chunks[0].parameters(), strict=True)
    )
    return {"whole": whole, "at": at, "after": steps(resumed, at, SETTING.steps), "plain_resumes_the_weights": same}


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return synthetic_batch(DENSE.vocab_size, SETTING.batch, SETTING.seq_len, step=step, seed=SETTING.seed)


def _full(param: torch.Tensor) -> torch.Tensor:
    """A sharded parameter's whole value, in plain bf16 (torchao's FP8-gather wrapper unwrapped)."""
    full = param.full_tensor() if hasattr(param, "full_tensor") else param
    return full.to(torch.bfloat16).detach().clone()


def L(d: int, t: int, p: int, b: int, **kw: Any) -> dict[str, Any]:
    return dict(data_parallel_degree=d, tensor_parallel_degree=t, pipeline_parallel_degree=p, micro_batch_size=b, **kw)


def _gate_up(layers: range, *mlps: str) -> list[str]:
    return sorted(f"layers.{i}.{mlp}.{p}" for i in layers for mlp in mlps for p in ("gate", "up"))


CASES = [
    (DENSE, L(2, 1, 1, 1, zero_stage=3), True),  # FSDP2 with torchao's FP8 all-gather
    (DENSE, L(1, 2, 1, 4, sequence_parallel=True), False),  # Float8Linear under DTensor's split
    (MOE, L(2, 1, 1, 2, expert_parallel_degree=2), False),  # each rank's 2 experts, the shared expert
    (DENSE, L(1, 1, 2, 2), False),  # a pipeline: rank 0 holds layer 0
]
"""The layouts trained in FP8 against the bf16 reference: (model, layout, weights gathered in FP8)."""
MX_CASES = [
    (DENSE, L(2, 1, 1, 1, zero_stage=3)),  # FSDP2 shards the MXFP8 weights
    (DENSE, L(1, 2, 1, 4, sequence_parallel=True)),  # under DTensor's split
    (DENSE, L(1, 1, 2, 2)),  # a pipeline: rank 0 holds layer 0
    (MOE, L(2, 1, 1, 2, expert_parallel_degree=2)),  # each rank's experts, their rows padded to 32
]
"""The layouts trained in MXFP8 (torchao's emulation on the CPU) against the bf16 reference."""


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_fp8_layouts_train_like_the_bf16_reference_converting_what_converts_accepts(
    fp8_runs: dict[str, Any],
) -> None:
    out = fp8_runs
    references = out["references"]
    for (model, kw, _), result in zip(CASES, out["layouts"], strict=True):
        reference = references[model.name]
        tolerance = MOE_FP8_LOSS_TOLERANCE if model is MOE else FP8_LOSS_TOLERANCE
        assert result["losses"] == pytest.approx(reference, abs=tolerance), f"{kw}: {result}, {reference}"
    zero3, tp, ep, pp = out["layouts"]
    assert zero3["converted"] == tp["converted"] == _gate_up(range(2), "mlp")
    assert zero3["fp8_weights"] == [True] * 4 and tp["fp8_weights"] == [False] * 4
    # rank 0 holds experts 0 and 1 of each layer; routers and sigmoid gates stay in bf16
    assert ep["converted"] == _gate_up(range(2), "mlp.experts.0", "mlp.experts.1", "shared_expert")
    assert pp["converted"] == _gate_up(range(1), "mlp")
    assert len(set(references[DENSE.name])) == SETTING.steps


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_mxfp8_layouts_train_like_the_bf16_reference_converting_every_projection(fp8_runs: dict[str, Any]) -> None:
    """MXFP8 (torchao's, emulated on the CPU: the same 1x32 block quantization, then a matmul of the
    dequantized operands) converts every aligned projection, the 256 x 256 attention ones too
    (no small-shape filter), under FSDP2, tensor parallelism and a pipeline."""
    references = fp8_runs["references"]
    for (model, kw), result in zip(MX_CASES, fp8_runs["mxfp8"], strict=True):
        tolerance = MOE_FP8_LOSS_TOLERANCE if model is MOE else FP8_LOSS_TOLERANCE
        assert result["losses"] == pytest.approx(references[model.name], abs=tolerance), f"{kw}: {result}"
    zero3, tp, pp, ep = fp8_runs["mxfp8"]
    projections = sorted(name for name, _ in fp8_candidates(Decoder(DENSE, seed=0)))
    assert len(projections) == 2 * 7 and "layers.0.attn.q" in projections  # 256 x 256
    assert zero3["converted"] == tp["converted"] == projections
    assert pp["converted"] == [name for name in projections if name.startswith("layers.0.")]
    # rank 0's experts 0 and 1 (each seeing however many tokens route to it), its shared expert and
    # attention; not the router or the sigmoid gate
    assert _gate_up(range(2), "mlp.experts.0", "mlp.experts.1", "shared_expert") == sorted(
        n for n in ep["converted"] if n.endswith(("gate", "up"))
    )


def test_mxfp8_plans_the_runtime_cannot_block_are_refused_in_one_line() -> None:
    def plan(model: ModelSpec, seq_len: int, **kw: Any) -> PlannedLayout:
        training = TrainingSpec(global_batch_size=8, seq_len=seq_len, fp8="mxfp8")
        return PlannedLayout(model, training, Layout(**L(1, 1, 1, 1, **kw)))

    check_runnable(plan(DENSE, 64), cuda=False)  # 64 tokens: two blocks
    check_runnable(plan(MOE, 64), cuda=True)  # its experts pad what routes to them (MLP.row_block)
    with pytest.raises(InfeasibleConfigError, match=r"^the plan's linear layers see 48 tokens .* blocks of 32 tokens"):
        check_runnable(plan(DENSE, 48), cuda=False)
    bf16 = TrainingSpec(global_batch_size=8, seq_len=48)
    check_runnable(PlannedLayout(DENSE, bf16, Layout(**L(1, 1, 1, 1))), cuda=False)  # no blocks without mxfp8


def test_an_mlp_padded_to_whole_blocks_computes_what_it_would_unpadded() -> None:
    """``MLP.row_block``: 37 rows padded to 64 with zeros give the same outputs and gradients."""
    torch.manual_seed(0)
    mlp = MLP(DENSE, 64)
    x = torch.randn(37, DENSE.hidden_size, requires_grad=True)
    plain = mlp(x)
    plain.square().sum().backward()
    grads = [p.grad.clone() for p in (x, *mlp.parameters()) if p.grad is not None]
    for p in (x, *mlp.parameters()):
        p.grad = None
    mlp.row_block = 32
    padded = mlp(x)
    padded.square().sum().backward()
    assert padded.shape == plain.shape and torch.allclose(padded, plain, atol=1e-6)
    assert all(torch.allclose(a, p.grad, atol=1e-5) for a, p in zip(grads, (x, *mlp.parameters()), strict=True))
    assert mlp(torch.zeros(0, DENSE.hidden_size)).shape == (0, DENSE.hidden_size)  # an expert with no tokens


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_a_checkpoint_of_fp8_gathered_weights_resumes_exactly(fp8_runs: dict[str, Any]) -> None:
    resume = fp8_runs["resume"]
    assert resume["at"] == RESUMED_AT
    assert resume["after"] == resume["whole"][RESUMED_AT:]  # the same steps, bit for bit
    assert len(set(resume["whole"])) == SETTING.steps  # the steps do change the weights
    assert resume["plain_resumes_the_weights"]


@pytest.fixture(scope="module")
def fp8_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One 2-rank launch: every FP8 layout of ``CASES``, the bf16 references and the resume."""
    pytest.importorskip("torchao.float8", reason=f"FP8 training needs torchao: pip install '{FP8_EXTRA}'")
    workdir = tmp_path_factory.mktemp("fp8")
    result: dict[str, Any] = run_ranks(2, _fp8_layouts, CASES, str(workdir), workdir=workdir)
    return result


def test_the_layers_converted_are_the_transformer_layers_projections_that_converts_accepts() -> None:
    """Under a library that converts every aligned layer (Transformer Engine's rule), every
    projection of the layers is converted, and still not the router, the shared expert's sigmoid
    gate, the embedding or the output layer (16 experts: a router aligned to 16)."""
    model = MOE.model_copy(update={"num_local_experts": 16, "moe_intermediate_size": 64, "intermediate_size": 64})
    everything = RECIPE_RUNS[Fp8Library.TRANSFORMER_ENGINE, Fp8Recipe.DELAYED]
    net = Decoder(model, seed=0)
    names = fp8_layer_names(net, everything)
    assert len(names) == model.num_hidden_layers * (4 + 16 * 3 + 3)  # q k v o, 16 experts, shared expert
    assert not [n for n in names if n.endswith(("router", "sigmoid_gate")) or not n.startswith("layers.")]
    kept = {f"layers.{i}.{p}" for i in range(2) for p in ("mlp.router", "shared_expert.sigmoid_gate")}
    assert {n for n, m in net.named_modules() if isinstance(m, nn.Linear)} - set(names) == {"head", *kept}
    assert fp8_layer_names(Decoder(DENSE, seed=0), TENSORWISE) == tuple(_gate_up(range(2), "mlp"))


def test_a_missing_torchao_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("torchao", "torchao.float8"):  # importing them now raises ImportError, imported before or not
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(MissingExtraError, match=r"^FP8 training needs torchao: pip install 'planner\[fp8\]'$"):
        convert_to_fp8(Decoder(DENSE, seed=0), TENSORWISE)


def test_an_fp8_gather_without_fsdp_is_refused() -> None:
    spec = TrainingSpec(global_batch_size=8, seq_len=64, fp8="tensorwise", fp8_param_gather=True)
    assert spec.precision.fp8 == TENSORWISE  # the runtime's stack offers torchao's recipes
    check_fp8_param_gather(Layout(**L(2, 1, 1, 1, zero_stage=3)), fp8_param_gather=True)
    check_fp8_param_gather(Layout(**L(2, 1, 1, 1, zero_stage=1)), fp8_param_gather=False)
    with pytest.raises(InfeasibleConfigError, match=r"zero_stage=1 over 2 replica\(s\).*plan with --zero-stage 3"):
        check_fp8_param_gather(Layout(**L(2, 1, 1, 1, zero_stage=1)), fp8_param_gather=True)
    with pytest.raises(InfeasibleConfigError, match=r"zero_stage=3 over 1 replica"):
        check_fp8_param_gather(Layout(**L(1, 2, 1, 1, zero_stage=3)), fp8_param_gather=True)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_dry_run_traces_fp8_layers_and_their_fp8_gather(tmp_path: Path) -> None:
    """torchao's Float8Linear keeps bf16 inputs and weights for the backward, so an FP8 step
    traces what a bf16 one does, within 1% (its FP8 copies live briefly); gathering the weights
    in FP8 holds each gathered FP8 layer at 1 byte a parameter instead of 2, which saves at
    least one layer's FP8 weights at the peak (Llama 3 8B, 2 of its layers, ZeRO-3 over 8)."""
    pytest.importorskip("torchao.float8", reason=f"FP8 training needs torchao: pip install '{FP8_EXTRA}'")
    model = load_model("llama3-8b").model_copy(update={"num_hidden_layers": 2})
    cluster = load_cluster("dgx-h100:1")
    layout = Layout(**L(8, 1, 1, 1, zero_stage=3))
    traced = {}
    for name, fp8, gather in (("bf16", None, False), ("fp8", "tensorwise", False), ("gather", "tensorwise", True)):
        training = TrainingSpec(global_batch_size=8, seq_len=4096, fp8=fp8, fp8_param_gather=gather)
        path = tmp_path / f"{name}.json"
        save_plan(
            make_plan(model, training, cluster, "dgx-h100:1", layout, estimate(model, training, cluster, layout)), path
        )
        traced[name] = _dry(path, 0)
    h, f, kv = model.hidden_size, model.ffn_size, model.kv_heads * model.head_size
    shapes = [(h, h), (h, kv), (h, kv), (h, h), (h, f), (h, f), (f, h)]  # q k v o gate up down
    fp8_layer_mib = sum(i * o for i, o in shapes if converts(TENSORWISE, i, o)) / 2**20
    assert traced["fp8"] == pytest.approx(traced["bf16"], rel=0.01)
    assert traced["gather"] < traced["fp8"] - fp8_layer_mib


def test_the_first_and_last_layers_kept_in_bf16_are_not_converted() -> None:
    # --fp8-bf16-layers 1 on 4 layers: layers 1 and 2 convert, 0 and 3 stay in bf16, as priced
    four = DENSE.model_copy(update={"num_hidden_layers": 4})
    kept = edge_layers(four.num_hidden_layers, 1)
    assert kept == {0, 3}
    assert fp8_layer_names(Decoder(four, seed=0), TENSORWISE, kept) == tuple(_gate_up(range(1, 3), "mlp"))
    assert fp8_layer_names(Decoder(DENSE, seed=0), TENSORWISE, edge_layers(2, 1)) == ()
