"""`prime-node generate`: write one rollout file offline, with proofs, from a model directory and a task."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from ledger.cli.common import JsonOption, cli_errors, parse_address, print_json, stdout_console
from node.cli.inference import BackendOption, DeviceOption

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
    backend: Annotated[str, BackendOption] = "auto",
    device: Annotated[str, DeviceOption] = "auto",
    simulate_fault: Annotated[
        str | None,
        typer.Option(
            "--simulate-fault",
            metavar="FAULT",
            help="Write the file a cheater would (wrong-model, tamper-tokens, fake-reward, stale-step), to test "
            "validators.",
        ),
    ] = None,
    async_level: Annotated[
        int, typer.Option("--async-level", min=0, metavar="K", help="The pool's; stale-step goes K + 1 back.")
    ] = 2,
    json_output: JsonOption = False,
) -> None:
    """Generate G completions for each of N assigned prompts, score them, prove them, write FILE."""
    with cli_errors():
        address = parse_address(node, what="--node")
        import torch
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from engine.generate import generate_rollouts
        from engine.inference.select import choose, open_backend
        from engine.memory import longest_sequence
        from engine.model.loading import load_model
        from node.daemon.faults import falsify, on_load_for, parse_fault
        from protocol.plan import Job
        from protocol.rollouts import write_rollouts
        from protocol.tasks.sources import open_source
        from protocol.tasks.spec import load_task_spec

        fault = parse_fault(simulate_fault)
        spec = load_task_spec(task)
        source = open_source(spec)
        choice = choose(backend, device, dtype=spec.sampling.dtype)  # the task's precision, on any device
        placement, dtype = choice.torch_placement
        loaded = load_model(model, device=placement, dtype=getattr(torch, dtype))
        perturbed = tempfile.TemporaryDirectory(prefix="prime-node-wrong-model-")
        on_load = on_load_for(fault, backend=choice.backend, root=Path(perturbed.name)) if fault is not None else None
        if on_load is not None:  # wrong-model; vLLM reads weights from disk: it gets the perturbed copy written there
            on_load(loaded)
        longest = longest_sequence(spec, source, loaded.tokenizer)  # vLLM's max_model_len: the task's, not 32k
        engine = open_backend(choice, loaded, batch_size=batch_size, max_model_len=longest)
        job = Job(pool_id=pool, node=address, step=step, counter=counter, prompts=prompts, group_size=group)
        started = time.perf_counter()
        columns = (TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, transient=True, disable=json_output) as bar:
            progress_task = bar.add_task("generate", total=prompts * group)
            generated = generate_rollouts(
                job, spec, source, loaded, engine, progress=lambda n: bar.advance(progress_task, n)
            )
        perturbed.cleanup()
        rows = generated.rows
        if fault is not None:
            rows = falsify(fault, rows, vocab_size=engine.vocab_size, async_level=async_level)
        written = write_rollouts(out, generated.meta, rows)
        seconds = time.perf_counter() - started
        summary = {
            "path": str(written.path),
            "work_key": "0x" + written.work_key.hex(),
            "units": written.units,
            "bytes": written.size,
            "rows": prompts * group,
            "seconds": round(seconds, 2),
            "backend": choice.backend,
            "device": choice.device,
            "dtype": choice.dtype,
            "fault": simulate_fault,
            # vLLM plans its cache for this many positions: the task's longest sequence, capped by the model's
            "max_model_len": getattr(engine, "max_model_len", None),
        }
        if json_output:
            print_json(summary)
            return
        stdout_console().print(
            f"wrote {written.path}: {prompts * group} completions, {written.units} output tokens, "
            f"{written.size:,} bytes in {seconds:.1f} s with {choice.describe()}\nwork key 0x{written.work_key.hex()}"
        )
