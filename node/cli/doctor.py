"""`prime-node doctor`: check this machine, the chain and the relays, then a self-test rollout, before staking.

Thin: parse flags, call `node.doctor.runner.run_checks`, print one line per check as it finishes (with the fix under
every warning and failure), or JSON. Exit 0 when no check failed, 1 otherwise; warnings do not fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from ledger.cli.common import (
    DEPLOYMENT_ENV_VAR,
    JsonOption,
    MemoryBudgetOption,
    RpcUrlOption,
    cli_errors,
    print_json,
    stdout_console,
)
from node.cli.inference import BackendOption, DeviceOption

if TYPE_CHECKING:
    from rich.console import Console

    from node.doctor.checks import CheckResult

doctor_app = typer.Typer()

# marker, style; "FAIL" in capitals so that a failure stands out in a terminal without colour
MARKERS = {"ok": ("ok", "green"), "warn": ("warn", "yellow"), "fail": ("FAIL", "bold red"), "skip": ("skip", "dim")}


@doctor_app.command()
def doctor(
    deployment: Annotated[
        Path | None,
        typer.Option(
            "--deployment", envvar=DEPLOYMENT_ENV_VAR, metavar="FILE", help="Check the chain and contracts it names."
        ),
    ] = None,
    rpc_url: RpcUrlOption = None,
    source: Annotated[
        list[str] | None, typer.Option("--source", metavar="URL", help="Relay or checkpoint origin (repeat).")
    ] = None,
    port: Annotated[
        list[int] | None,
        typer.Option("--port", min=1, max=65535, metavar="P", help="A port the node will listen on (repeat)."),
    ] = None,
    state: Annotated[
        Path | None, typer.Option("--state", metavar="DIR", help="The worker's state folder (disk space).")
    ] = None,
    skip_self_test: Annotated[
        bool, typer.Option("--skip-self-test", help="Skip generating and verifying a tiny rollout file.")
    ] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, metavar="SECONDS", help="Per network probe.")] = 5.0,
    model: Annotated[
        Path | None,
        typer.Option("--model", metavar="DIR", help="The pool's model: does it fit here? (with --task)"),
    ] = None,
    task: Annotated[
        Path | None, typer.Option("--task", metavar="SPEC", help="The pool's task spec (with --model).")
    ] = None,
    backend: Annotated[str, BackendOption] = "auto",
    device: Annotated[str, DeviceOption] = "auto",
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", min=1, metavar="N", help="The worker's batch_size [its default].")
    ] = None,
    memory_budget: MemoryBudgetOption = None,
    json_output: JsonOption = False,
) -> None:
    """Check Python, torch, GPU, memory, the pool's model, disk, Docker, ports, chain and relays, then self-test a
    rollout file."""
    with cli_errors(ValueError):
        from core.hostmemory import parse_size
        from node.doctor.checks import DEFAULT_STATE_DIR, DoctorConfig
        from node.doctor.runner import run_checks

        config = DoctorConfig(
            state_dir=state or DEFAULT_STATE_DIR,
            deployment=deployment,
            rpc_url=rpc_url,
            sources=tuple(source or ()),
            ports=tuple(port or ()),
            self_test=not skip_self_test,
            timeout=timeout,
            model=model,
            task=task,
            backend=backend,
            device=device,
            batch_size=batch_size,
            memory_budget=parse_size(memory_budget) if memory_budget is not None else None,
        )
    if json_output:
        results = run_checks(config)
        print_json({"ok": _passed(results), "checks": [result.to_dict() for result in results]})
    else:
        console = stdout_console()
        with console.status("checking (the self-test takes a few seconds)"):
            results = run_checks(config, on_result=lambda result: _print_result(console, result))
        _print_summary(console, results)
    raise typer.Exit(0 if _passed(results) else 1)


def _passed(results: list[CheckResult]) -> bool:
    return all(result.status != "fail" for result in results)


def _print_result(console: Console, result: CheckResult) -> None:
    marker, style = MARKERS[result.status]
    line = Text(f"{marker:>4}  ", style=style)
    line.append(f"{result.name:<10} ", style="bold")
    line.append(result.detail)
    console.print(line)
    if result.fix is not None:
        console.print(Text(f"{'':>4}  {'':<10} fix: {result.fix}", style=style))


def _print_summary(console: Console, results: list[CheckResult]) -> None:
    counts = {status: sum(r.status == status for r in results) for status in ("ok", "warn", "fail", "skip")}
    warnings = "1 warning" if counts["warn"] == 1 else f"{counts['warn']} warnings"
    summary = f"{counts['ok']} ok, {warnings}, {counts['fail']} failed, {counts['skip']} skipped"
    if counts["fail"]:
        console.print(Text(f"\n{summary}: fix the failures above before staking", style="bold red"))
    else:
        console.print(Text(f"\n{summary}: ready to work", style="bold green"))
