"""The product's data types. A leaf: imports nothing of ours but ``planner.schemas.errors``."""

from planner.schemas.calibration import Calibration
from planner.schemas.cluster import (
    ClusterProfile,
    CollectiveRecord,
    DeviceKind,
    DeviceProfile,
    MatmulModel,
    MatmulRecord,
    NicKind,
    NodeOverride,
    Provenance,
)
from planner.schemas.device_map import DeviceMap
from planner.schemas.enums import (
    Activation,
    AttentionKernel,
    CollectiveOp,
    ContextParallelKind,
    DType,
    Kernels,
    MoeDispatcher,
    NormKind,
    OnFault,
    Optimizer,
    Placement,
    PositionEmbedding,
    Recompute,
    Schedule,
    VocabularyLayout,
    ZeroStage,
)
from planner.schemas.estimate import Estimate, MemoryBreakdown, StageEstimate, TimeBreakdown
from planner.schemas.layout import Layout
from planner.schemas.links import LinkMatrix, LinkProfile
from planner.schemas.model import ModelSpec
from planner.schemas.op_records import (
    AttentionRecord,
    ElementwiseRecord,
    LayerNormRecord,
    LayerRecord,
    OpKind,
    OpRecord,
    OptimizerRecord,
    PipelineSlotRecord,
    ShardedUnitRecord,
)
from planner.schemas.plan import Alternative, ClusterRef, Plan
from planner.schemas.report import RankMemory, RunReport, Straggler, TimingWindow
from planner.schemas.rope import RopeScaling, RopeType
from planner.schemas.routing import ExpertPlacement, PlacementMetrics, RoutingStats
from planner.schemas.training import TrainingSpec

__all__ = [
    "Activation",
    "Alternative",
    "AttentionKernel",
    "AttentionRecord",
    "Calibration",
    "ClusterProfile",
    "ClusterRef",
    "CollectiveOp",
    "CollectiveRecord",
    "ContextParallelKind",
    "DType",
    "DeviceKind",
    "DeviceMap",
    "DeviceProfile",
    "ElementwiseRecord",
    "Estimate",
    "ExpertPlacement",
    "Kernels",
    "LayerNormRecord",
    "LayerRecord",
    "Layout",
    "LinkMatrix",
    "LinkProfile",
    "MatmulModel",
    "MatmulRecord",
    "MemoryBreakdown",
    "ModelSpec",
    "MoeDispatcher",
    "NicKind",
    "NodeOverride",
    "NormKind",
    "OnFault",
    "OpKind",
    "OpRecord",
    "Optimizer",
    "OptimizerRecord",
    "PipelineSlotRecord",
    "Placement",
    "PlacementMetrics",
    "Plan",
    "PositionEmbedding",
    "Provenance",
    "RankMemory",
    "Recompute",
    "RopeScaling",
    "RopeType",
    "RoutingStats",
    "RunReport",
    "Schedule",
    "ShardedUnitRecord",
    "StageEstimate",
    "Straggler",
    "TimeBreakdown",
    "TimingWindow",
    "TrainingSpec",
    "VocabularyLayout",
    "ZeroStage",
]
