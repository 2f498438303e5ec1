"""torchrun command lines that run a plan: one per node of the plan's cluster.

One node uses torchrun's standalone rendezvous; several use the c10d rendezvous at the first
node's address, with the plan's hash as the rendezvous id so that two jobs never join each other.
CPU clusters get OMP_NUM_THREADS=1 at launch (torchrun's own default, set so that it says nothing);
each rank then computes with the threads its profile was measured with (runtime.threads: the
node's cores split over its ranks). torchrun numbers its processes by device; the plan's
``DeviceMap`` says which of the plan's ranks each node's devices run, and the runtime builds its
mesh from the same map.
"""

import shlex
from dataclasses import dataclass

from planner.schemas import DeviceKind, Plan

DEFAULT_PORT = 29500


@dataclass(frozen=True, slots=True)
class NodeCommand:
    """What to run on one node: environment and argv."""

    node_rank: int
    env: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]
    plan_ranks: tuple[int, ...]
    """The plan's ranks this node's devices run, in local-device order."""

    def comment(self) -> str:
        """A shell comment naming the node and the plan ranks it runs, e.g. ``# node 1: ranks 8-15``."""
        return f"# node {self.node_rank}: ranks {_ranges(self.plan_ranks)}"

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
    ranks = node_ranks(plan)
    run = ("-m", "planner", "run", plan_path, "--steps", str(steps), "--report", report_path)
    env = (("OMP_NUM_THREADS", "1"),) if plan.cluster.device_kind is DeviceKind.CPU else ()
    if ref.num_nodes == 1:
        argv = ("torchrun", "--standalone", "--nproc-per-node", str(ref.devices_per_node), *run)
        return (NodeCommand(0, env, argv, ranks[0]),)
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
            ranks[node],
        )
        for node in range(ref.num_nodes)
    )


def node_ranks(plan: Plan) -> tuple[tuple[int, ...], ...]:
    """For each node, the plan's ranks its devices run, in local-device order."""
    per_node, device_map = plan.cluster.devices_per_node, plan.layout.device_map
    by_device = [0] * plan.cluster.world_size
    for rank in range(plan.cluster.world_size):
        by_device[device_map.device_of(rank)] = rank
    return tuple(tuple(by_device[n * per_node : (n + 1) * per_node]) for n in range(plan.cluster.num_nodes))


def _ranges(ranks: tuple[int, ...]) -> str:
    """1,2,3,7 as "1-3,7"."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def launch_script(commands: tuple[NodeCommand, ...]) -> str:
    """A bash script that runs the command of the node given as its first argument (default 0)."""
    lines = [
        "#!/usr/bin/env bash",
        "# Run on every node: bash launch.sh NODE_RANK",
        "set -euo pipefail",
        'case "${1:-0}" in',
    ]
    for cmd in commands:
        lines += [f"  {cmd.node_rank})", f"    {cmd.comment()}", f"    {cmd.shell()}", "    ;;"]
    lines += ['  *) echo "node rank must be 0..' + str(len(commands) - 1) + '" >&2; exit 2 ;;', "esac", ""]
    return "\n".join(lines)
