"""`planner cluster ...`: work on a cluster profile file without measuring again."""

from pathlib import Path
from typing import Annotated

import typer

from planner import api
from planner.cli.checks import check_output

cluster_app = typer.Typer(
    help="Work on a cluster profile: cut it to the ranks that are left.\n\n"
    "Example: planner cluster cut cluster.json --ranks 8 --output survivors.json",
    no_args_is_help=True,
)


@cluster_app.command("cut")
def cut(
    cluster: Annotated[str, typer.Argument(help="A profile JSON (from `planner profile`) or a preset NAME:NODES.")],
    ranks: Annotated[
        int, typer.Option(min=1, help="Ranks to keep: the first N (whole nodes, or one node's first devices).")
    ],
    output: Annotated[Path, typer.Option(help="Write the cut profile here.")],
) -> None:
    """Cut a cluster profile to its first N ranks, as an elastic restart does: whole nodes of a
    multi-node cluster, or a single node's first devices; the kept part's measured links, node
    overrides and collective curves stay, curves of larger groups go, and CPU ranks that shared
    cores get the share the fewer ranks have. Plan on it with replan --cluster or search --cluster.

    Example: planner cluster cut cluster.json --ranks 8 --output survivors.json
    """
    check_output("--output", output, "survivors.json")
    cut_profile = api.survivors(api.load_cluster(cluster), ranks)
    api.save_cluster(cut_profile, output)
    typer.echo(f"wrote {output}: {cut_profile.name}, {cut_profile.num_nodes} x {cut_profile.devices_per_node} ranks")
