"""The product's data types. A leaf: imports nothing of ours but ``planner.schemas.errors``."""

from planner.schemas.calibration import Calibration
from planner.schemas.cluster import (
    ClusterProfile,
    CollectiveRecord,
    DeviceProfile,
    LinkMatrix,
    LinkProfile,
    MatmulModel,
    MatmulRecord,
    OpKind,
    OpRecord,
    Provenance,
    is_cpu_device,
)
from planner.schemas.device_map import DeviceMap
from planner.schemas.enums import (
    Activation,
    AttentionKernel,
    CollectiveOp,
    DType,
    NormKind,
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
from planner.schemas.model import ModelSpec
from planner.schemas.plan import Alternative, ClusterRef, Plan
from planner.schemas.report import RankMemory, RunReport
from planner.schemas.training import TrainingSpec

__all__ = [
    "Activation",
    "Alternative",
    "AttentionKernel",
    "Calibration",
    "ClusterProfile",
    "ClusterRef",
    "CollectiveOp",
    "CollectiveRecord",
    "DType",
    "DeviceMap",
    "DeviceProfile",
    "Estimate",
    "Layout",
    "LinkMatrix",
    "LinkProfile",
    "MatmulModel",
    "MatmulRecord",
    "MemoryBreakdown",
    "ModelSpec",
    "NormKind",
    "OpKind",
    "OpRecord",
    "Optimizer",
    "Placement",
    "Plan",
    "PositionEmbedding",
    "Provenance",
    "RankMemory",
    "Recompute",
    "RunReport",
    "Schedule",
    "StageEstimate",
    "TimeBreakdown",
    "TrainingSpec",
    "VocabularyLayout",
    "ZeroStage",
    "is_cpu_device",
]
