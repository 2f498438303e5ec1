"""Plan: a chosen layout with its estimate and the identities of the inputs it was made for.

Written to disk as JSON (``planner.files.plans.save_plan``); a schema change bumps ``schema_version``
and keeps a reader for the old one (``upgrade``).

Versions: 1, the dense layout; 2 adds the layout's ``vocabulary_layout``, ``expert_placement`` and
``device_map``, whose defaults mean what a version-1 plan meant, and the cluster's ``device_kind``;
3 adds the training's ``moe_capacity_factor`` and ``moe_pad_to_capacity``, whose defaults (dropless)
mean what a version-2 plan meant, the vocabulary layouts ``vocab-1`` and ``vocab-2``, and the
layout's ``expert_tensor_parallel_degree``, whose default (None: t) means what a plan without it
meant (version 3 was not released before it; a version-3 plan without the field reads unchanged);
4 adds the training's ``tp_comm_overlap`` and ``moe_dispatcher``, whose defaults (collectives not
overlapped, every routed pair sent) mean what a version-3 plan meant; 5 adds the training's
``pp_comm_overlap``, on by default, which version 4 did not price: a version-4 plan reads with it off;
6 adds the training's ``kernels``, whose default (fused) is what a version-5 plan priced, and the
layout's ``sharding_group_size`` and ``secondary_partition_size``, whose defaults (ZeRO over the
whole data-parallel group) are what a version-5 plan ran; version 6 later gained the model's
``rope_theta`` and ``rope_scaling``, whose defaults (10000, none) are what the runtime ran and the
cost model priced before (neither prices them), so every version-6 plan reads unchanged; 7 and 8
in ``upgrade``; 9 adds the training's ``loss_kernels``, whose default (None: as ``kernels``) is what a version-8
plan priced, and ``vocabulary_overlap``, which a version-8 plan reads as on (as it was priced); 10 adds
the layout's ``recompute_modules``, whose default (the attention core) is what selective recompute
meant in a version-9 plan; 11 adds the training's attention kernel ``cudnn``, which no version-10
plan names, and its ``pipeline_flushes``, whose default (one schedule a step) is what version 10
priced; 12 reads pipeline receive buffers per transfer where a plan names none (``upgrade``);
13 adds the training's ``stack``: a version-12 plan reads as priced for 'planner-runtime' with
version 12's default of every behaviour it does not name (fused kernels among them); 14-17 add
fields whose defaults are what the version before ran (``upgrade``); 18 adds the training's
``loss_method`` and ``selective_recompute``, which a version-17 plan reads as fp32 in place and
the layout's modules, as it was priced; 19 adds the training's ``fp8_experts``, whose default
(None: the routed experts as the stack runs them) is how version 18 priced them.
"""

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Literal, Protocol, Self

from pydantic import Field, model_validator

from planner.schemas._base import FrozenModel
from planner.schemas.cluster import DeviceKind, device_kind_of_v1_name
from planner.schemas.errors import SchemaError
from planner.schemas.estimate import Estimate
from planner.schemas.layout import Layout, check_experts
from planner.schemas.model import ModelSpec
from planner.schemas.training import TrainingSpec


class PlanShape(Protocol):
    """What the checks of who runs a plan read (``schemas.runtime_support``, ``planner.export``):
    its model, training and layout; a Plan, or a layout a search weighs (``PlannedLayout``)."""

    @property
    def model(self) -> ModelSpec: ...

    @property
    def training(self) -> TrainingSpec: ...

    @property
    def layout(self) -> Layout: ...


@dataclass(frozen=True, slots=True)
class PlannedLayout:
    """A layout with the model and training it is for: a plan before it is priced (``PlanShape``)."""

    model: ModelSpec
    training: TrainingSpec
    layout: Layout


class ClusterRef(FrozenModel):
    """Which cluster profile a plan was made for."""

    spec: str = Field(description="What the user passed: a preset NAME:NODES or a profile file path.")
    name: str
    world_size: int = Field(ge=1)
    num_nodes: int = Field(ge=1)
    devices_per_node: int = Field(ge=1)
    device_name: str
    device_kind: DeviceKind = Field(
        description="The profile's device kind, for readers without the profile (the launch export, planner run)."
    )
    sha256: str = Field(description="Hash of the profile's canonical JSON, to notice a changed profile.")


class Alternative(FrozenModel):
    """Another layout the search ranked, kept to explain the choice."""

    layout: Layout
    estimate: Estimate


