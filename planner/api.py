"""The planner's Python API: what the CLI calls and what users import, one name per step.

profile (under torchrun) -> search / estimate -> run (under torchrun) or dry_run -> tune / validate.
Each name is a flow (``planner.flows``: inputs and one Settings object in, a result object out;
none prints) or a file reader (``planner.files``). torch is imported only inside the flows that
need it (profile, run, dry_run, a local tune, replan from a checkpoint), so that importing the API,
and planning on a laptop, needs no torch; without it those raise MissingExtraError naming the extra.

>>> import planner
>>> training = planner.TrainingSpec(global_batch_size=64, seq_len=8192)
>>> plans = planner.search("llama3-8b", "dgx-h100:1", training, planner.SearchSettings(top_k=3))
>>> est = planner.estimate("llama3-8b", "dgx-h100:1", training,
...                        planner.Layout(data_parallel_degree=8, tensor_parallel_degree=1,
...                                       pipeline_parallel_degree=1, micro_batch_size=1, zero_stage=2))
>>> est.fits  # ZeRO-1 would need more than the H100's 80 GB
True
"""

from planner.export.targets import ExportTarget
from planner.files.clusters import load_cluster, save_cluster
from planner.files.layout_parts import load_device_map, load_expert_placement
from planner.files.models import load_model
from planner.files.plans import load_plan, make_plan, read_plan, save_plan
from planner.flows.estimate import dropped_token_share, estimate, homogeneous_estimate, stage_device_names
from planner.flows.explain import Explanation, compare_placements, expert_traffic, explain, pipeline_timeline
from planner.flows.export import Exported, export_plan, export_text
from planner.flows.launch import check_devices, launch_node
from planner.flows.profile import profile
from planner.flows.replan import Replan, replan, survivors
from planner.flows.run import check_resumable, dry_run, run
from planner.flows.search import search, search_outcome, search_recipes
from planner.flows.tune import tune, validate
from planner.schemas.settings import (
    Budget,
    OptimizerName,
    ProfileSettings,
    ReplanSettings,
    RunSettings,
    SearchSettings,
    Selection,
    StrategyName,
    TuneSettings,
)

__all__ = [
    "Budget",
    "Explanation",
    "ExportTarget",
    "Exported",
    "OptimizerName",
    "ProfileSettings",
    "Replan",
    "ReplanSettings",
    "RunSettings",
    "SearchSettings",
    "Selection",
    "StrategyName",
    "TuneSettings",
    "check_devices",
    "check_resumable",
    "compare_placements",
    "dropped_token_share",
    "dry_run",
    "estimate",
    "expert_traffic",
    "explain",
    "export_plan",
    "homogeneous_estimate",
    "launch_node",
    "load_cluster",
    "load_device_map",
    "load_expert_placement",
    "load_model",
    "load_plan",
    "make_plan",
    "pipeline_timeline",
    "profile",
    "read_plan",
    "replan",
    "run",
    "save_cluster",
    "save_plan",
    "search",
    "search_outcome",
    "search_recipes",
    "stage_device_names",
    "survivors",
    "tune",
    "validate",
]
export = export_text
# ``export`` is planner.api.export only: ``planner.export`` is the exports' subpackage, which an
# attribute of that name on the package would hide (see planner/__init__.py).
