"""`prime-validate`: verify rollout files offline and print the verdict as JSON.

Thin: parse flags, load the task and the checkpoint, call `validator.verify.verify_file`, print. Exit codes:
0 accepted, 1 rejected, 2 bad input (a missing file or directory, a bad task spec, an unloadable
checkpoint, a malformed flag) with one line on stderr. torch and the node package's heavy modules load
after the arguments are parsed, so `prime-validate --help` stays instant.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from ledger.cli.common import (
    KNOWN_ERRORS,
    configure_logging,
    debug_enabled,
    one_line,
    parse_address,
    parse_bytes32,
    stderr_console,
)
from node.errors import NodeError

EXIT_ACCEPTED, EXIT_REJECTED, EXIT_BAD_INPUT = 0, 1, 2
# What a person fixes by changing the input: missing files, bad flags, a bad spec or checkpoint.
BAD_INPUT_ERRORS: tuple[type[Exception], ...] = (*KNOWN_ERRORS, NodeError)

app = typer.Typer(
    name="prime-validate",
    no_args_is_help=True,
    help="Verify rollout files: format, assignment, step, sampling, rewards and TOPLOC proofs (DESIGN section 7).",
)


class ThresholdPreset(StrEnum):
    CPU_FP32 = "cpu-fp32"
    GPU_BF16 = "gpu-bf16"


@app.callback()
def main() -> None:
    """Verify rollout files: format, assignment, step, sampling, rewards and TOPLOC proofs (DESIGN section 7)."""
    configure_logging()


@contextmanager
def bad_input_errors() -> Iterator[None]:
    """Like `node.cli.errors.node_cli_errors`, but exit 2: here exit 1 means "the file was rejected"."""
    try:
        yield
    except BAD_INPUT_ERRORS as exc:
        console = stderr_console()
        if debug_enabled():
            console.print_exception()
        console.print(Text(f"error: {one_line(exc)}", style="bold red"))
        raise typer.Exit(EXIT_BAD_INPUT) from None


@app.command("file")
def file_command(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="Rollout file (Parquet).", show_default=False)],
    checkpoint: Annotated[
        Path,
        typer.Option(
            "--checkpoint", metavar="DIR", help="Model directory of the file's policy step.", show_default=False
        ),
    ],
    task: Annotated[Path, typer.Option("--task", metavar="SPEC", help="Task spec (TOML).", show_default=False)],
    node: Annotated[str | None, typer.Option("--node", metavar="ADDR", help="The on-chain submitter.")] = None,
    step: Annotated[int | None, typer.Option("--step", min=0, metavar="S", help="The pool's current step.")] = None,
    pool: Annotated[int | None, typer.Option("--pool", min=0, metavar="ID", help="The pool the file is for.")] = None,
    work_key: Annotated[str | None, typer.Option("--work-key", metavar="HEX", help="Submitted sha256.")] = None,
    units: Annotated[int | None, typer.Option("--units", min=0, metavar="N", help="Submitted work units.")] = None,
    async_level: Annotated[int, typer.Option("--async-level", min=0, metavar="K", help="Steps a file may lag.")] = 2,
    thresholds: Annotated[
        ThresholdPreset, typer.Option("--thresholds", help="TOPLOC limits for the device class.")
    ] = ThresholdPreset.CPU_FP32,
    max_exp_mismatches: Annotated[
        int | None, typer.Option("--max-exp-mismatches", min=0, metavar="N", help="Override: of 128 per chunk.")
    ] = None,
    max_mant_mean: Annotated[
        float | None, typer.Option("--max-mant-mean", min=0.0, metavar="X", help="Override: mantissa error mean.")
    ] = None,
    max_mant_median: Annotated[
        float | None, typer.Option("--max-mant-median", min=0.0, metavar="Y", help="Override: mantissa error median.")
    ] = None,
) -> None:
    """Verify FILE against the checkpoint and the task; print the verdict as JSON (exit 0 accept, 1 reject)."""
    with bad_input_errors():
        submitter = parse_address(node, what="--node") if node is not None else None
        key = parse_bytes32(work_key, what="--work-key") if work_key is not None else None
        import torch

        from node.model.loading import load_model
        from node.proofs import ProofThresholds
        from node.tasks.sources import open_source
        from node.tasks.spec import load_task_spec
        from validator.config import ValidatorConfig
        from validator.verify import Expected, verify_file

        preset = ProofThresholds.cpu_fp32() if thresholds is ThresholdPreset.CPU_FP32 else ProofThresholds.gpu_bf16()
        limits = ProofThresholds(
            max_exp_mismatches=preset.max_exp_mismatches if max_exp_mismatches is None else max_exp_mismatches,
            max_mant_err_mean=preset.max_mant_err_mean if max_mant_mean is None else max_mant_mean,
            max_mant_err_median=preset.max_mant_err_median if max_mant_median is None else max_mant_median,
        )
        config = ValidatorConfig(async_level=async_level, thresholds=limits)
        expected = Expected(work_key=key, node=submitter, pool_id=pool, units=units, current_step=step)
        data = _read_bounded(file, config.max_file_bytes)
        spec = load_task_spec(task)
        source = open_source(spec)
        loaded = load_model(checkpoint, dtype=torch.float32)
        # a bad file gives a verdict; what raises here is the validator's side (a task scorer that cannot run)
        verdict = verify_file(data, spec=spec, checkpoint=loaded, config=config, expected=expected, source=source)
    typer.echo(verdict.to_json())
    raise typer.Exit(EXIT_ACCEPTED if verdict.accepted else EXIT_REJECTED)


def _read_bounded(path: Path, max_bytes: int) -> bytes:
    """At most max_bytes + 1 bytes: enough for the size check to refuse a larger file without reading it all."""
    with path.open("rb") as handle:
        return handle.read(max_bytes + 1)


if __name__ == "__main__":
    app()
