"""Malformed inputs end in one line and exit code 2, never a traceback or a hang.

Hypothesis mutates valid model, cluster, plan and routing-trace files (a value swapped for NaN,
infinity, zero, a negative or huge number, a string, null, a list; a key deleted or added; the
whole file replaced by JSON of another shape, nested deeper than a parser recurses, truncated
text or binary bytes; a trace routing a token to the same expert twice) and draws the main
CLI options from valid and absurd values (one part of a command line at a time), then runs the
CLI in-process as ``planner.cli.main`` would (a PlannerError is its one line and its exit code).
Every run must exit 0 or 2, raise nothing else, and finish within ``BOUND_S``. Each example is
one run: ``EXAMPLES`` per test, derandomized so that CI tries the same inputs each time.
``planner run --dry-run`` is left out (seconds per run under fake tensors); it reads its plan with
the same ``load_plan`` as the plan commands here.
"""

import contextlib
import json
import math
import os
import signal
import tempfile
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner import api
from planner.cli import app
from planner.files.cluster_presets import cluster_preset
from planner.files.models import load_model
from planner.files.routing_trace import synthetic_trace, write_trace
from planner.schemas import Layout, TrainingSpec
from planner.schemas.errors import PlannerError

BOUND_S = 10.0
"""CPU seconds a single run may take before it counts as a hang (most take well under 1 s)."""
EXAMPLES = int(os.environ.get("PLANNER_FUZZ_EXAMPLES", "100"))
"""Inputs per fuzz test: 100 in CI (five tests: 500 runs, about 30 s); a longer run sets
PLANNER_FUZZ_EXAMPLES (1000: 5,000 runs, about 6 minutes)."""

BATCH = ["--global-batch-size", "16", "--seq-len", "128"]

JUNK_VALUES: list[Any] = [
    math.nan,
    math.inf,
    -math.inf,
    0,
    -1,
    0.5,
    -0.0,
    10**30,
    10**400,
    -(10**18),
    2**63,
    1e308,
    1e-320,
    "",
    "x",
    "NaN",
    None,
    True,
    False,
    [],
    {},
    [1, 2],
    {"a": 1},
]
"""Values a mutation puts in place of a valid one."""

