"""`prime-validate`: verify rollout files offline, run the validator daemon, list and explain what it rejected.

Thin: parse flags, call `validator.verify.verify_file` or `validator.daemon.ValidatorDaemon`, print.
`prime-validate file` exits 0 accepted, 1 rejected (the verdict as JSON on stdout), 2 refused usage (a missing
file or directory, a bad task spec, an unloadable checkpoint, a malformed flag), 3 could not judge (this
validator ran out of memory, disk or file descriptors, or its own code failed: nothing is said about the file),
the last two with one line on stderr and no traceback (PRIME_DEBUG=1 adds it). `run` and `rejections` exit 0,
or 1 with one line on stderr (a key, deployment, pool spec or state folder that does not fit). torch and the node
package's heavy modules load after the arguments are parsed, so `prime-validate --help` stays instant.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import click
import typer
from rich.text import Text

from core.errors import NodeError
from core.trace import configure_tracing
from ledger.cli.common import (
    DEFAULT_DEPLOYMENT,
    KNOWN_ERRORS,
    CommandError,
    DeploymentOption,
    DevKeyOption,
    JsonOption,
    KeystoreOption,
    MemoryBudgetOption,
    RpcUrlOption,
    cli_errors,
    configure_daemon_logging,
    configure_logging,
    debug_enabled,
    one_line,
    parse_address,
    parse_bytes32,
    print_json,
    stderr_console,
    stdout_console,
)
from protocol.terms import DEFAULT_ASYNC_LEVEL

if TYPE_CHECKING:
    from engine.proofs import ProofThresholds
    from ledger.client import Ledger
    from protocol.tasks.spec import TaskSpec
    from protocol.terms import PoolTerms
    from validator.config import ValidatorConfig
    from validator.daemon import PoolSetup
    from validator.settings import ValidatorSettings
    from validator.store import BatchRow, WorkRow

EXIT_ACCEPTED, EXIT_REJECTED, EXIT_BAD_INPUT, EXIT_COULD_NOT_JUDGE = 0, 1, 2, 3
# What a person fixes by changing the input: missing files, bad flags, a bad spec or checkpoint.
BAD_INPUT_ERRORS: tuple[type[Exception], ...] = (*KNOWN_ERRORS, NodeError)
# What to do when this validator could not judge a file, by validator.errors.Unjudged's values.
UNJUDGED_HINTS = {
    "memory": "give the validator more memory (ulimit -v, the container's limit) and run it again",
    "disk": "free disk space and run it again",
    "descriptors": "raise the open-file limit (ulimit -n) and run it again",
    "checkpoint": "check that --checkpoint holds the checkpoint of the file's step",
    "internal": "a fault of the validator, not of the file: PRIME_DEBUG=1 shows where; please report it",
}
FILE_EPILOG = (
    "Exit codes: 0 accepted, 1 rejected (the verdict as JSON on stdout), 2 refused usage (bad flags or inputs), "
    "3 could not judge (this validator's memory, disk or file descriptors ran out, or its own code failed: "
    "nothing is said about the file)."
)

app = typer.Typer(
    name="prime-validate",
    no_args_is_help=True,
    help="Verify rollout files (DESIGN section 7), offline or as the validator daemon of a pool.",
)


class ThresholdPreset(StrEnum):
    CPU_FP32 = "cpu-fp32"
    BF16 = "bf16"  # calibrated for bfloat16 on both sides: a bfloat16 pool's default
    GPU_BF16 = "gpu-bf16"  # the anchor's (INTELLECT-2 on GPUs): looser, not calibrated here


class DeviceChoice(StrEnum):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


class DtypeChoice(StrEnum):
    AUTO = "auto"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


DeviceOption = Annotated[
    DeviceChoice | None,
    typer.Option("--device", help="Where checkpoints recompute: auto is CUDA when torch sees a GPU [auto]."),
]
DtypeOption = Annotated[
    DtypeChoice | None,
    typer.Option(
        "--dtype",
        help="Precision to recompute in; it must be the task's sampling.dtype, which auto takes [auto].",
    ),
]
ThresholdsOption = Annotated[
    ThresholdPreset | None,
    typer.Option("--thresholds", help="TOPLOC limits; default: those calibrated for the precision."),
]


@app.callback()
def main() -> None:
    """Verify rollout files (DESIGN section 7), offline or as the validator daemon of a pool."""
    configure_logging()


@contextmanager
def bad_input_errors() -> Iterator[None]:
    """Like `ledger.cli.common.cli_errors`, but exit 2: here exit 1 means "the file was rejected"."""
    try:
        yield
    except BAD_INPUT_ERRORS as exc:
        _refuse(exc)


def _refuse(exc: BaseException) -> NoReturn:
    console = stderr_console()
    if debug_enabled():
        console.print_exception()
    console.print(Text(f"error: {one_line(exc)}", style="bold red"))
    raise typer.Exit(EXIT_BAD_INPUT) from None


@contextmanager
def file_errors() -> Iterator[None]:
    """`prime-validate file`'s failures: exit 3 when this validator could not judge, exit 2 for bad input.

    Could not judge: `CouldNotJudge` from the checks, or any failure before them whose cause is this host's memory,
    disk or descriptors (core.exhaustion: loading torch or the checkpoint under a memory limit), or that is no
    known input error (a fault of the validator's own). One plain line, printed without rich: memory may be short.
    """
    from core.exhaustion import exhausted
    from validator.errors import CouldNotJudge

    try:
        yield
    except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
        raise
    except Exception as exc:
        if isinstance(exc, CouldNotJudge):
            failure = exc
        elif isinstance(exc, BAD_INPUT_ERRORS) and exhausted(exc) is None:
            _refuse(exc)
        else:
            failure = CouldNotJudge.during("load", exc, what="loading the task, the checkpoint or the file")
        if debug_enabled():
            traceback.print_exc()
        typer.echo(f"could not judge: {one_line(failure)}; {UNJUDGED_HINTS[failure.cause]}", err=True)
        raise typer.Exit(EXIT_COULD_NOT_JUDGE) from None


@app.command("file", epilog=FILE_EPILOG)
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
    async_level: Annotated[
        int, typer.Option("--async-level", min=0, metavar="K", help="Steps a file may lag.")
    ] = DEFAULT_ASYNC_LEVEL,
    device: DeviceOption = None,
    dtype: DtypeOption = None,
    thresholds: ThresholdsOption = None,
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
    """Verify FILE against the checkpoint and the task; print the verdict as JSON (exit 0 accept, 1 reject).

    Exit 2: refused usage (bad flags or inputs); exit 3: could not judge (this validator failed, not the file)."""
    with file_errors():
        submitter = parse_address(node, what="--node") if node is not None else None
        key = parse_bytes32(work_key, what="--work-key") if work_key is not None else None
        import torch

        from engine.model.loading import load_model
        from engine.proofs import ProofThresholds
        from protocol.tasks.sources import open_source
        from protocol.tasks.spec import load_task_spec
        from validator.verify import Expected, verify_file

        spec = load_task_spec(task)
        config = _precision_config(spec, device, dtype, thresholds, async_level=async_level)
        limits = ProofThresholds(
            max_exp_mismatches=(
                config.thresholds.max_exp_mismatches if max_exp_mismatches is None else max_exp_mismatches
            ),
            max_mant_err_mean=config.thresholds.max_mant_err_mean if max_mant_mean is None else max_mant_mean,
            max_mant_err_median=config.thresholds.max_mant_err_median if max_mant_median is None else max_mant_median,
        )
        config = dataclasses.replace(config, thresholds=limits)
        expected = Expected(work_key=key, node=submitter, pool_id=pool, units=units, current_step=step)
        data = _read_bounded(file, config.max_file_bytes)
        source = open_source(spec)
        loaded = load_model(checkpoint, device=config.device, dtype=getattr(torch, config.dtype))
        # a bad file gives a verdict; what raises here is the validator's side (CouldNotJudge: exit 3)
        verdict = verify_file(data, spec=spec, checkpoint=loaded, config=config, expected=expected, source=source)
    typer.echo(verdict.to_json())
    raise typer.Exit(EXIT_ACCEPTED if verdict.accepted else EXIT_REJECTED)


def _preset(thresholds: ThresholdPreset) -> ProofThresholds:
    from engine.proofs import ProofThresholds

    presets = {
        ThresholdPreset.CPU_FP32: ProofThresholds.cpu_fp32,
        ThresholdPreset.BF16: ProofThresholds.bf16,
        ThresholdPreset.GPU_BF16: ProofThresholds.gpu_bf16,
    }
    return presets[thresholds]()


def _precision_config(
    spec: TaskSpec,
    device: str | None,
    dtype: str | None,
    thresholds: ThresholdPreset | None,
    **fields: Any,
) -> ValidatorConfig:
    """The config of the task's precision on the chosen device: the tolerances calibrated for it, the preset's
    TOPLOC limits when one is named. A dtype that is not the task's is refused: nothing is calibrated for it."""
    from engine.inference.select import resolve_device
    from validator.config import ValidatorConfig

    wanted = spec.sampling.dtype
    if dtype not in (None, "auto", wanted):
        raise CommandError(
            f"--dtype {dtype}: the task {spec.name!r} generates in {wanted} (its sampling.dtype); a validator "
            f"recomputes in the workers' precision, the one its thresholds are calibrated for: pass --dtype {wanted} "
            "or leave it out"
        )
    if thresholds is not None:
        fields["thresholds"] = _preset(thresholds)
    return ValidatorConfig.for_precision(wanted, device=resolve_device(device or "auto"), **fields)


def _read_bounded(path: Path, max_bytes: int) -> bytes:
    """At most max_bytes + 1 bytes: enough for the size check to refuse a larger file without reading it all."""
    with path.open("rb") as handle:
        return handle.read(max_bytes + 1)


@app.command("run")
def run_command(
    pool: Annotated[int, typer.Option("--pool", min=1, metavar="N", help="The pool to validate.")],
    keystore: KeystoreOption = None,
    dev_key: DevKeyOption = None,
    deployment: DeploymentOption = DEFAULT_DEPLOYMENT,
    rpc_url: RpcUrlOption = None,
    config_file: Annotated[
        Path | None, typer.Option("--config", metavar="FILE", help="validator.toml ([validator]); flags override it.")
    ] = None,
    state: Annotated[
        Path | None, typer.Option("--state", metavar="DIR", help="Cursor, verdicts and checkpoints (restart-safe).")
    ] = None,
    coordinator: Annotated[
        str | None, typer.Option("--coordinator", metavar="URL", help="Override the pool spec's.")
    ] = None,
    checkpoints: Annotated[
        list[str] | None, typer.Option("--checkpoints", metavar="URL", help="Checkpoint source (repeat).")
    ] = None,
    task: Annotated[Path | None, typer.Option("--task", metavar="SPEC", help="Override the pool spec's.")] = None,
    async_level: Annotated[
        int | None, typer.Option("--async-level", metavar="K", help="The pool's async level, checked.")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", metavar="P", help="Serve /metrics (0: any).")
    ] = None,
    dashboard_port: Annotated[
        int | None,
        typer.Option("--dashboard-port", metavar="P", help="Serve the web dashboard on 127.0.0.1 (0: any)."),
    ] = None,
    grace: Annotated[
        float | None,
        typer.Option("--grace", metavar="SECONDS", help="Wait for an upload before reason 8."),
    ] = None,
    poll: Annotated[float | None, typer.Option("--poll", metavar="SECONDS", help="Between chain reads.")] = None,
    confirmations: Annotated[
        int | None,
        typer.Option(
            "--confirmations",
            metavar="N",
            help="Blocks to stay behind the head [0 on a local chain, else 12].",
        ),
    ] = None,
    device: DeviceOption = None,
    dtype: DtypeOption = None,
    thresholds: ThresholdsOption = None,
    p2p_port: Annotated[
        int | None,
        typer.Option(
            "--p2p-port", metavar="P", help="Gossip attestations and heartbeats (0: any port); sharing needs it."
        ),
    ] = None,
    takeover: Annotated[
        float | None,
        typer.Option("--takeover", metavar="SECONDS", help="Take over a silent validator's share after this."),
    ] = None,
    heartbeat: Annotated[
        float | None, typer.Option("--heartbeat", metavar="SECONDS", help="Between this validator's heartbeats.")
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", metavar="N", help="torch threads for recomputation (0: default).")
    ] = None,
    memory_budget: MemoryBudgetOption = None,
) -> None:
    """Validate pool N: verify each submitted file, attest, invalidate the bad ones on chain; runs until stopped.

    Every setting is declared once, with its default and bounds, in validator.settings.ValidatorSettings:
    configs/validator.toml shows them; a flag overrides the file."""
    configure_daemon_logging()
    configure_tracing("validator")
    with cli_errors():
        import asyncio

        from core.hostmemory import parse_size
        from core.signals import run_until_signalled
        from ledger.cli.common import open_ledger
        from validator.daemon import ValidatorDaemon
        from validator.settings import ValidatorSettings

        settings = ValidatorSettings.load(
            config_file,
            flags={
                "state": state,
                "coordinator": coordinator,
                "checkpoints": checkpoints,
                "task": task,
                "async_level": async_level,
                "metrics_port": metrics_port,
                "dashboard_port": dashboard_port,
                "grace_seconds": grace,
                "poll_seconds": poll,
                "confirmations": confirmations,
                "device": device,
                "dtype": dtype,
                "thresholds": thresholds,
                "p2p_port": p2p_port,
                "takeover_seconds": takeover,
                "heartbeat_seconds": heartbeat,
                "threads": threads,
            },
        )
        file = settings.file
        budget = parse_size(memory_budget) if memory_budget is not None else None
        if settings.threads:
            # on a machine whose cores are busy, threads that spin at every barrier made verification 30x slower
            import torch

            torch.set_num_threads(settings.threads)
        ledger = open_ledger(deployment, rpc_url, keystore, dev_key)
        account = ledger.account
        assert account is not None  # open_ledger requires a signer
        setup, terms, bootstrap = _pool_setup(ledger, pool, settings)
        # the pool's terms bind: a validator told otherwise would reject honest files (and slash their stake)
        if async_level is not None:
            terms.require("--async-level", async_level, "async_level")
        for key in ("async_level", "max_file_bytes"):
            if key in file:
                terms.require(f"{config_file}: {key}", file[key], key)
        config = _precision_config(
            setup.task,
            settings.device,
            settings.dtype,
            ThresholdPreset(settings.thresholds) if settings.thresholds else None,
            async_level=terms.async_level,
            max_file_bytes=terms.max_file_bytes,
            **settings.config_fields(),
        )
        state_dir = settings.state_dir(pool, f"validator-{account.address}")

        async def main() -> None:
            daemon = ValidatorDaemon(
                ledger,
                setup,
                config,
                state_dir,
                metrics_port=settings.metrics_port,
                p2p_port=settings.p2p_port,
                bootstrap=bootstrap,
                dashboard_port=settings.dashboard_port,
                memory_budget=budget,
            )
            await run_until_signalled(daemon)

        asyncio.run(main())


def _pool_setup(ledger: Ledger, pool: int, settings: ValidatorSettings) -> tuple[PoolSetup, PoolTerms, tuple[str, ...]]:
    """The pool's terms (protocol.terms: from the chain and the pool spec at its specURI), where its parts are (the
    flags, else the spec), and its bootstrap peers (the spec's)."""
    from protocol.tasks.spec import load_task_spec
    from validator.daemon import PoolSetup

    joined = settings.resolve(ledger.pool(pool))
    found, terms = joined.endpoints, joined.terms
    setup = PoolSetup(
        pool_id=pool,
        trainer=terms.trainer,
        coordinator=found.coordinator,
        checkpoints=found.checkpoints,
        task=load_task_spec(found.task_path),
        replication=terms.replication,
        timing=terms.timing,
    )
    return setup, terms, found.bootstrap


@app.command("rejections")
def rejections_command(
    state: Annotated[Path, typer.Option("--state", metavar="DIR", help="The validator's state folder.")],
    json_output: JsonOption = False,
) -> None:
    """List the files this validator rejected (work key, node, reason, detail, the invalidation), and the batches
    whose leaf list itself condemned them."""
    with cli_errors():
        from validator.store import ValidatorStore

        store = ValidatorStore.open_existing(state)
        try:
            rows = store.rejections()
            batches = store.batch_rejections()
        finally:
            store.close()
    if json_output:
        print_json([_rejection(row) for row in rows] + [_batch_rejection(batch) for batch in batches])
        return
    from rich.table import Table

    # hashes as the daemon's log writes them (--json has them whole); detail and notes wrap
    table = Table(title=f"{len(rows)} rejected files, pool {store.pool_id}", title_justify="left")
    for column in ("work key", "node", "reason"):
        table.add_column(column, no_wrap=True)
    table.add_column("detail", min_width=24)
    table.add_column("invalidation", min_width=18)
    for row in rows:
        record = _rejection(row)
        reason = f"{record['reason_name']} ({row.reason})"
        table.add_row(_short(record["work_key"]), row.node, reason, row.detail or "", _invalidation(row))
    stdout_console().print(table)
    if batches:
        listed = Table(title=f"{len(batches)} batches rejected for their leaf list", title_justify="left")
        for column in ("batch", "node", "reason", "leaf"):
            listed.add_column(column, no_wrap=True)
        listed.add_column("detail", min_width=24)
        listed.add_column("invalidation", min_width=18)
        for batch in batches:
            record = _batch_rejection(batch)
            leaf = "none (no list)" if batch.leaf_index is None else str(batch.leaf_index)
            invalidation = f"tx {_short(batch.tx_hash)}" if batch.tx_hash else batch.note or "pending"
            reason = f"{record['reason_name']} ({batch.reason})"
            where = f"{_short(record['batch'])} (slot {batch.slot})"
            listed.add_row(where, batch.node, reason, leaf, batch.detail or "", invalidation)
        stdout_console().print(listed)


@app.command("explain")
def explain_command(
    work_key: Annotated[str, typer.Argument(metavar="WORK_KEY", help="The rejected file's work key (0x...).")],
    state: Annotated[Path, typer.Option("--state", metavar="DIR", help="The validator's state folder.")],
    task: Annotated[
        Path | None, typer.Option("--task", metavar="SPEC", help="The task spec, if it moved since the verdict.")
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Re-verify a rejection from the evidence kept with it and print why (exit 0 it holds, 1 it does not)."""
    with bad_input_errors():
        key = parse_bytes32(work_key, what="WORK_KEY")
        from validator.evidence import Evidence
        from validator.explain import report, reverify, same_outcome

        kept = Evidence(state).load(key)
        again = reverify(kept, task=task)
    holds = same_outcome(kept, again)
    if json_output:
        print_json({"kept": kept.record, "reverified": again.to_dict(), "holds": holds})
    else:
        for line in report(kept, again):
            typer.echo(line)
    raise typer.Exit(0 if holds else 1)


def _rejection(row: WorkRow) -> dict[str, Any]:
    from ledger.types import Reason
    from validator.verdict import Outcome

    known = {r.value: r.name.lower() for r in Reason}
    return {
        "work_key": "0x" + row.work_key.hex(),
        "batch": None if row.root is None else "0x" + row.root.hex(),  # None: a state from before batches
        "slot": row.slot,  # the node's batch slot that held it; None with the batch
        "leaf_index": row.leaf_index,
        "node": row.node,
        "units": row.units,
        "block": row.block,
        "stage": row.stage,
        "reason": row.reason,
        "reason_name": known.get(row.reason, "unknown") if row.reason is not None else "unknown",
        "check": row.check,
        "detail": row.detail,
        "invalidation_tx": row.tx_hash,
        "note": row.note,
        "borderline": row.outcome is Outcome.BORDERLINE,
    }


def _batch_rejection(batch: BatchRow) -> dict[str, Any]:
    """A batch its leaf list condemned, with the keys of a file's rejection (`work_key` None: no one file's)."""
    from ledger.types import Reason

    return {
        "work_key": None,
        "batch": "0x" + batch.root.hex(),
        "slot": batch.slot,
        "leaf_index": batch.leaf_index,  # the leaf its invalidation proves; None: no list was made available
        "node": batch.node,
        "units": batch.total_units,
        "block": batch.block,
        "stage": batch.stage,
        "reason": batch.reason,
        "reason_name": Reason.label(batch.reason).split(" ")[0] if batch.reason is not None else "unknown",
        "check": "leaf list",
        "detail": batch.detail,
        "invalidation_tx": batch.tx_hash,
        "note": batch.note,
        "borderline": False,
    }


def _invalidation(row: WorkRow) -> str:
    """The invalidateBatch transaction, or the refuseLeaf one of a borderline rejection, or why there is none."""
    from validator.store import REFUSED

    if row.tx_hash:
        return f"refused (no slash), tx {_short(row.tx_hash)}" if row.stage == REFUSED else f"tx {_short(row.tx_hash)}"
    return row.note or "pending"


def _short(hex_hash: str) -> str:
    return hex_hash[:14] + "…"


if __name__ == "__main__":
    app()