class Plan(FrozenModel):
    """A layout, what the cost models predict for it, and the inputs both came from."""

    schema_version: Literal[19] = 19
    created: datetime
    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterRef
    layout: Layout
    estimate: Estimate
    runner_up: Alternative | None = Field(default=None, description="The next-best layout of the search.")

    @model_validator(mode="after")
    def _layouts_fit_the_model(self) -> Self:
        """A plan's layouts split its own model's experts and run on its own cluster's devices (a
        hand-edited plan may not)."""
        layouts = [("layout", self.layout)]
        if self.runner_up is not None:
            layouts.append(("runner_up.layout", self.runner_up.layout))
        for label, layout in layouts:
            check_experts(self.model, layout)
            _check_devices(label, layout, self.cluster)
        _check_estimate("estimate", self.estimate)
        if self.runner_up is not None:
            _check_estimate("runner_up.estimate", self.runner_up.estimate)
        return self


def _check_estimate(label: str, estimate: Estimate) -> None:
    """Raise SchemaError unless ``estimate`` reads as the cost model writes one (a hand-edited
    plan may not): a step time > 0, no negative figure, its stages numbered 0, 1, ... in order."""
    if estimate.step_time_s <= 0:
        raise SchemaError(f"{label}.step_time_s={estimate.step_time_s!r} must be > 0; re-create the plan")
    figures = {
        f"{label}.{f.name}": getattr(estimate, f.name) for f in fields(estimate) if f.name not in ("stages", "time")
    }
    figures |= {f"{label}.time.{f.name}": getattr(estimate.time, f.name) for f in fields(estimate.time)}
    for i, stage in enumerate(estimate.stages):
        if stage.stage != i:
            raise SchemaError(f"{label}.stages[{i}].stage={stage.stage!r} must be {i}; re-create the plan")
        figures[f"{label}.stages[{i}].layers"] = stage.layers
        figures[f"{label}.stages[{i}].compute_per_micro_batch_s"] = stage.compute_per_micro_batch_s
        figures |= {f"{label}.stages[{i}].memory.{f.name}": getattr(stage.memory, f.name) for f in fields(stage.memory)}
    if not estimate.stages:
        raise SchemaError(f"{label}.stages is empty; a plan's estimate has one entry per pipeline stage")
    for name, value in figures.items():
        if value is not None and value < 0:
            raise SchemaError(f"{name}={value!r} must be >= 0; re-create the plan")


def _check_devices(label: str, layout: Layout, cluster: ClusterRef) -> None:
    """Raise SchemaError unless ``layout`` has one rank per device of ``cluster``: its device map
    (a permutation of its ranks) then names only devices the cluster has."""
    if layout.world_size == cluster.world_size:
        return
    where = f"cluster {cluster.name!r} ({cluster.spec}) has {cluster.world_size} devices"
    if layout.world_size > cluster.world_size and not layout.device_map.is_identity:
        raise SchemaError(
            f"{label}.device_map names device {max(layout.device_map.devices)}, but {where} "
            f"(0..{cluster.world_size - 1}); map every rank to one of them, or plan again for this cluster"
        )
    raise SchemaError(
        f"{label} has {layout.world_size} ranks, but {where}; give it one rank per device, or plan again for "
        "this cluster"
    )


PLAN_SCHEMA_VERSION = 19
"""The version this planner writes."""
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19)
"""The versions ``upgrade`` reads."""


