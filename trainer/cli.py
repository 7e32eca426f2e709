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


@app.command("sft")
def sft_command(
    model: Annotated[Path, typer.Option("--model", metavar="DIR", help="Model to start from (Hugging Face layout).")],
    task: Annotated[Path, typer.Option("--task", metavar="SPEC", help="Task spec (TOML) with worked answers.")],
    out: Annotated[Path, typer.Option("--out", metavar="DIR", help="Directory for the trained model.")],
    steps: Annotated[int, typer.Option("--steps", min=1, metavar="N", help="Optimizer steps.")] = 600,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Examples per step.")] = 64,
    lr: Annotated[float, typer.Option("--lr", min=1e-7, max=1.0, help="Peak learning rate.")] = 1.5e-3,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the example order.")] = 0,
    eval_problems: Annotated[int, typer.Option("--eval", min=0, help="Held-out problems to measure.")] = 256,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace DIR if it holds something.")] = False,
    json_output: JsonOption = False,
) -> None:
    """Warm-start MODEL on the task's worked answers, then report the pass rate before and after."""
    configure_logging()
    with node_cli_errors():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from node.model.loading import load_model
        from node.model.tiny import save_model_dir
        from node.tasks.sources import open_source
        from node.tasks.spec import load_task_spec
        from trainer.evaluate import pass_rate
        from trainer.sft import SFTConfig, SFTStep, held_out_ids, run_sft

        config = SFTConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed, holdout=max(eval_problems, 1))
        spec = load_task_spec(task)
        source = open_source(spec)
        loaded = load_model(model)
        held_out = held_out_ids(source, config)[:eval_problems]
        before = pass_rate(loaded, spec, source, held_out) if eval_problems else None
        last_loss = float("nan")
        columns = (
            TextColumn("sft"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[loss]}"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, transient=True, disable=json_output) as bar:
            progress = bar.add_task("sft", total=steps, loss="")

            def on_step(step: SFTStep) -> None:
                nonlocal last_loss
                last_loss = step.loss
                bar.update(progress, advance=1, loss=f"loss {last_loss:.3f}")

            started = time.perf_counter()
            run_sft(loaded, spec, source, config, on_step=on_step)
            seconds = time.perf_counter() - started
        after = pass_rate(loaded, spec, source, held_out) if eval_problems else None
        save_model_dir(loaded.model, loaded.tokenizer, out, overwrite=overwrite)
        summary = {
            "path": str(out.resolve()),
            "steps": steps,
            "final_loss": round(last_loss, 4),
            "seconds": round(seconds, 1),
            "pass_rate_before": before.rate if before else None,
            "pass_rate_after": after.rate if after else None,
            "eval_problems": len(held_out),
        }
        if json_output:
            print_json(summary)
            return
        console = stdout_console()
        console.print(f"trained {steps} steps in {seconds:.0f} s, final loss {last_loss:.3f}; wrote {out}")
        if before and after:
            console.print(
                f"pass rate on {len(held_out)} held-out problems: {before.rate:.1%} before, {after.rate:.1%} after"
            )
