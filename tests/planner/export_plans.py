"""Plans to export, and Megatron-LM's words parsed back: shared by the export tests
(``test_exports.py``) and the checks of each export by its target's own code
(``test_exports_frameworks.py``)."""

import shlex
from typing import Any

from cost_models.estimate import estimate
from planner import api
from planner.files.clusters import load_cluster
from planner.files.models import load_model
from planner.files.plans import make_plan
from planner.schemas import Layout, ModelSpec, Plan, TrainingSpec

CLUSTER_SPEC = "dgx-h100:2"  # 16 devices
CLUSTER = load_cluster(CLUSTER_SPEC)
BLACKWELL_SPEC = "dgx-b200:2"  # 16 devices
GPT16 = load_model("tiny-gpt").model_copy(update={"num_hidden_layers": 16, "name": "tiny-gpt-16"})


def plan(model: ModelSpec | str, layout: Layout, batch: int = 64, *, blackwell: bool = False, **training: Any) -> Plan:
    """The plan of ``layout`` on the 16 devices (H100s; B200s with ``blackwell``, whose tensor cores
    MXFP8 needs), priced, at sequence length 128."""
    spec = load_model(model) if isinstance(model, str) else model
    where = BLACKWELL_SPEC if blackwell else CLUSTER_SPEC
    cluster = load_cluster(where)
    train = TrainingSpec(global_batch_size=batch, seq_len=128, **training)
    return make_plan(spec, train, cluster, where, layout, estimate(spec, train, cluster, layout))


def layout(dp: int, tp: int = 1, pp: int = 1, mb: int = 1, **more: Any) -> Layout:
    return Layout(
        data_parallel_degree=dp, tensor_parallel_degree=tp, pipeline_parallel_degree=pp, micro_batch_size=mb, **more
    )


def megatron_words(exported: Plan) -> list[str]:
    """The Megatron-LM export as the words a shell passes on."""
    return shlex.split(api.export(exported, "megatron"))
