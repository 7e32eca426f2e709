"""The `prime-node` command: one typer sub-app per command group, registered here.

Only typer and the command modules load at start-up; each command imports what it needs after its
arguments are parsed, so `prime-node --help` stays instant.
"""

from __future__ import annotations

import typer

from node.cli.keys import keys_app

app = typer.Typer(
    name="prime-node",
    no_args_is_help=True,
    help="Run a prime-node: contribute compute to permissionless RL training, relay checkpoints, hold keys.",
)

# Command groups. Worker commands (`start`, `relay`, ...) live in node/cli/worker.py and are added
# next to these: `from node.cli.worker import ...` then `app.command()(...)` or `app.add_typer(...)`.
app.add_typer(keys_app, name="keys")


if __name__ == "__main__":
    app()
