"""The one-GPU check's steps (benchmarks/gpu_check.sh runs them in order, each capped and logged).

Every step merges what it found into ``$OUT/results.json`` (one key a step), so a step that fails
or is cut off loses only its own figures:

- ``env``: torch, CUDA, driver, device, memory, SDPA priority.
- ``preset OUT``: the dgx-h100 preset cut to one GPU (published figures), to price the same
  layouts as the measured profile does.
- ``versus-preset PROFILE PRESET``: the profiler's measured figures beside the preset's (BF16 GEMM
  rate, HBM bandwidth, memory; host-device copies, which the preset does not publish): within
  10% or not, said per figure.
- ``fixture PROFILE OUT``: the measured profile with when and where it was taken (date, torch,
  CUDA, driver) in its provenance, to commit as ``tests/fixtures/h100-profile.json``.
- ``dry PLAN``: the fake-tensor trace of the plan's rank 0 (``planner.dry_run``).
- ``compare PLAN...``: per plan, the measured step time and memory (its run report) beside the
  estimate on the measured profile, on the preset, and the dry run; a table, JSON and a PNG.

On a CPU (``gpu_check.sh --cpu``) every step runs on tiny models, so the script cannot rot between
GPU runs; the figures then say nothing about a GPU.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

GIB = 2**30
TOLERANCE = {"step time": 0.15, "memory": 0.05, "versus preset": 0.10}
"""What the GPU check accepts: step time within 15%, peak memory within 5%, the profiler's BF16 GEMM
rate and HBM bandwidth within 10% of the preset's published figures."""


def out_dir() -> Path:
    return Path(os.environ.get("OUT", "out/gpu"))


def save(key: str, value: Any) -> None:
    """Merge ``value`` under ``key`` into $OUT/results.json and print it."""
    path = out_dir() / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps(results | {key: value}, indent=1, default=str) + "\n")
    print(f"{key}: {json.dumps(value, default=str)[:1500]}", flush=True)


def driver_version() -> str | None:
    """The NVIDIA driver's version, from nvidia-smi; None where there is none."""
    if shutil.which("nvidia-smi") is None:
        return None
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    done = subprocess.run(query, capture_output=True, text=True, check=False)
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def env() -> None:
    import torch

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "driver": driver_version(),
        "device": "cpu",
    }
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        free_bytes, total_bytes = torch.cuda.mem_get_info(0)
        info |= {
            "device": properties.name,
            "sms": properties.multi_processor_count,
            "memory_total_bytes": total_bytes,
            "memory_free_bytes": free_bytes,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "sdpa_priority": [str(b) for b in torch._C._get_sdp_priority_order()],
        }
    save("env", info)


def preset(out: str) -> None:
    from planner.files.clusters import load_cluster, save_cluster
    from planner.flows.replan import survivors

    save_cluster(survivors(load_cluster("dgx-h100:1"), 1), out)


def _figures(cluster: Any) -> dict[str, float]:
    """What is compared with the preset: the BF16 GEMM rate (the best measured GEMM where there are records,
    else peak x fraction), HBM bandwidth and memory, of a profile's device."""
    from planner.schemas import DType

    device = cluster.device
    bf16 = [r for r in device.matmul_records if r.dtype == DType.BF16]
    best = max((2 * r.m * r.n * r.k / r.time_s for r in bf16), default=0.0)
    modelled = device.peak_flop_per_s.get(DType.BF16, 0.0) * device.matmul.peak_fraction
    figures = {
        "bf16 GEMM TFLOP/s": (best or modelled) / 1e12,
        "HBM GB/s": device.memory_bandwidth_bytes_per_s / 1e9,
        "memory GiB": device.memory_bytes / GIB,
    }
    copies = {
        "host to device GB/s": device.host_to_device_bytes_per_s,
        "device to host GB/s": device.device_to_host_bytes_per_s,
    }
    host = cluster.host
    if host is not None:  # the offloaded optimizer's CPU Adam (the node's ranks at once) and host memory
        figures |= {"host Adam Gparam/s": host.adam_params_per_s / 1e9, "host memory GiB": host.memory_bytes / GIB}
    return figures | {name: rate / 1e9 for name, rate in copies.items() if rate is not None}


def versus_preset(profile: str, preset_path: str) -> None:
    from planner.files.clusters import load_cluster

    measured, published = _figures(load_cluster(profile)), _figures(load_cluster(preset_path))
    rows = {}
    for name, value in measured.items():
        if name not in published:  # the preset publishes no host-device copy rate
            rows[name] = {"measured": value}
            print(f"  {name:20} measured {value:10.1f}  (no published figure)")
            continue
        ratio = value / published[name]
        within = abs(ratio - 1) <= TOLERANCE["versus preset"]
        rows[name] = {"measured": value, "preset": published[name], "ratio": ratio, "within 10%": within}
        print(f"  {name:20} measured {value:10.1f}  preset {published[name]:10.1f}  ratio {ratio:.3f}")
    save("versus preset", rows)


def fixture(profile: str, out: str) -> None:
    """The profile with its date, torch, CUDA and driver in ``provenance.settings``."""
    import torch

    raw = json.loads(Path(profile).read_text())
    taken = {"taken": datetime.now(UTC).date().isoformat(), "torch": torch.__version__}
    taken |= {"cuda": torch.version.cuda or "none", "driver": driver_version() or "none"}
    raw["provenance"]["settings"] = raw["provenance"].get("settings", {}) | taken
    Path(out).write_text(json.dumps(raw, indent=1) + "\n")
    save("fixture", taken | {"path": out})


