"""The `prime-node` command: one typer sub-app per command group, registered here.

Only typer and the command modules load at start-up; each command imports what it needs after its
arguments are parsed, so `prime-node --help` stays instant.
"""

from __future__ import annotations

from ledger.cli.common import command_app
from node.cli.doctor import doctor_app
from node.cli.generate import generate_app
from node.cli.keys import keys_app
from node.cli.relay import relay_app
from node.cli.start import start_app
from node.cli.worker import worker_app

app = command_app(
    "prime-node",
    "Run a prime-node: keys, stake and node registration, pool membership, rewards, rollouts, checkpoints.",
)


# Command groups. The worker's chain commands (register, join, leave, unstake, withdraw, claim, status)
# sit at the top level: a typer added without a name merges its commands into this one.
app.add_typer(keys_app, name="keys")
app.add_typer(worker_app)
app.add_typer(generate_app)
app.add_typer(relay_app)
app.add_typer(start_app)
app.add_typer(doctor_app)


if __name__ == "__main__":
    app()
