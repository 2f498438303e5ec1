"""Cluster profile files: a frozen schema, typed op records, and version-1 files that still load
and estimate as they did."""

import json
from pathlib import Path

import pytest

from cost_models.estimate import estimate
from planner.files.cluster_presets import cluster_preset
from planner.files.clusters import load_cluster, save_cluster
from planner.files.models import load_model
from planner.schemas import (
    AttentionRecord,
    ClusterProfile,
    DeviceKind,
    DType,
    ElementwiseRecord,
    LayerNormRecord,
    LayerRecord,
    Layout,
    OpKind,
    OptimizerRecord,
    PipelineBuffers,
    PipelineSlotRecord,
    ShardedUnitRecord,
    TrainingSpec,
    ZeroStage,
)
from planner.schemas.cluster import device_kind_of_v1_name, upgrade
from planner.schemas.errors import SchemaError
from planner.schemas.op_records import V1_SHAPES

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
SCHEMA = GOLDEN / "cluster_profile_schema_v12.json"
V1_CPU = GOLDEN / "cluster_profile_v1_cpu.json"
"""A version-1 profile written by hand in the form the version-1 profiler wrote: 4 CPU ranks of
one node, op records of every kind with positional shapes."""


def test_cluster_profile_schema_is_frozen(update_golden: bool) -> None:
    schema = json.dumps(ClusterProfile.model_json_schema(), indent=2, sort_keys=True) + "\n"
    if update_golden:
        SCHEMA.write_text(schema)
    assert SCHEMA.read_text() == schema, (
        "ClusterProfile's schema changed: bump schema_version, keep a reader for the old versions "
        "(schemas.cluster.upgrade), then run pytest --update-golden"
    )


def test_presets_are_cuda_devices() -> None:
    for name in ("dgx-a100-80g", "dgx-h100"):
        assert cluster_preset(name, 1).device.kind is DeviceKind.CUDA


def test_a_version_1_profile_loads_with_its_device_kind_and_named_fields() -> None:
    profile = load_cluster(str(V1_CPU))
    assert profile.schema_version == 12 and profile.device.kind is DeviceKind.CPU
    records = profile.device.op_records
    assert len(records) == len(json.loads(V1_CPU.read_text())["device"]["op_records"])
    assert {r.op for r in records} == set(V1_SHAPES) == set(OpKind) - {OpKind.MOE_LAYER}
    by_type = {type(r): r for r in records}
    assert by_type[ElementwiseRecord] == ElementwiseRecord(
        num_elements=4194304, dtype=DType.FP32, time_s=2.1e-3, spread=0.05
    )
    assert by_type[AttentionRecord] == AttentionRecord(
        batch_size=1,
        num_attention_heads=4,
        seq_len=128,
        head_size=32,
        dtype=DType.BF16,
        fwd_time_s=1.5e-4,
        fwd_bwd_time_s=4.6e-4,
        spread=0.05,
    )
    assert isinstance(by_type[LayerNormRecord], LayerNormRecord) and by_type[LayerNormRecord].num_elements == 16384
    optimizer = by_type[OptimizerRecord]
    assert isinstance(optimizer, OptimizerRecord) and optimizer.num_parameters == 198272
    assert optimizer.model == "tiny-gpt" and optimizer.time_s == 1.2e-3
    slot = by_type[PipelineSlotRecord]
    assert isinstance(slot, PipelineSlotRecord) and (slot.num_stages, slot.time_s) == (2, 4.0e-4)
    units = {(r.zero_stage, r.deferred): r.time_s for r in records if isinstance(r, ShardedUnitRecord)}
    assert units == {
        (ZeroStage.GRADIENTS, False): 1.1e-4,
        (ZeroStage.PARAMETERS, False): 2.3e-4,
        (ZeroStage.GRADIENTS, True): 0.6e-4,
        (ZeroStage.PARAMETERS, True): 1.4e-4,
    }
    layers = [r for r in records if isinstance(r, LayerRecord)]
    assert {(r.op, r.sequence_parallel) for r in layers} == {
        (OpKind.LAYER, None),
        (OpKind.TP_LAYER, False),
        (OpKind.TP_LAYER, True),
        (OpKind.OUTPUT_LAYER, False),
        (OpKind.OUTPUT_LAYER, True),
    }
    first = layers[0]  # shape [1, 1, 128]: tp, micro-batch, seq len
    assert (first.tensor_parallel_degree, first.micro_batch_size, first.seq_len) == (1, 1, 128)
    assert (first.fwd_time_s, first.fwd_bwd_time_s, first.model) == (1.0e-3, 3.1e-3, "tiny-gpt")


