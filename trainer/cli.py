"""`prime-train`: the trainer's commands. Thin: validate flags, call a library function, print.

torch and transformers load inside each command body, after the arguments are parsed, so `prime-train --help`
stays instant.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from ledger.cli.common import JsonOption, configure_logging, print_json, stdout_console
from node.cli.errors import node_cli_errors

app = typer.Typer(
    name="prime-train",
    no_args_is_help=True,
    help="Train a pool's policy with GRPO on verified rollouts, and make the embedded default model.",
)


@app.callback()
def main() -> None:
    """Train a pool's policy with GRPO on verified rollouts, and make the embedded default model."""


@app.command("init-model")
def init_model_command(
    out: Annotated[
        Path,
        typer.Option("--out", metavar="DIR", help="Directory to create (Hugging Face layout).", show_default=False),
    ],
    seed: Annotated[int, typer.Option("--seed", min=0, metavar="N", help="Seed of the random initialisation.")] = 0,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace DIR if it holds something.")] = False,
    json_output: JsonOption = False,
) -> None:
    """Create the embedded default model: a tiny Qwen2 with a character-level tokenizer, random from the seed."""
    configure_logging()
    with node_cli_errors():
        from node.model.loading import model_hash_of, parameter_count
        from node.model.tiny import init_model

        started = time.perf_counter()
        path = init_model(out, seed=seed, overwrite=overwrite).resolve()
        seconds = time.perf_counter() - started
        parameters = parameter_count(path)
        model_hash = "0x" + model_hash_of(path).hex()
        if json_output:
            print_json({"path": str(path), "parameters": parameters, "model_hash": model_hash, "seed": seed})
            return
        console = stdout_console()
        console.print(f"created the tiny model (seed {seed}) in {seconds:.1f} s")
        console.print(f"parameters: {parameters:,}")
        console.print(f"model hash: {model_hash}")
        console.print(f"path:       {path}")
