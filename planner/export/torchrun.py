"""torchrun command lines that run a plan: one per node of the plan's cluster.

One node uses torchrun's standalone rendezvous; several use the c10d rendezvous at the first
node's address, with the plan's hash as the rendezvous id so that two jobs never join each other.
CPU clusters get OMP_NUM_THREADS=1 at launch (torchrun's own default, set so that it says nothing);
each rank then computes with the threads its profile was measured with (runtime.threads: the
node's cores split over its ranks).
"""

import shlex
from dataclasses import dataclass

from planner.schemas import Plan, is_cpu_device

DEFAULT_PORT = 29500


@dataclass(frozen=True, slots=True)
class NodeCommand:
    """What to run on one node: environment and argv."""

    node_rank: int
    env: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]

    def shell(self) -> str:
        """One shell line: environment assignments, then the quoted command."""
        assignments = [f"{k}={shlex.quote(v)}" for k, v in self.env]
        return " ".join([*assignments, *(shlex.quote(a) for a in self.argv)])


def torchrun_commands(
    plan: Plan,
    plan_path: str,
    *,
    master_addr: str = "MASTER_ADDR",
    master_port: int = DEFAULT_PORT,
    steps: int = 10,
    report_path: str = "report.json",
) -> tuple[NodeCommand, ...]:
    """The command for every node of the plan's cluster, node 0 first."""
    ref = plan.cluster
    run = ("-m", "planner", "run", plan_path, "--steps", str(steps), "--report", report_path)
    env = (("OMP_NUM_THREADS", "1"),) if is_cpu_device(plan.cluster.device_name) else ()
    if ref.num_nodes == 1:
        argv = ("torchrun", "--standalone", "--nproc-per-node", str(ref.devices_per_node), *run)
        return (NodeCommand(0, env, argv),)
    return tuple(
        NodeCommand(
            node,
            env,
            (
                "torchrun",
                "--nnodes",
                str(ref.num_nodes),
                "--nproc-per-node",
                str(ref.devices_per_node),
                "--node-rank",
                str(node),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"{master_addr}:{master_port}",
                "--rdzv-id",
                ref.sha256[:12],
                *run,
            ),
        )
        for node in range(ref.num_nodes)
    )


def launch_script(commands: tuple[NodeCommand, ...]) -> str:
    """A bash script that runs the command of the node given as its first argument (default 0)."""
    lines = [
        "#!/usr/bin/env bash",
        "# Run on every node: bash launch.sh NODE_RANK",
        "set -euo pipefail",
        'case "${1:-0}" in',
    ]
    for cmd in commands:
        lines += [f"  {cmd.node_rank})", f"    {cmd.shell()}", "    ;;"]
    lines += ['  *) echo "node rank must be 0..' + str(len(commands) - 1) + '" >&2; exit 2 ;;', "esac", ""]
    return "\n".join(lines)
