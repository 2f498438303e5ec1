"""Data parallelism and ZeRO: each replica's rows of the batch, and how gradients, optimizer
state and parameters are shared across replicas.

- ZeRO-0/1 (Rajbhandari et al. 2020): ``runtime.optim.DataParallelOptimizer``, one flat
  all-reduce of the gradients; ZeRO-1 shards the optimizer state and the fp32 masters.
- ZeRO-2/3: FSDP2 (``shard_units``) with reshard_after_forward False/True, computing in the
  plan's precision over fp32 shards. Gradients are summed in the plan's
  ``TrainingSpec.reduce_dtype`` (fp32 under bf16, as the cost model prices them), as under
  ZeRO-0/1. Under a pipeline, torch.distributed.pipelining has FSDP keep each micro-batch's
  gradient whole and reduce once, after the stage's last backward.
- Experts under expert parallelism (``runtime.expert_parallel``): their own ZeRO-0/1 optimizer
  over the expert-data-parallel group; under ZeRO-2/3 they stay out of FSDP (ZeRO-1 for them).
- Vocabulary shards split over the pipeline (``runtime.vocabulary_parallel``) live outside the
  chunks: averaged with the chunks' gradients under ZeRO-0/1; under ZeRO-2/3 fp32, outside FSDP,
  with a ZeRO-1 optimizer of their own over the data-parallel group.
- Sharding groups of g ranks (``Layout.sharding_group_size``, HSDP): FSDP2 over the 2-D
  (replicate, shard) mesh (``runtime.mesh.sharding_meshes``); the replicas all-reduce the
  accumulated gradient shard once a step (``set_requires_all_reduce`` off but for the last
  micro-batch), as the cost model prices it. ZeRO-1 in groups: gradients reduce-scattered within
  the sharding group, each share all-reduced across the replicas and gathered back (as the cost
  model prices it: 1/g of the bytes cross between the groups), the optimizer state shared out
  within the sharding group.
- A secondary partition of s ranks (``Layout.secondary_partition_size``, ZeRO-3):
  ``reshard_after_forward=s``, on the secondary mesh every rank built (``post_forward_mesh``).
"""

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import cast

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.fsdp._fully_shard import _fully_shard as fsdp_internals
from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo, HSDPMeshInfo

from planner.schemas import Layout, ZeroStage
from planner.schemas.geometry import ShardingMeshAxis, context_coordinates
from planner.schemas.runtime_support import check_sharded_experts
from runtime.expert_parallel import JointOptimizer, expert_parameters
from runtime.mesh import ShardingMeshes
from runtime.model import Decoder
from runtime.optim import DataParallelOptimizer, make_optimizer

Optimizer = DataParallelOptimizer | JointOptimizer | torch.optim.Optimizer
"""What ``DataParallel.share`` returns: zero_grad, step."""