def dry(plan: str) -> None:
    from planner.flows.run import dry_run

    traced = dry_run(plan, rank=0)
    save(f"dry run {Path(plan).stem}", {"traced_bytes": traced.peak_bytes, "seconds": traced.seconds})


def _row(plan_path: Path, preset_path: str | None, results: dict[str, Any]) -> dict[str, Any]:
    """One plan's predicted and measured figures (seconds, bytes)."""
    from planner.files.clusters import load_cluster
    from planner.files.plans import load_plan
    from planner.flows.estimate import estimate

    plan, name = load_plan(plan_path), plan_path.stem
    memory = plan.estimate.stages[0].memory
    row: dict[str, Any] = {
        "layout": plan.layout.describe(),
        "predicted step s": plan.estimate.step_time_s,
        "predicted bytes": memory.total_bytes,
        "predicted tensor bytes": memory.tensors_bytes,
        "dry run bytes": results.get(f"dry run {name}", {}).get("traced_bytes"),
    }
    if preset_path is not None:
        on_preset = estimate(plan.model, load_cluster(preset_path), plan.training, plan.layout)
        row["preset step s"] = on_preset.step_time_s
    report_path = plan_path.with_name(f"report_{name}.json")
    if report_path.exists():
        report = json.loads(report_path.read_text())
        rank0 = report["memory"][0]
        row |= {
            "measured step s": report["measured_step_time_s"],
            "losses": [report["losses"][0], report["losses"][-1]],
        }
        row |= {f"measured {key}": value for key, value in rank0.items() if key.endswith("_bytes")}
        row["step time ratio"] = report["measured_step_time_s"] / plan.estimate.step_time_s
        row["step time within 15%"] = abs(row["step time ratio"] - 1) <= TOLERANCE["step time"]
        if rank0.get("peak_bytes"):  # tensors: max_memory_allocated on CUDA, MemTracker's peak on a CPU
            row["tensor memory ratio"] = rank0["peak_bytes"] / row["predicted tensor bytes"]
            row["tensor memory within 5%"] = abs(row["tensor memory ratio"] - 1) <= TOLERANCE["memory"]
    return row


def compare(plans: list[str], preset_path: str | None) -> None:
    results_path = out_dir() / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    rows = {Path(p).stem: _row(Path(p), preset_path, results) for p in plans if Path(p).exists()}
    for name, row in rows.items():
        line = f"{name:12} predicted {row['predicted step s']:.4f} s {row['predicted tensor bytes'] / GIB:7.2f} GiB"
        if "measured step s" in row:
            line += f" | measured {row['measured step s']:.4f} s (x{row['step time ratio']:.3f})"
        if "tensor memory ratio" in row:
            line += f" tensors x{row['tensor memory ratio']:.3f}"
        if row.get("dry run bytes"):
            line += f" | dry run {row['dry run bytes'] / GIB:.2f} GiB"
        print(line)
    save("compare", rows)
    _plot(rows, out_dir() / "compare.png")


def _plot(rows: dict[str, dict[str, Any]], path: Path) -> None:
    """Step time and memory, predicted beside measured, one group of bars a plan."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    fig, (time_axis, memory_axis) = plt.subplots(1, 2, figsize=(10, 4))
    series = {
        time_axis: [("predicted step s", "predicted"), ("preset step s", "on preset"), ("measured step s", "measured")],
        memory_axis: [
            ("predicted tensor bytes", "predicted tensors"),
            ("dry run bytes", "dry run"),
            ("measured peak_bytes", "measured tensors"),
            ("measured reserved_bytes", "allocator reserved"),
            ("measured driver_used_bytes", "driver used"),
        ],
    }
    for axis, keys in series.items():
        present = [(key, label) for key, label in keys if any(rows[n].get(key) for n in names)]
        width = 0.8 / max(len(present), 1)
        for i, (key, label) in enumerate(present):
            scale = 1 / GIB if key.endswith("bytes") else 1.0
            values = [(rows[n].get(key) or 0) * scale for n in names]
            axis.bar([j + i * width for j in range(len(names))], values, width, label=label)
        axis.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names)
        axis.legend(fontsize=7)
    time_axis.set_ylabel("seconds a step")
    memory_axis.set_ylabel("GiB (2^30 bytes)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steps = parser.add_subparsers(dest="step", required=True)
    steps.add_parser("env")
    steps.add_parser("preset").add_argument("out")
    versus = steps.add_parser("versus-preset")
    versus.add_argument("profile")
    versus.add_argument("preset")
    fix = steps.add_parser("fixture")
    fix.add_argument("profile")
    fix.add_argument("out")
    steps.add_parser("dry").add_argument("plan")
    comparing = steps.add_parser("compare")
    comparing.add_argument("plans", nargs="+")
    comparing.add_argument("--preset")
    args = parser.parse_args()
    out_dir().mkdir(parents=True, exist_ok=True)
    run = {
        "env": env,
        "preset": lambda: preset(args.out),
        "versus-preset": lambda: versus_preset(args.profile, args.preset),
        "fixture": lambda: fixture(args.profile, args.out),
        "dry": lambda: dry(args.plan),
        "compare": lambda: compare(args.plans, args.preset),
    }
    run[args.step]()


if __name__ == "__main__":
    main()
