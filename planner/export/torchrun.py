"""torchrun command lines that run a plan: one per node of the plan's cluster.

One node uses torchrun's standalone rendezvous; several use the c10d rendezvous at the first
node's address, with the plan's hash as the rendezvous id so that two jobs never join each other.
CPU clusters get OMP_NUM_THREADS=1 at launch (torchrun's own default, set so that it says nothing);
each rank then computes with the threads its profile was measured with (runtime.threads: the
node's cores split over its ranks). torchrun numbers its processes by device; the plan's
``DeviceMap`` says which of the plan's ranks each node's devices run, and the runtime builds its
mesh from the same map.

With ``Elastic`` the lines are torchrun's elastic form: ``--nnodes MIN:MAX --max-restarts N`` on
the c10d rendezvous (one node too, at localhost unless a master address is given), no
``--node-rank`` (the rendezvous numbers the nodes as they join), and ``planner run --elastic
--checkpoint-dir D``, which re-plans for the nodes a restart has and resumes the newest
checkpoint (``planner.flows.replan``). Every node then runs the same line, with
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: otherwise the workers of every restart share the agents'
rendezvous store with those of the round before, whose keys (each process group's addresses) are
still there, and a restarted worker can read a dead peer's address and fail to connect (seen with
torch 2.13 on gloo); with it, each round's rank 0 hosts a fresh store.

Without a master address the lines read it from each node's shell, as
``"${MASTER_ADDR:?set it to the address of node 0}:PORT"``, so that the shell stops with that one
line when it is unset (a bare placeholder would look like a host name to torchrun). The launch
script runs the node given as its argument or in NODE_RANK, and refuses in one line (exit 2)
without one.
"""

import shlex
from dataclasses import dataclass

from planner.schemas import DeviceKind, Plan
from planner.schemas.errors import SchemaError
from planner.schemas.settings import RunSettings

DEFAULT_PORT = 29500
MASTER_ADDR_HINT = (
    "set MASTER_ADDR to the address of node 0, reachable from every node, or pass --master-addr HOST to planner launch"
)
"""What to do when a multi-node launch has no master address."""
_MASTER_ADDR_FROM_SHELL = "${MASTER_ADDR:?set it to the address of node 0}"
"""The shell's MASTER_ADDR, or a one-line error saying to set it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Elastic:
    """torchrun's elastic launch of a plan: how many nodes may run it, how often torchrun restarts
    the workers, and the checkpoints each restart resumes from."""

    min_nodes: int
    max_nodes: int
    max_restarts: int = 3
    checkpoint_dir: str
    checkpoint_every: int = 1
    """Steps between checkpoints: the steps a failure may cost."""
    last_call_s: int | None = None
    """Seconds a rendezvous that has its minimum of nodes waits for more before it starts (torchrun's
    ``last_call_timeout``, 30 by default): a restart after a node died waits this long for it."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_nodes <= self.max_nodes:
            raise SchemaError(
                f"--elastic {self.min_nodes}:{self.max_nodes} must be MIN:MAX nodes with 1 <= MIN <= MAX, e.g. 2:4"
            )
        if self.max_restarts < 0 or self.checkpoint_every < 1:
            raise SchemaError(
                f"--max-restarts {self.max_restarts} must be 0 or more and --checkpoint-every "
                f"{self.checkpoint_every} 1 or more under --elastic"
            )


def elastic_options(
    nodes: str | None,
    max_restarts: int,
    checkpoint_dir: str | None,
    checkpoint_every: int,
    last_call_s: int | None = None,
) -> Elastic | None:
    """``planner launch``'s elastic options as an ``Elastic`` (None without ``--elastic``):
    ``nodes`` is ``MIN:MAX`` or one number N (N:N).

    Raises:
        SchemaError: ``nodes`` is not of that form, or no checkpoint folder is given.
    """
    if nodes is None:
        return None
    if checkpoint_dir is None:
        raise SchemaError("--elastic resumes each restart from a checkpoint: give their folder with --checkpoint-dir")
    low, colon, high = nodes.partition(":")
    high = high if colon else low
    if not (low.isdigit() and high.isdigit()):
        raise SchemaError(f"--elastic {nodes!r} must be MIN:MAX nodes, e.g. 2:4 (or one number, e.g. 4)")
    return Elastic(
        min_nodes=int(low),
        max_nodes=int(high),
        max_restarts=max_restarts,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        last_call_s=last_call_s,
    )


@dataclass(frozen=True, slots=True)
class NodeCommand:
    """What to run on one node: environment and argv."""

    node_rank: int
    env: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]
    plan_ranks: tuple[int, ...]
    """The plan's ranks this node's devices run, in local-device order (elastic: none fixed)."""

    def comment(self) -> str:
        """A shell comment naming the node and the plan ranks it runs, e.g. ``# node 1: ranks 8-15``
        (elastic: no ranks, the rendezvous numbers the nodes as they join)."""
        if not self.plan_ranks:
            return f"# node {self.node_rank} (elastic: the rendezvous numbers the nodes as they join)"
        return f"# node {self.node_rank}: ranks {_ranges(self.plan_ranks)}"

    def shell(self) -> str:
        """One shell line: environment assignments, then the quoted command (the shell's
        MASTER_ADDR, where the command reads it, in double quotes so that it expands)."""
        assignments = [f"{k}={shlex.quote(v)}" for k, v in self.env]
        return " ".join([*assignments, *(_quote(a) for a in self.argv)])

    @property
    def reads_master_addr(self) -> bool:
        """Whether the command takes node 0's address from the shell's MASTER_ADDR."""
        return any(_MASTER_ADDR_FROM_SHELL in a for a in self.argv)