@dataclass(frozen=True, slots=True)
class DataParallel:
    """This rank's replica of a layout: its rows of each batch and its sharing of the model."""

    layout: Layout
    mesh: DeviceMesh
    """The 1-D mesh of this rank's data-parallel group."""
    expert_data_mesh: DeviceMesh | None = None
    """Under expert parallelism: the 1-D mesh of the replicas holding this rank's experts."""
    sharding: ShardingMeshes | None = None
    """The meshes ZeRO shares the dense states over (``runtime.mesh.sharding_meshes``); None:
    ``mesh``, which needs a layout without sharding groups or a secondary partition."""

    @property
    def meshes(self) -> ShardingMeshes:
        """``sharding``, or ``mesh`` alone."""
        if self.sharding is not None:
            return self.sharding
        layout = self.layout
        if layout.sharding_group_size is not None or layout.secondary_partition_size is not None:
            raise ValueError(f"{layout.describe()} shards in groups: give DataParallel its sharding meshes")
        return ShardingMeshes(self.mesh)

    @property
    def shards_with_fsdp(self) -> bool:
        """ZeRO-2/3 shard with FSDP; over one replica there is nothing to shard, and FSDP would
        still gather and reduce every unit of every micro-batch (as the cost model says, ZeRO is
        then ZeRO-0)."""
        return self.layout.shards_over_replicas

    def parameter_dtype(self, compute_dtype: torch.dtype) -> torch.dtype:
        """The precision the model is built in: ZeRO-0/1 keep it in the plan's precision (fp32
        masters live in the optimizer); ZeRO-2/3 keep fp32 shards that FSDP gathers in it."""
        return torch.float32 if self.shards_with_fsdp else compute_dtype

    def rows(self, batch_size: int) -> slice:
        """This replica's rows of a global batch of ``batch_size`` rows (a context-parallel group's
        ranks share their rows: ``schemas.geometry.context_coordinates``)."""
        per_replica = batch_size // self.layout.data_parallel_degree
        block, _ = context_coordinates(self.layout, self.mesh.get_local_rank())
        return slice(block * per_replica, (block + 1) * per_replica)

    def share(
        self,
        chunks: Sequence[Decoder],
        *,
        optimizer: str,
        lr: float,
        compute_dtype: torch.dtype,
        reduce_dtype: torch.dtype,
        outside: Sequence[nn.Parameter] = (),
    ) -> Optimizer:
        """Shard ``chunks`` (ZeRO-2/3) and return the optimizer of this rank's parameters.

        Args:
            chunks: this rank's model chunks, tensor-parallel already.
            optimizer: "adamw" or "sgd" (``runtime.optim.OPTIMIZERS``).
            lr: learning rate.
            compute_dtype: the plan's precision.
            reduce_dtype: the precision gradients are summed in.
            outside: parameters outside the chunks (vocabulary shards split over the pipeline),
                averaged over the data-parallel group with the others (under ZeRO-2/3 by an
                optimizer of their own, ZeRO-1, in their fp32).
        """
        experts = expert_parameters(chunks) if self.expert_data_mesh is not None else []
        held = {id(p) for p in experts}
        meshes = self.meshes
        group, shard_group = self.mesh.get_group(), meshes.shard_group.get_group()
        # In sharding groups, ZeRO-1 reduces within the group and across the replicas (runtime.optim)
        replicas = meshes.shard[ShardingMeshAxis.REPLICATE].get_group() if meshes.shard.ndim == 2 else None
        main: DataParallelOptimizer | torch.optim.Optimizer | JointOptimizer
        if self.shards_with_fsdp:
            self._shard_chunks(chunks, experts, meshes, compute_dtype=compute_dtype, reduce_dtype=reduce_dtype)
            # read after sharding: FSDP replaces each parameter it shards by a new one
            main = make_optimizer(optimizer, [p for p in parameters(chunks) if id(p) not in held], lr)
            if outside:  # ZeRO-1 for them, as for experts
                vocabulary = DataParallelOptimizer(
                    optimizer,
                    list(outside),
                    lr,
                    group,
                    shard=True,
                    reduce_dtype=reduce_dtype,
                    shard_group=shard_group,
                    replica_group=replicas,
                )
                main = JointOptimizer([main, vocabulary])
        else:
            dense = [p for p in parameters(chunks) if id(p) not in held] + list(outside)
            shard = self.layout.zero_stage is ZeroStage.OPTIMIZER
            main = DataParallelOptimizer(
                optimizer,
                dense,
                lr,
                group,
                shard=shard,
                reduce_dtype=reduce_dtype,
                shard_group=shard_group,
                replica_group=replicas,
                offload_fraction=self.layout.optimizer_offload_fraction,
            )
        if self.expert_data_mesh is None:
            return main
        expert = self._expert_optimizer(self.expert_data_mesh, experts, optimizer, lr, reduce_dtype)
        return JointOptimizer([main, expert])

    def _shard_chunks(
        self,
        chunks: Sequence[Decoder],
        experts: list[nn.Parameter],
        meshes: ShardingMeshes,
        *,
        compute_dtype: torch.dtype,
        reduce_dtype: torch.dtype,
    ) -> None:
        """ZeRO-2/3: shard each chunk with FSDP, unit by unit (``vocabulary_units``, then its
        layers), leaving ``experts`` whole (they are reduced over their own group)."""
        if experts:
            check_sharded_experts(self.layout, fp32=compute_dtype == torch.float32)
        stage, ignored = self.layout.zero_stage, set(experts) or None
        for chunk in chunks:
            units = [*vocabulary_units(chunk), *chunk.layers.values()]
            shard_units(
                units,
                chunk,
                meshes.shard,
                zero_stage=stage,
                dtype=compute_dtype,
                reduce_dtype=reduce_dtype,
                ignored=ignored,
                secondary=meshes.secondary,
                offload=self.layout.parameter_offload,
            )

    def _expert_optimizer(
        self,
        expert_data_mesh: DeviceMesh,
        experts: list[nn.Parameter],
        optimizer: str,
        lr: float,
        reduce_dtype: torch.dtype,
    ) -> DataParallelOptimizer:
        """The experts' own optimizer, over the replicas holding them (``expert_data_mesh``):
        sharded under any ZeRO stage, their gradients divided by the dense replicas."""
        return DataParallelOptimizer(
            optimizer,
            experts,
            lr,
            expert_data_mesh.get_group(),
            shard=self.layout.zero_stage is not ZeroStage.NONE,
            reduce_dtype=reduce_dtype,
            grad_divisor=self.layout.dense_replicas,
            offload_fraction=self.layout.optimizer_offload_fraction,
        )

    def before_micro_batch(self, chunk: nn.Module, index: int, micro_batches: int) -> None:
        """Without a pipeline: ZeRO-2 keeps the gathered weights until the step's last backward
        (the cost model's m reduce-scatters and one all-gather); ZeRO-3 gathers them each time.
        Under sharding groups the replicas all-reduce the accumulated gradient shard in the last
        micro-batch's backward only (the cost model's one all-reduce a step)."""
        if not self.shards_with_fsdp:
            return
        last = index == micro_batches - 1
        if not self.layout.zero_stage.shards_parameters:
            cast(FSDPModule, chunk).set_reshard_after_backward(last)
        if self.layout.sharding_group_size is not None:
            cast(FSDPModule, chunk).set_requires_all_reduce(last)


