"""`python -m kvcanary_cli` runs the command-line interface."""

from kvcanary_cli.cli import console

console()
