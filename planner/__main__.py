"""``python -m planner`` (and ``torchrun -m planner``) runs the CLI."""

from planner.cli import main

main()
