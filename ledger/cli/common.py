"""The kit every prime CLI shares: error handling, the deployment and signer flags, consoles and printing.

It sits on `core` (errors, parsing, formatting, logging set-up) and `ledger.signers` (the account the key flags
name), and re-exports what commands use from them, so a command imports its plumbing from one place. Nothing
outside a `cli` module imports this one.

Importing this module loads typer and rich only; web3 and eth-account load inside the helpers that need
them, after the arguments are parsed, so `--help` stays instant. A command body runs inside `cli_errors()`:
a known error prints one red line and exits 1, and `PRIME_DEBUG=1` adds the traceback.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from core.errors import CoreError, NodeError, one_line
from core.errors import InputError as CommandError
from core.hexids import parse_address, parse_bytes32
from core.logs import DEBUG_ENV_VAR, configure_daemon_logging, configure_logging, debug_enabled
from core.timefmt import format_duration, format_time, parse_duration
from ledger import signers
from ledger.errors import AmountError, LedgerError
from ledger.signers import SIGNER_FLAGS, KeyFlags, check_dev_key_allowed, check_key_flags

if TYPE_CHECKING:
    from ledger.client import Ledger

__all__ = [
    "DEBUG_ENV_VAR",
    "DEFAULT_DEPLOYMENT",
    "DEPLOYMENT_ENV_VAR",
    "KEYSTORE_ENV_VAR",
    "KNOWN_ERRORS",
    "NODE_PASSWORD_ENV_VAR",
    "SIGNER_FLAGS",
    "ChainFlags",
    "CommandError",
    "DeploymentOption",
    "DevKeyOption",
    "JsonOption",
    "KeyFlags",
    "KeystoreOption",
    "RpcUrlOption",
    "chain_flags",
    "check_dev_key_allowed",
    "check_key_flags",
    "cli_errors",
    "command_app",
    "configure_daemon_logging",
    "configure_logging",
    "debug_enabled",
    "format_duration",
    "format_time",
    "format_tokens",
    "load_signer",
    "one_line",
    "open_ledger",
    "parse_address",
    "parse_bytes32",
    "parse_duration",
    "parse_tokens",
    "print_json",
    "require_signer",
    "stderr_console",
    "stdout_console",
    "warn",
]

DEPLOYMENT_ENV_VAR = "PRIME_DEPLOYMENT"
KEYSTORE_ENV_VAR = "PRIME_KEYSTORE"
NODE_PASSWORD_ENV_VAR = "PRIME_NODE_KEYSTORE_PASSWORD"
DEFAULT_DEPLOYMENT = Path("deployment.json")

# Known errors: the ones a person fixes by changing input, files or flags, not code. `CommandError` (a flag that
# is missing, malformed or does not fit with another) is core's `InputError`, a `CoreError`.
KNOWN_ERRORS: tuple[type[Exception], ...] = (CoreError, NodeError, LedgerError, OSError, ValueError)


# --- errors ------------------------------------------------------------------------------------------


@contextmanager
def cli_errors(*also: type[Exception]) -> Iterator[None]:
    """Run a command body; a known error (`KNOWN_ERRORS`, and the exception types in `also`) becomes
    `error: <message>` on stderr and `typer.Exit(1)`."""
    try:
        yield
    except (*KNOWN_ERRORS, *also) as exc:
        console = stderr_console()
        if debug_enabled():
            console.print_exception()
        console.print(Text(f"error: {one_line(exc)}", style="bold red"))
        raise typer.Exit(1) from None


# --- apps --------------------------------------------------------------------------------------------


def command_app(name: str, help: str) -> typer.Typer:
    """A command's top-level app: its help when run bare, and logging set up for one-shot commands before any runs
    (a daemon command sets up its own)."""
    app = typer.Typer(name=name, no_args_is_help=True, help=help)

    @app.callback()
    def _setup() -> None:
        configure_logging()

    return app


# --- printing ----------------------------------------------------------------------------------------


def stdout_console() -> Console:
    """stdout; when it is not a terminal, wide enough that addresses and hashes are never cut."""
    out = Console(highlight=False, soft_wrap=True)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = 160
    return out


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def warn(message: str) -> None:
    """A yellow line on stderr, so that stdout (for example --json output) stays clean."""
    stderr_console().print(Text(message, style="yellow"))


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


# --- token amounts -----------------------------------------------------------------------------------


def parse_tokens(text: str, decimals: int, *, what: str) -> int:
    """Whole tokens as a person types them ('12.5') -> base units; `what` names the flag in the error."""
    from ledger.units import parse_amount

    try:
        return parse_amount(text, decimals)
    except AmountError as exc:
        raise AmountError(f"{what}: {exc}") from None


def format_tokens(base_units: int, decimals: int) -> str:
    from ledger.units import format_amount

    return format_amount(base_units, decimals)


# --- signers -----------------------------------------------------------------------------------------

# `ledger.signers`, warning with a yellow line: the anvil development keys are public
load_signer = functools.partial(signers.load_signer, warn=warn)
require_signer = functools.partial(signers.require_signer, warn=warn)
open_ledger = functools.partial(signers.open_ledger, warn=warn)


# --- flags -------------------------------------------------------------------------------------------

DeploymentOption = Annotated[
    Path,
    typer.Option("--deployment", envvar=DEPLOYMENT_ENV_VAR, help="Deployment file written by `prime-pool deploy`."),
]
RpcUrlOption = Annotated[
    str | None, typer.Option("--rpc-url", metavar="URL", help="Chain JSON-RPC endpoint; overrides the deployment's.")
]
KeystoreOption = Annotated[
    Path | None,
    typer.Option(
        "--keystore",
        envvar=KEYSTORE_ENV_VAR,
        metavar="FILE",
        help="Encrypted keystore that signs; its password comes from PRIME_KEYSTORE_PASSWORD or a prompt.",
    ),
]
DevKeyOption = Annotated[
    int | None,
    typer.Option(
        "--dev-key", min=0, max=9, metavar="N", help="Sign with anvil's public development key N (chain 31337 only)."
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
# Parsed by core.hostmemory.parse_size; engine.memory compares the pool's model with it instead of what is free.
MemoryBudgetOption = Annotated[
    str | None,
    typer.Option(
        "--memory-budget",
        metavar="SIZE",
        help="Plan the model within this much memory (512MiB, 8GiB) instead of what is free on the device now.",
    ),
]


# --- the chain flags of a command --------------------------------------------------------------------


@dataclass(frozen=True)
class ChainFlags:
    """Which deployment, which endpoint and which signer a command was given (`chain_flags` adds the flags)."""

    deployment: Path
    rpc_url: str | None
    keystore: Path | None = None
    dev_key: int | None = None

    def open_ledger(self, *, need_signer: bool = True) -> Ledger:
        """The deployment's ledger, signing as the account the key flags name (`ledger.signers.open_ledger`)."""
        return open_ledger(self.deployment, self.rpc_url, self.keystore, self.dev_key, need_signer=need_signer)


_CHAIN_FLAGS = (  # in the order `--help` lists them, after the command's own
    inspect.Parameter(
        "deployment", inspect.Parameter.KEYWORD_ONLY, default=DEFAULT_DEPLOYMENT, annotation=DeploymentOption
    ),
    inspect.Parameter("rpc_url", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=RpcUrlOption),
    inspect.Parameter("keystore", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=KeystoreOption),
    inspect.Parameter("dev_key", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=DevKeyOption),
)


def chain_flags(*, signer: bool = True) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Gives a command --deployment and --rpc-url, and with `signer` --keystore and --dev-key, listed after its own
    arguments and options; the command takes them as its first parameter, `chain: ChainFlags`. Put it under the
    app's `command()` decorator: typer reads the flags from the signature it gives the command."""
    flags = _CHAIN_FLAGS if signer else _CHAIN_FLAGS[:2]

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "chain"]

        @functools.wraps(command)
        def run(**given: Any) -> None:
            chain = ChainFlags(**{flag.name: given.pop(flag.name) for flag in flags})
            command(**given, chain=chain)

        run.__signature__ = signature.replace(parameters=[*own, *flags])  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in (*own, *flags)}
        return run

    return decorate