def _quote(arg: str) -> str:
    if arg.startswith(_MASTER_ADDR_FROM_SHELL):  # then ":PORT", digits only
        return f'"{arg}"'
    return shlex.quote(arg)


def run_options(settings: RunSettings) -> tuple[str, ...]:
    """`planner run`'s options for ``settings``' token file and (unless elastic: ``Elastic``
    gives those) checkpoints, as each rank's line passes them; their defaults are left out."""
    options: list[str] = []
    if settings.data is not None:
        options += ["--data", str(settings.data)]
    if settings.checkpoint_dir is not None and not settings.elastic:
        options += ["--checkpoint-dir", str(settings.checkpoint_dir)]
        if settings.checkpoint_every:
            options += ["--checkpoint-every", str(settings.checkpoint_every)]
    if settings.resume:
        options.append("--resume")
    return tuple(options)


def torchrun_commands(
    plan: Plan,
    plan_path: str,
    *,
    master_addr: str | None = None,
    master_port: int = DEFAULT_PORT,
    steps: int = 10,
    report_path: str = "report.json",
    elastic: Elastic | None = None,
    run_options: tuple[str, ...] = (),
) -> tuple[NodeCommand, ...]:
    """The command for every node of the plan's cluster, node 0 first; without ``master_addr``
    the commands read node 0's address from the shell's MASTER_ADDR (elastic on one node:
    localhost). ``run_options`` are further options of each rank's `planner run`
    (``run_options``: its data and checkpoints).

    Raises:
        SchemaError: ``elastic`` asks for more nodes than the plan's cluster has.
    """
    ref = plan.cluster
    ranks = node_ranks(plan)
    run = ("-m", "planner", "run", plan_path, "--steps", str(steps), "--report", report_path, *run_options)
    env = (("OMP_NUM_THREADS", "1"),) if plan.cluster.device_kind is DeviceKind.CPU else ()
    if elastic is not None:
        return _elastic_commands(plan, run, env, elastic, master_addr, master_port)
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
                f"{master_addr or _MASTER_ADDR_FROM_SHELL}:{master_port}",
                "--rdzv-id",
                ref.sha256[:12],
                *run,
            ),
            ranks[node],
        )
        for node in range(ref.num_nodes)
    )


def _elastic_commands(
    plan: Plan,
    run: tuple[str, ...],
    env: tuple[tuple[str, str], ...],
    elastic: Elastic,
    master_addr: str | None,
    master_port: int,
) -> tuple[NodeCommand, ...]:
    """Every node's elastic command (the same line on each: the rendezvous numbers the nodes)."""
    ref = plan.cluster
    if elastic.max_nodes > ref.num_nodes:
        raise SchemaError(
            f"--elastic {elastic.min_nodes}:{elastic.max_nodes} asks for up to {elastic.max_nodes} nodes, but the "
            f"plan is for {ref.num_nodes}; give MAX <= {ref.num_nodes}, or plan for the larger cluster"
        )
    host = master_addr or ("localhost" if ref.num_nodes == 1 else _MASTER_ADDR_FROM_SHELL)
    argv = (
        "torchrun",
        "--nnodes",
        f"{elastic.min_nodes}:{elastic.max_nodes}",
        "--nproc-per-node",
        str(ref.devices_per_node),
        "--max-restarts",
        str(elastic.max_restarts),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{host}:{master_port}",
        "--rdzv-id",
        ref.sha256[:12],
        *(("--rdzv-conf", f"last_call_timeout={elastic.last_call_s}") if elastic.last_call_s is not None else ()),
        *run,
        "--elastic",
        "--checkpoint-dir",
        elastic.checkpoint_dir,
        "--checkpoint-every",
        str(elastic.checkpoint_every),
    )
    env = (*env, ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"))
    return tuple(NodeCommand(node, env, argv, ()) for node in range(ref.num_nodes))


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
    """A bash script that runs the command of the node given as its argument or in NODE_RANK; one
    node needs neither. Without one, or a rank out of range, or (when the commands read it)
    without MASTER_ADDR, it stops with one line on stderr, exit code 2."""
    last = len(commands) - 1
    default = "0" if last == 0 else ""
    lines = [
        "#!/usr/bin/env bash",
        f"# Run on every node: bash launch.sh NODE_RANK (0..{last}), or with NODE_RANK set",
        "set -euo pipefail",
        f'node="${{1:-${{NODE_RANK:-{default}}}}}"',
        'if [ -z "$node" ]; then',
        f'  echo "give the rank of this node, 0..{last}: bash $0 NODE_RANK, or set NODE_RANK" >&2; exit 2',
        "fi",
    ]
    if any(cmd.reads_master_addr for cmd in commands):
        lines += [
            'if [ -z "${MASTER_ADDR:-}" ]; then',
            f'  echo "{MASTER_ADDR_HINT}" >&2; exit 2',
            "fi",
        ]
    lines.append('case "$node" in')
    for cmd in commands:
        lines += [f"  {cmd.node_rank})", f"    {cmd.comment()}", f"    {cmd.shell()}", "    ;;"]
    lines += [f'  *) echo "node rank $node is not one of 0..{last}" >&2; exit 2 ;;', "esac", ""]
    return "\n".join(lines)