def upgrade(raw: dict[str, object]) -> dict[str, object]:
    """A plan's JSON object of any readable version as the current version's.

    Version 1 -> 2: the layout's new fields are absent, and their defaults (vocabulary pinned to
    the first and last chunks, experts in contiguous blocks, the identity device map) are what a
    version-1 plan ran. The cluster's device kind is derived from its device name
    (``device_kind_of_v1_name``), as version 1 did wherever it needed it.
    Version 2 -> 3: the training's new fields are absent, and their defaults (dropless experts)
    are what a version-2 plan ran. Version 3 -> 4: likewise (tensor-parallel collectives not
    overlapped, the plain all-to-all dispatcher). Version 4 -> 5: pipeline transfers not overlapped,
    as version 4 priced them, although the new field's default overlaps them. Version 5 -> 6: the
    new field's default (fused kernels) is what version 5 priced. Version 6 -> 7: the layout's
    new fields' defaults (no context parallelism; of the ring kind) are what version 6 ran.
    Version 7 -> 8: gradients summed in the training precision, as version 7 priced them,
    although the new field's default sums them in fp32 under bf16. Version 8 -> 9: the new field's
    default (the loss runs as the other kernels) is what version 8 priced; a vocabulary split was
    priced as Vocabulary Parallelism's own schedule runs it (``vocabulary_overlap`` on). Version
    9 -> 10: the layouts' new field's default (selective recompute of the attention core alone) is
    what version 9's selective recompute was. Version 10 -> 11: nothing to change; the new
    attention kernel is one no version-10 plan names, and the new field's default (one pipeline
    schedule a step) is what version 10 priced. Version 11 -> 12: pipeline receive buffers per
    transfer, as version 11 priced them, although the new field's default keeps one per micro-batch.
    Version 12 -> 13: priced for 'planner-runtime', with version 12's default of each behaviour the
    plan does not name (``VERSION_12_BEHAVIOURS``), although that stack's kernels are eager.
    Version 13 -> 14: nothing to change; a version-13 plan names no FP8 recipe, which version 14
    reads as training without one. Version 14 -> 15: nothing to change; a version-14 plan counts no
    recompute layers per stage, which version 15 reads as its recompute applying to every layer.
    Version 15 -> 16: nothing to change; a version-15 plan offloads no optimizer states, which
    version 16 reads as a fraction of 0. Version 16 -> 17: nothing to change; a version-16 plan
    offloads no activations, which version 17 reads as 0 layers. Version 17 -> 18: the loss's
    memory as every stack's loss was priced before (fp32 in place), although the new field's
    value under torchtitan, DeepSpeed and LLM Foundry differs, and selective recompute of the
    layout's modules, although torchtitan's is its per-op policy. Version 18 -> 19: nothing to
    change; a version-18 plan ran the routed experts as its stack does, which version 19 reads as None.
    """
    if raw.get("schema_version") == 1:
        raw = {**raw, "schema_version": 2}
        cluster = raw.get("cluster")
        if isinstance(cluster, dict) and isinstance(cluster.get("device_name"), str):
            raw["cluster"] = {**cluster, "device_kind": device_kind_of_v1_name(cluster["device_name"])}
    if raw.get("schema_version") == 2:
        raw = {**raw, "schema_version": 3}
    if raw.get("schema_version") == 3:
        raw = {**raw, "schema_version": 4}
    if raw.get("schema_version") == 4:
        raw = {**raw, "schema_version": 5}
        training = raw.get("training")
        if isinstance(training, dict):
            raw["training"] = {"pp_comm_overlap": False, **training}
    if raw.get("schema_version") == 5:
        raw = {**raw, "schema_version": 6}
    if raw.get("schema_version") == 6:
        raw = {**raw, "schema_version": 7}
    if raw.get("schema_version") == 7:
        raw = {**raw, "schema_version": 8}
        training = raw.get("training")
        if isinstance(training, dict):
            raw["training"] = {"grad_reduce_dtype": training.get("dtype", "bf16"), **training}
    if raw.get("schema_version") == 8:
        raw = {**raw, "schema_version": 9}
        training = raw.get("training")
        if isinstance(training, dict):
            raw["training"] = {"vocabulary_overlap": True, **training}
    if raw.get("schema_version") == 9:
        raw = {**raw, "schema_version": 10}
    if raw.get("schema_version") == 10:
        raw = {**raw, "schema_version": 11}
    if raw.get("schema_version") == 11:
        raw = {**raw, "schema_version": 12}
        training = raw.get("training")
        if isinstance(training, dict):
            raw["training"] = {"pipeline_buffers": "per-transfer", **training}
    if raw.get("schema_version") == 12:
        raw = {**raw, "schema_version": 13}
        training = raw.get("training")
        if isinstance(training, dict):
            raw["training"] = {**VERSION_12_BEHAVIOURS, **training}
    if raw.get("schema_version") == 13:
        raw = {**raw, "schema_version": 14}
    if raw.get("schema_version") == 14:
        raw = {**raw, "schema_version": 15}
    if raw.get("schema_version") == 15:
        raw = {**raw, "schema_version": 16}
    if raw.get("schema_version") == 16:
        raw = {**raw, "schema_version": 17}
    if raw.get("schema_version") == 17:
        raw = {**raw, "schema_version": 18}
        training = raw.get("training")
        if isinstance(training, dict):
            raw["training"] = {"loss_method": "fp32-in-place", "selective_recompute": "modules", **training}
    if raw.get("schema_version") == 18:
        raw = {**raw, "schema_version": 19}
    return raw


VERSION_12_BEHAVIOURS = {
    "attention_kernel": "flash",
    "kernels": "fused",
    "loss_kernels": None,
    "tp_comm_overlap": False,
    "pp_comm_overlap": True,
    "pipeline_flushes": 1,
    "pipeline_buffers": "per-micro-batch",
    "vocabulary_overlap": False,
    "grad_reduce_dtype": None,
    "moe_dispatcher": "alltoall",
}
"""The behaviours' defaults before stacks (version 12): what a plan that names none of them priced."""