V1_ESTIMATES = {
    # (step s, compute s, peak memory bytes), computed by the version-1 planner on the same file;
    # the memory re-frozen when the cost model began to count what the runtime's FSDP and loss
    # hold (fp32 gradient shards, no gradient buckets under ZeRO-2/3, one transient logits copy), and
    # when the buckets took the precision gradients are summed in (bf16 here), and the pipelines'
    # when a stage without the loss began to count one MLP's backward beside its activations; the
    # pipelines' step times when the tied embedding's two copies began to sum their gradients; ZeRO-3's
    # when its gathered units began to fill the loss freed before the backward.
    "dp4": (0.06006534887540349, 0.052476416000000005, 23145984.0),
    "dp2-tp2-sp-zero3": (0.14644167571336347, 0.071195552, 7165376.0),
    "dp2-pp2-zero2": (0.07311090774435117, 0.05897665422222221, 7973376.0),
    "tp2-pp2-mb3": (0.09049070326662363, 0.03954367745476803, 9195520.0),
    "tp4-mb8": (0.19521388413096008, 0.07513096685714286, 10434560.0),
}
LAYOUTS = {
    # Each reads other records: layer, output layer and optimizer; tp_layer with sequence
    # parallelism and ZeRO-3's unit cost; the pipeline slot and deferred ZeRO-2; a micro-batch
    # between two measured sizes; one beyond the largest.
    "dp4": Layout(data_parallel_degree=4, tensor_parallel_degree=1, pipeline_parallel_degree=1, micro_batch_size=2),
    "dp2-tp2-sp-zero3": Layout(
        data_parallel_degree=2,
        tensor_parallel_degree=2,
        pipeline_parallel_degree=1,
        micro_batch_size=2,
        sequence_parallel=True,
        zero_stage=ZeroStage.PARAMETERS,
    ),
    "dp2-pp2-zero2": Layout(
        data_parallel_degree=2,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=2,
        micro_batch_size=1,
        zero_stage=ZeroStage.GRADIENTS,
    ),
    "tp2-pp2-mb3": Layout(
        data_parallel_degree=1, tensor_parallel_degree=2, pipeline_parallel_degree=2, micro_batch_size=3
    ),
    "tp4-mb8": Layout(
        data_parallel_degree=1,
        tensor_parallel_degree=4,
        pipeline_parallel_degree=1,
        micro_batch_size=8,
        sequence_parallel=True,
    ),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_a_version_1_profile_estimates_as_it_did(name: str) -> None:
    cluster = load_cluster(str(V1_CPU))
    batch = 12 if name == "tp2-pp2-mb3" else 16
    training = TrainingSpec(  # as priced then
        global_batch_size=batch,
        seq_len=128,
        grad_reduce_dtype=DType.BF16,
        pipeline_buffers=PipelineBuffers.PER_TRANSFER,
    )
    got = estimate(load_model("tiny-gpt"), training, cluster, LAYOUTS[name])
    assert (got.step_time_s, got.time.compute_s, got.peak_memory_bytes) == pytest.approx(V1_ESTIMATES[name], rel=1e-9)


def test_an_upgraded_profile_saves_as_the_current_version_and_loads_the_same(tmp_path: Path) -> None:
    profile = load_cluster(str(V1_CPU))
    path = tmp_path / "cluster.json"
    save_cluster(profile, path)
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 12 and raw["device"]["kind"] == "cpu"
    assert raw["device"]["op_records"][0] == {
        "op": "elementwise",
        "dtype": "fp32",
        "time_s": 2.1e-3,
        "spread": 0.05,
        "num_elements": 4194304,
    }
    assert load_cluster(str(path)) == profile


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("cpu (Intel(R) Xeon(R) Processor @ 2.20GHz)", DeviceKind.CPU),
        ("NVIDIA A100-SXM4-80GB", DeviceKind.CUDA),
        ("AMD Instinct MI250X", DeviceKind.ROCM),
    ],
)
def test_a_version_1_device_name_gives_its_kind(name: str, kind: DeviceKind) -> None:
    assert device_kind_of_v1_name(name) is kind


def test_a_version_1_record_of_the_wrong_shape_is_named() -> None:
    raw = json.loads(V1_CPU.read_text())
    raw["device"]["op_records"][3]["shape"] = [1, 128]
    with pytest.raises(SchemaError, match=r"op_records\[3\]: a version-1 layer record's shape must be "):
        upgrade(raw)


def test_an_unknown_profile_version_is_refused_with_the_fix(tmp_path: Path) -> None:
    raw = json.loads(cluster_preset("dgx-h100", 1).model_dump_json())
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({**raw, "schema_version": 13}))
    with pytest.raises(
        SchemaError,
        match=r"schema_version 13 is not one this planner reads \(1, 2, 3, .*, 11, 12; it writes 12\).*planner profile",
    ):
        load_cluster(str(path))


def test_a_layer_record_says_sequence_parallel_exactly_when_its_op_has_it() -> None:
    shape = {"model": "m", "tensor_parallel_degree": 2, "micro_batch_size": 1, "seq_len": 8}
    times = {"dtype": DType.BF16, "fwd_time_s": 1.0, "fwd_bwd_time_s": 2.0}
    with pytest.raises(SchemaError, match="a tp_layer record needs a sequence_parallel"):
        LayerRecord(op=OpKind.TP_LAYER, **shape, **times)  # type: ignore[arg-type]
    with pytest.raises(SchemaError, match="a layer record has no sequence_parallel"):
        LayerRecord(op=OpKind.LAYER, **shape, **times, sequence_parallel=True)  # type: ignore[arg-type]
    with pytest.raises(SchemaError, match="a moe_layer record has no sequence_parallel"):
        LayerRecord(op=OpKind.MOE_LAYER, **shape, **times, sequence_parallel=False)  # type: ignore[arg-type]


def test_a_version_1_profile_cannot_hold_a_moe_layer_record() -> None:
    raw = json.loads(V1_CPU.read_text())
    raw["device"]["op_records"][3]["op"] = "moe_layer"
    with pytest.raises(SchemaError, match=r"op_records\[3\]: op 'moe_layer' is not one of a version-1 profile's"):
        upgrade(raw)