def vocabulary_units(chunk: Decoder) -> list[nn.Module | list[nn.Module]]:
    """The FSDP units of ``chunk`` besides its layers, as torchtitan wraps them: the embedding,
    and the final norm with the output layer, each its own unit (so the output layer's gradient
    is reduced, and its gathered weights freed, right after its backward rather than at the end
    of the chunk's). A tied output layer stays with its embedding in the root unit (a parameter
    belongs to one unit)."""
    tied = chunk.tok_emb is not None and chunk.head is not None and chunk.head.weight is chunk.tok_emb.weight
    if tied:
        return []
    units: list[nn.Module | list[nn.Module]] = []
    embedding: list[nn.Module] = [m for m in (chunk.tok_emb, chunk.pos_emb) if m is not None]
    if embedding:
        units.append(embedding)
    if chunk.head is not None:
        units.append([m for m in (chunk.norm, chunk.head) if m is not None])
    return units


def parameters(chunks: Iterable[nn.Module]) -> list[nn.Parameter]:
    """Every parameter of ``chunks``, in order."""
    return [p for chunk in chunks for p in chunk.parameters()]


def shard_units(
    units: Iterable[nn.Module | list[nn.Module]],
    root: nn.Module,
    dp_mesh: DeviceMesh,
    *,
    zero_stage: ZeroStage,
    dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    ignored: set[nn.Parameter] | None = None,
    secondary: DeviceMesh | None = None,
    offload: bool = False,
) -> None:
    """ZeRO-2/3 as the runtime shards (FSDP2): each unit (a module, or modules sharded together),
    then the root with what remains, over ``dp_mesh`` (1-D, or HSDP's 2-D (replicate, shard));
    fp32 shards gathered and computed in ``dtype``, gradients summed in ``reduce_dtype``; ZeRO-3
    reshards after each forward, to the primary shard or, given the ``secondary`` (replicate,
    shard) mesh, to a shard over its groups (``reshard_after_forward`` their size). ``ignored``
    parameters stay whole and unreduced (experts, reduced over their own group). With ``offload``
    (``Layout.parameter_offload``) the shards and their gradients live in pinned host memory and
    the optimizer steps them there (``CPUOffloadPolicy``). The profiler times its own cost this way."""
    reshard: bool | int = zero_stage.shards_parameters
    if reshard and secondary is not None:  # a secondary partition of 1 rank keeps the weights whole
        reshard = secondary.size(1) if secondary.size(1) > 1 else False
    # fp32 shards are the master weights; layers gather and compute in the plan's precision
    # and sum gradients in the plan's reduce precision (as ZeRO-0/1 sum them).
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=reduce_dtype)
    shard = partial(
        fully_shard,
        mesh=dp_mesh,
        reshard_after_forward=reshard,
        mp_policy=policy,
        ignored_params=ignored,
        offload_policy=CPUOffloadPolicy(pin_memory=True) if offload else OffloadPolicy(),
    )
    with post_forward_mesh(secondary) if secondary is not None else contextlib.nullcontext():
        for unit in units:
            shard(unit)
        shard(root)


@contextlib.contextmanager
def post_forward_mesh(secondary: DeviceMesh) -> Iterator[None]:
    """Within: ``fully_shard`` with ``reshard_after_forward`` an int below the shard axis's size
    keeps the secondary shard on ``secondary``, the 2-D mesh every rank built from the layout.

    FSDP2 (torch 2.13, ``_get_post_forward_mesh_info``) would build a new DeviceMesh of the data
    mesh's ranks, ``view(-1, s)``, at each ``fully_shard`` call: new process groups for every
    unit (measured, tiny-gpt's 5 units on 4 gloo ranks: 16 groups created building the trainer
    against 6 with the one mesh; on GPUs each is a communicator), and from this rank's
    data-parallel ranks only (under a pipeline, processes of different stages would create
    different groups and hang: the gloo feasibility probe). This private hook hands it the one
    mesh instead; s = 1 (keep the weights whole) and s = the shard axis go through."""
    original = fsdp_internals._get_post_forward_mesh_info  # type: ignore[attr-defined]

    def given(reshard_after_forward: bool | int, mesh_info: FSDPMeshInfo) -> FSDPMeshInfo | None:
        if isinstance(reshard_after_forward, bool) or reshard_after_forward in (1, mesh_info.shard_mesh_size):
            return original(reshard_after_forward, mesh_info)
        if secondary.size(1) != reshard_after_forward or mesh_info.shard_mesh_size % reshard_after_forward:
            raise ValueError(
                f"reshard_after_forward={reshard_after_forward} must be the secondary mesh's group size "
                f"{secondary.size(1)} and divide the shard axis ({mesh_info.shard_mesh_size} ranks)"
            )
        return HSDPMeshInfo(secondary, shard_mesh_dim=1, replicate_mesh_dim=0)

    fsdp_internals._get_post_forward_mesh_info = given  # type: ignore[attr-defined]
    try:
        yield
    finally:
        fsdp_internals._get_post_forward_mesh_info = original  # type: ignore[attr-defined]
