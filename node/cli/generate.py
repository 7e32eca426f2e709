"""`prime-node generate`: write one rollout file offline, with proofs, from a model directory and a task."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from ledger.cli.common import JsonOption, parse_address, print_json, stdout_console
from node.cli.errors import node_cli_errors

generate_app = typer.Typer()


@generate_app.command()
def generate(
    model: Annotated[Path, typer.Option("--model", metavar="DIR", help="Model directory (Hugging Face layout).")],
    task: Annotated[Path, typer.Option("--task", metavar="SPEC", help="Task spec (TOML).")],
    node: Annotated[str, typer.Option("--node", metavar="ADDR", help="Address of the node the file is for.")],
    out: Annotated[Path, typer.Option("--out", metavar="FILE", help="Rollout file to write (Parquet).")],
    step: Annotated[int, typer.Option("--step", min=0, metavar="S", help="Policy step of the weights.")] = 0,
    prompts: Annotated[int, typer.Option("--prompts", min=1, metavar="N", help="Assigned prompts.")] = 4,
    group: Annotated[int, typer.Option("--group", min=1, metavar="G", help="Completions per prompt.")] = 4,
    pool: Annotated[int, typer.Option("--pool", min=0, metavar="ID", help="Pool the work is for.")] = 0,
    counter: Annotated[int, typer.Option("--counter", min=0, help="Assignment counter (a fresh one per file).")] = 0,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Sequences decoded together.")] = 16,
    json_output: JsonOption = False,
) -> None:
    """Generate G completions for each of N assigned prompts, score them, prove them, write FILE."""
    with node_cli_errors():
        address = parse_address(node, what="--node")
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from node.generation.generate import generate_file
        from node.generation.plan import Job
        from node.inference.torch_backend import TorchBackend
        from node.model.loading import load_model
        from node.tasks.sources import open_source
        from node.tasks.spec import load_task_spec

        spec = load_task_spec(task)
        source = open_source(spec)
        loaded = load_model(model)
        backend = TorchBackend.from_loaded(loaded, max_batch_size=batch_size)
        job = Job(pool_id=pool, node=address, step=step, counter=counter, prompts=prompts, group_size=group)
        started = time.perf_counter()
        columns = (TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, transient=True, disable=json_output) as bar:
            progress_task = bar.add_task("generate", total=prompts * group)
            written = generate_file(
                out, job, spec, source, loaded, backend, progress=lambda n: bar.advance(progress_task, n)
            )
        seconds = time.perf_counter() - started
        summary = {
            "path": str(written.path),
            "work_key": "0x" + written.work_key.hex(),
            "units": written.units,
            "bytes": written.size,
            "rows": prompts * group,
            "seconds": round(seconds, 2),
        }
        if json_output:
            print_json(summary)
            return
        stdout_console().print(
            f"wrote {written.path}: {prompts * group} completions, {written.units} output tokens, "
            f"{written.size:,} bytes in {seconds:.1f} s\nwork key 0x{written.work_key.hex()}"
        )