junk_values = st.one_of(
    st.sampled_from(JUNK_VALUES).map(lambda v: json.loads(json.dumps(v))),  # a copy: mutations change it
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    output: str
    error: BaseException | None
    """An exception other than a PlannerError: a traceback, as the console script would print it."""


class Hang(Exception):
    """A run exceeded its time bound."""


BOUND_WALL_S = 6 * BOUND_S
"""The same bound in wall-clock time, for a run that waits without computing (a machine shared
with other jobs slows every run, so the bound that counts is on this process's CPU time)."""


@contextlib.contextmanager
def time_bound(cpu_s: float, wall_s: float) -> Iterator[None]:
    """Raise Hang in the main thread once this process has computed for ``cpu_s`` or waited for
    ``wall_s`` (a hang in C code raises when it returns to Python)."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise Hang(f"still running after {cpu_s:g} s of CPU time or {wall_s:g} s")

    previous = {sig: signal.signal(sig, expire) for sig in (signal.SIGPROF, signal.SIGALRM)}
    signal.setitimer(signal.ITIMER_PROF, cpu_s)
    signal.setitimer(signal.ITIMER_REAL, wall_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def invoke(args: list[str]) -> Outcome:
    """Run the CLI in-process as ``planner.cli.main`` runs it: a PlannerError is its exit code."""
    with time_bound(BOUND_S, BOUND_WALL_S):
        result = CliRunner().invoke(app, args)
    error = result.exception
    if isinstance(error, SystemExit):
        return Outcome(result.exit_code, result.output, None)
    if isinstance(error, PlannerError):  # main's one line
        return Outcome(error.exit_code, f"{result.output}error: {error}\n", None)
    return Outcome(result.exit_code, result.output, error)


def check(args: list[str], tried: Callable[[], str] = lambda: "") -> None:
    """The contract: exit 0 or 2, no exception other than a PlannerError, no hang."""
    outcome = invoke(args)
    what = f"planner {' '.join(args)}\n{tried()}"
    if isinstance(outcome.error, Hang):
        raise AssertionError(f"no answer within {BOUND_S:g} s of CPU time from {what}")
    if outcome.error is not None:
        trace = "".join(traceback.format_exception(outcome.error))
        raise AssertionError(f"traceback from {what}\n{trace}")
    assert outcome.exit_code in (0, 2), f"exit {outcome.exit_code} from {what}\n{outcome.output}"
    assert "Traceback" not in outcome.output, f"{what}\n{outcome.output}"


# --- mutations of a parsed file ---------------------------------------------------------------------


def _children(node: Any) -> list[Any]:
    if isinstance(node, dict):
        return list(node)
    if isinstance(node, list):
        return list(range(len(node)))
    return []


@st.composite
def paths(draw: st.DrawFn, tree: Any) -> list[Any]:
    """A path into ``tree``, chosen level by level (each key of a level as likely as another)."""
    path: list[Any] = []
    node = tree
    while (keys := _children(node)) and (not path or draw(st.integers(0, 3)) > 0):
        key = draw(st.sampled_from(keys))
        path.append(key)
        node = node[key]
    return path


def _at(tree: Any, path: list[Any]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _number_paths(node: Any, path: tuple[Any, ...] = ()) -> Iterator[list[Any]]:
    """The paths of the numbers in ``node``."""
    if isinstance(node, int | float) and not isinstance(node, bool):
        yield list(path)
    for key in _children(node):
        yield from _number_paths(node[key], (*path, key))


ABSURD_NUMBERS: list[Any] = [math.nan, math.inf, -math.inf, 0, -1, -0.5, 10**6, 10**18, 10**30, 10**400, 1e308, 1e-320]


@st.composite
def mutated_tree(draw: st.DrawFn, tree: Mapping[str, Any], *, mutations: int = 3) -> Any:
    """``tree`` with one to ``mutations`` values replaced, keys deleted or added; or one of its
    numbers (any one as likely as another) made absurd."""
    copy = json.loads(json.dumps(tree))
    numbers = list(_number_paths(copy))
    if numbers and draw(st.booleans()):
        path = numbers[draw(st.integers(0, len(numbers) - 1))]
        _at(copy, path[:-1])[path[-1]] = draw(st.sampled_from(ABSURD_NUMBERS))
        return copy
    for _ in range(draw(st.integers(1, mutations))):
        path = draw(paths(copy))
        if not path:
            continue
        parent, key = _at(copy, path[:-1]), path[-1]
        kind = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add", "scale"]))
        if kind == "replace":
            parent[key] = draw(junk_values)
        elif kind == "delete":
            del parent[key]
        elif kind == "add" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=12))] = draw(junk_values)
        elif kind == "scale" and isinstance(parent[key], int | float) and not isinstance(parent[key], bool):
            factor = draw(st.sampled_from([0, -1, 10**3, 10**9, 10**18, 10**30]))
            parent[key] = parent[key] * factor
    return copy


@st.composite
def file_bytes(draw: st.DrawFn, tree: Mapping[str, Any]) -> bytes:
    """The bytes of a mutated file: usually ``tree`` mutated as JSON; else another shape, nested too deep
    for a parser, truncated, or binary."""
    kind = draw(st.sampled_from(["tree"] * 6 + ["shape", "nested", "truncated", "binary", "text"]))
    if kind == "tree":
        return json.dumps(draw(mutated_tree(tree))).encode()
    if kind == "shape":
        return json.dumps(draw(junk_values)).encode()
    if kind == "nested":
        depth = draw(st.sampled_from([10**3, 10**4, 10**5]))
        opening, closing = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        return (opening * depth + "1" + closing * depth).encode()
    if kind == "truncated":
        text = json.dumps(tree).encode()
        return text[: draw(st.integers(0, len(text) - 1))]
    if kind == "binary":
        return draw(st.binary(max_size=256))
    return draw(st.text(max_size=64)).encode("utf-8", "surrogatepass")


# --- the valid inputs mutated -------------------------------------------------------------------------


def _model_file() -> dict[str, Any]:
    text = (resources.files("planner") / "presets" / "models" / "tiny-moe.yaml").read_text(encoding="utf-8")
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


MODEL = _model_file()
CLUSTER = json.loads(cluster_preset("dgx-h100", 1).model_dump_json())
"""An 8-GPU node, as a profile file (the preset's figures, its attention and collective records)."""


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A valid plan of tiny-moe on the preset node: ep 2 over dp 4, tp 2, pipeline of 1."""
    model, cluster = load_model("tiny-moe"), cluster_preset("dgx-h100", 1)
    training = TrainingSpec(global_batch_size=16, seq_len=128)
    layout = Layout(
        data_parallel_degree=4,
        tensor_parallel_degree=2,
        pipeline_parallel_degree=1,
        expert_parallel_degree=2,
        micro_batch_size=1,
        sequence_parallel=True,
    )
    est = api.estimate(model, cluster, training, layout)
    plan = api.make_plan(model, training, cluster, "dgx-h100:1", layout, est)
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    api.save_plan(plan, path)
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


@contextlib.contextmanager
def example_dir(root: Path) -> Iterator[Path]:
    """A fresh working folder for each example (a search's default storage is a file in the working directory)."""
    with tempfile.TemporaryDirectory(dir=root) as folder, contextlib.chdir(folder):
        yield Path(folder)


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)

ESTIMATE_TINY_MOE = ["--dp", "4", "--tp", "2", "--ep", "2", "--sequence-parallel"]
COMMANDS_ON_INPUTS = st.sampled_from(["estimate", "estimate", "search"])


def _write(path: Path, content: bytes) -> Callable[[], str]:
    path.write_bytes(content)
    return lambda: f"{path.name}: {content[:2000]!r}"


def _model_files(workdir: Path, data: st.DataObject) -> None:
    suffix = data.draw(st.sampled_from([".json", ".yaml"]))
    tried = _write(workdir / f"model{suffix}", data.draw(file_bytes(MODEL)))
    command = data.draw(COMMANDS_ON_INPUTS)
    layout = ESTIMATE_TINY_MOE if command == "estimate" else []
    check([command, "-m", f"model{suffix}", "-c", "dgx-h100:1", *BATCH, *layout], tried)


def _cluster_files(workdir: Path, data: st.DataObject) -> None:
    tried = _write(workdir / "cluster.json", data.draw(file_bytes(CLUSTER)))
    command = data.draw(COMMANDS_ON_INPUTS)
    layout = ESTIMATE_TINY_MOE if command == "estimate" else []
    check([command, "-m", "tiny-moe", "-c", "cluster.json", *BATCH, *layout], tried)


PLAN_COMMANDS: list[list[str]] = [
    ["explain", "plan.json"],
    ["estimate", "--plan", "plan.json"],
    ["estimate", "--plan", "plan.json", "--format", "json"],
    ["export", "plan.json", "--to", "torchtitan"],
    ["export", "plan.json", "--to", "megatron"],
    ["export", "plan.json", "--to", "deepspeed"],
    ["launch", "plan.json"],
]


def _plan_files(workdir: Path, data: st.DataObject, plan: dict[str, Any]) -> None:
    tried = _write(workdir / "plan.json", data.draw(file_bytes(plan)))
    check(data.draw(st.sampled_from(PLAN_COMMANDS)), tried)


TRACE_LAYERS, TRACE_EXPERTS, TRACE_K = 4, 4, 2
"""tiny-moe's routing: 4 MoE layers of 4 experts, top-2."""


@st.composite
def trace_bytes(draw: st.DrawFn, folder: Path) -> bytes:
    """A routing trace of tiny-moe, its arrays mutated, or a file that is not one."""
    ids = synthetic_trace(
        tokens=64,
        layers=TRACE_LAYERS,
        num_experts=TRACE_EXPERTS,
        experts_per_token=TRACE_K,
        skew=1.0,
        affinity=0.5,
        seed=0,
    )
    arrays: dict[str, Any] = {"expert_ids": ids, "num_experts": np.int64(TRACE_EXPERTS), "model": np.str_("tiny-moe")}
    kind = draw(st.sampled_from(["arrays"] * 6 + ["binary", "truncated", "json"]))
    if kind == "arrays":
        key = draw(st.sampled_from(sorted(arrays)))
        change = draw(st.sampled_from(["value", "array", "delete", "add", "shape", "dtype", "repeat"]))
        if change == "repeat":  # a token sent to the same expert twice in a layer
            token, layer = draw(st.integers(0, ids.shape[0] - 1)), draw(st.integers(0, TRACE_LAYERS - 1))
            arrays["expert_ids"] = ids.copy()
            arrays["expert_ids"][token, layer, 1] = ids[token, layer, 0]
        elif change == "value":
            arrays[key] = np.asarray(draw(st.sampled_from([v for v in JUNK_VALUES if not isinstance(v, dict)])))
        elif change == "array":
            shape = draw(st.lists(st.integers(0, 5), max_size=4))
            low, high = draw(st.sampled_from([(-3, 3), (0, 2**31), (-(2**62), 2**62)]))
            arrays[key] = np.random.default_rng(draw(st.integers(0, 99))).integers(low, high, size=shape)
        elif change == "delete":
            del arrays[key]
        elif change == "add":
            arrays["extra"] = np.zeros(3)
        elif change == "shape":
            arrays["expert_ids"] = ids.reshape(-1)[: draw(st.integers(0, ids.size))]
        else:
            dtype = draw(st.sampled_from(["float64", "U3", "bool", "int8", "uint64"]))
            with contextlib.suppress(ValueError):  # a name does not become a number
                arrays[key] = np.asarray(arrays[key]).astype(dtype)
        path = folder / "written.npz"
        np.savez(path, **arrays)
        return path.read_bytes()
    if kind == "truncated":
        path = folder / "written.npz"
        write_trace(path, ids, TRACE_EXPERTS, "tiny-moe")
        content = path.read_bytes()
        return content[: draw(st.integers(0, len(content) - 1))]
    if kind == "json":
        return json.dumps(draw(junk_values)).encode()
    return draw(st.binary(max_size=256))


TRACE_SEARCH = ["search", "-m", "tiny-moe", "-c", "dgx-h100:1", *BATCH, "--routing-trace", "trace.npz"]
TRACE_EXPLAIN = ["explain", "plan.json", "--routing-trace", "trace.npz"]


def _routing_traces(workdir: Path, data: st.DataObject, plan: dict[str, Any]) -> None:
    (workdir / "plan.json").write_text(json.dumps(plan))
    tried = _write(workdir / "trace.npz", data.draw(trace_bytes(workdir)))
    command = data.draw(st.sampled_from([TRACE_SEARCH, [*TRACE_SEARCH, "--expert-replicas", "1"], TRACE_EXPLAIN]))
    check(command, tried)


# --- option values ------------------------------------------------------------------------------------

ABSURD_OPTIONS = ["0", "-1", "1e400", "nan", "inf", "-inf", "1.5", "x", "", str(10**18), str(10**30), str(2**63)]
absurd_numbers = st.one_of(
    st.sampled_from(ABSURD_OPTIONS),
    st.integers(-(10**40), 10**40).map(str),
    st.floats().map(str),
)
numbers = st.sampled_from(["1", "2", "4", "8", "16"]) | st.integers(1, 64).map(str) | absurd_numbers
"""An option's value: a small valid number two times in three, an absurd one otherwise."""
MODELS = ["tiny-moe", "tiny-gpt", "TINY-GPT", "nope", "", "model.json", "missing.yaml", "dgx-h100:1", "."]
CLUSTERS = [
    "dgx-h100:1",
    "dgx-a100-80g:2",
    "dgx-h100:0",
    "dgx-h100:-1",
    f"dgx-h100:{10**9}",
    f"dgx-h100:{10**30}",
    "dgx-h100",
    "dgx-h100:1+dgx-a100-80g:1",
    "+",
    "dgx-h100:x",
    "",
    ".",
    "missing.json",
    "tiny-moe",
]
OUTPUTS = ["out.json", ".", "missing/out.json", "out.json/inner.json", "/", ""]
STORAGES = [
    "sqlite:///ok.db",
    "bogus://x",
    "sqlite:////",
    "sqlite:///missing/x.db",
    "sqlite:///.",
    "x",
    "",
    "sqlite:///model.json",
]
"""Storage URLs: a new file, then absurd ones (model.json, written in each example, is no database)."""


VALID_VALUES = {"--memory-margin": ["0", "0.1", "0.5"], "--zero-stage": ["0", "1", "3"], "--capacity-factor": ["1.25"]}
"""Valid values of the options that take other numbers than 1, 2, 4, 8."""


@st.composite
def options(draw: st.DrawFn, names: list[str], *, valid: bool) -> list[str]:
    """Up to four of ``names``, each with a valid value or (not ``valid``) any ``numbers``."""
    chosen = draw(st.lists(st.sampled_from(names), max_size=4, unique=True))
    out: list[str] = []
    for name in chosen:
        out += [name, draw(st.sampled_from(VALID_VALUES.get(name, ["1", "2", "4", "8"])) if valid else numbers)]
    return out


ESTIMATE_NUMBER_OPTIONS = [
    "--dp",
    "--tp",
    "--pp",
    "--ep",
    "--etp",
    "--micro-batch-size",
    "--zero-stage",
    "--virtual-stages",
    "--capacity-factor",
    "--layer-split",
    "--sharding-group-size",
    "--secondary-partition-size",
]
SEARCH_NUMBER_OPTIONS = [
    "--top-k",
    "--memory-margin",
    "--seed",
    "--tp",
    "--pp",
    "--dp",
    "--ep",
    "--micro-batch-size",
    "--virtual-stages",
    "--zero-stage",
    "--max-tp",
    "--capacity-factor",
    "--expert-replicas",
]
RANGE_OPTIONS = ["--tp", "--pp", "--dp", "--ep", "--micro-batch-size", "--virtual-stages", "--zero-stage"]


BAD_PARTS = ["none", "model", "cluster", "batch", "output", "options", "options", "storage", "storage"]


def _cli_options(workdir: Path, data: st.DataObject) -> None:
    """One part of a command line absurd (or none), the others valid, so that each gets past the others."""
    (workdir / "model.json").write_text(json.dumps(MODEL))
    bad = data.draw(st.sampled_from(BAD_PARTS))
    if bad == "output" and data.draw(st.booleans()):
        (workdir / "out.json").mkdir()
    model = data.draw(st.sampled_from(MODELS if bad == "model" else MODELS[:2]))
    cluster = data.draw(st.sampled_from(CLUSTERS if bad == "cluster" else CLUSTERS[:2]))
    batch = ["--global-batch-size", data.draw(numbers), "--seq-len", data.draw(numbers)] if bad == "batch" else BATCH
    valid = bad != "options"
    values = st.sampled_from(["1", "2", "4", "8"]) if valid else numbers
    command = data.draw(st.sampled_from(["estimate"] * 4 + ["search"] * 3 + ["search-optuna"]))
    if bad == "storage":
        command = "search-optuna"
    args = ["-m", model, "-c", cluster, *batch]
    if bad == "output" or data.draw(st.booleans()):
        args += ["--output", data.draw(st.sampled_from(OUTPUTS if bad == "output" else OUTPUTS[:1]))]
    if command == "estimate":
        args = ["estimate", *args, "--dp", "8", *data.draw(options(ESTIMATE_NUMBER_OPTIONS, valid=valid))]
    elif command == "search":
        args = ["search", *args, *data.draw(options(SEARCH_NUMBER_OPTIONS, valid=valid))]
        if data.draw(st.booleans()):  # a range or list, as the search's constraints take them
            ends = data.draw(st.lists(values, min_size=1, max_size=3))
            args += [data.draw(st.sampled_from(RANGE_OPTIONS)), data.draw(st.sampled_from(["-", ","])).join(ends)]
    else:
        storage = data.draw(st.sampled_from(STORAGES if bad == "storage" else STORAGES[:1]))
        args = ["search", *args, "--strategy", "optuna", "--trials", "3", "--storage", storage]
    check(args)


# --- the tests ---------------------------------------------------------------------------------------


def _fuzz(body: Callable[..., None]) -> Callable[..., None]:
    return FUZZ(given(data=st.data())(body))


def _model_test(tmp_path: Path, data: st.DataObject) -> None:
    with example_dir(tmp_path) as folder:
        _model_files(folder, data)


def _cluster_test(tmp_path: Path, data: st.DataObject) -> None:
    with example_dir(tmp_path) as folder:
        _cluster_files(folder, data)


def _plan_test(tmp_path: Path, plan_file: dict[str, Any], data: st.DataObject) -> None:
    with example_dir(tmp_path) as folder:
        _plan_files(folder, data, plan_file)


def _trace_test(tmp_path: Path, plan_file: dict[str, Any], data: st.DataObject) -> None:
    with example_dir(tmp_path) as folder:
        _routing_traces(folder, data, plan_file)


def _options_test(tmp_path: Path, data: st.DataObject) -> None:
    with example_dir(tmp_path) as folder:
        _cli_options(folder, data)


test_malformed_model_files = _fuzz(_model_test)
test_malformed_cluster_files = _fuzz(_cluster_test)
test_malformed_plan_files = _fuzz(_plan_test)
test_malformed_routing_traces = _fuzz(_trace_test)
test_absurd_options = _fuzz(_options_test)
