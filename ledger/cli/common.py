"""Plumbing every prime CLI shares: error handling, the deployment and signer flags, parsing, printing.

Importing this module loads typer and rich only; web3 and eth-account load inside the helpers that need
them, after the arguments are parsed, so `--help` stays instant. A command body runs inside `cli_errors()`:
a known error prints one red line and exits 1, and `PRIME_DEBUG=1` adds the traceback.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from ledger.errors import AmountError, LedgerError

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from ledger.client import Ledger

DEBUG_ENV_VAR = "PRIME_DEBUG"
DEPLOYMENT_ENV_VAR = "PRIME_DEPLOYMENT"
KEYSTORE_ENV_VAR = "PRIME_KEYSTORE"
NODE_PASSWORD_ENV_VAR = "PRIME_NODE_KEYSTORE_PASSWORD"
DEFAULT_DEPLOYMENT = Path("deployment.json")

# Known errors: the ones a person fixes by changing input, files or flags, not code.
KNOWN_ERRORS: tuple[type[Exception], ...] = (LedgerError, OSError, ValueError)


class CommandError(LedgerError):
    """A command's flags or arguments are missing, malformed, or do not fit together."""


# --- errors ------------------------------------------------------------------------------------------


def debug_enabled() -> bool:
    """Whether PRIME_DEBUG=1; read here, at the CLI edge, and nowhere deeper."""
    return os.environ.get(DEBUG_ENV_VAR) == "1"


def one_line(exc: BaseException) -> str:
    """The exception's message on a single line; its type name when the message is empty."""
    message = " ".join(str(exc).split())
    return message or type(exc).__name__


@contextmanager
def cli_errors() -> Iterator[None]:
    """Run a command body; a known error becomes `error: <message>` on stderr and `typer.Exit(1)`."""
    try:
        yield
    except KNOWN_ERRORS as exc:
        console = stderr_console()
        if debug_enabled():
            console.print_exception()
        console.print(Text(f"error: {one_line(exc)}", style="bold red"))
        raise typer.Exit(1) from None


def configure_logging() -> None:
    """For one-shot commands: library warnings (an RPC retry, say) stay quiet, since the outcome is one line.

    PRIME_DEBUG=1 shows the prime packages' debug logs. Daemon commands set up their own logging instead.
    """
    logging.basicConfig(level=logging.WARNING if debug_enabled() else logging.ERROR, format="%(name)s: %(message)s")
    if debug_enabled():
        for package in ("ledger", "node"):
            logging.getLogger(package).setLevel(logging.DEBUG)


def configure_daemon_logging(level: int = logging.INFO) -> None:
    """For long-running commands: timestamped logs of the prime packages on stderr (debug with PRIME_DEBUG=1)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    for package in ("ledger", "node", "trainer", "validator"):
        logging.getLogger(package).setLevel(logging.DEBUG if debug_enabled() else level)


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


def format_time(timestamp: int) -> str:
    """A chain timestamp as '2025-01-31 12:00:00 UTC'."""
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_duration(seconds: int) -> str:
    """86400 -> '1d', 5400 -> '1h 30m', 0 -> '0s'."""
    parts = []
    remaining = max(0, seconds)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    return " ".join(parts) or "0s"


# --- parsing -----------------------------------------------------------------------------------------

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400, "w": 604_800}
_DURATION_RE = re.compile(r"(?:\d+[smhdw])+")
_HEX32_RE = re.compile(r"^(0x)?[0-9a-fA-F]{64}$")


def parse_duration(text: str) -> int:
    """'3600' (seconds), '90m', '24h', '7d', '1h30m' -> seconds."""
    value = text.strip().lower()
    if value.isdigit():
        return int(value)
    if not _DURATION_RE.fullmatch(value):
        raise CommandError(f"not a duration: {text!r}; give seconds, or a number with s, m, h, d or w (90m, 24h, 7d)")
    return sum(int(count) * _DURATION_UNITS[unit] for count, unit in re.findall(r"(\d+)([smhdw])", value))


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


def parse_address(text: str, *, what: str) -> str:
    """A 0x-address in any letter case -> its checksummed form."""
    from eth_utils import is_address, to_checksum_address

    if not is_address(text):
        raise CommandError(f"{what}: not an address: {text!r}")
    return str(to_checksum_address(text))


def parse_bytes32(text: str, *, what: str) -> bytes:
    """64 hex digits, with or without 0x."""
    if not _HEX32_RE.match(text):
        raise CommandError(f"{what}: expected 32 bytes as 64 hex digits, got {text!r}")
    return bytes.fromhex(text.removeprefix("0x"))


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


@dataclass(frozen=True)
class KeyFlags:
    """The pair of flags that names one signer, for error messages, and where its password comes from."""

    keystore: str = "--keystore"
    dev_key: str = "--dev-key"
    password_env: str | None = None  # None: PRIME_KEYSTORE_PASSWORD


SIGNER_FLAGS = KeyFlags()


def check_key_flags(
    keystore: Path | None, dev_key: int | None, *, required: bool, flags: KeyFlags = SIGNER_FLAGS
) -> None:
    """At most one of the two flags, and exactly one when the command signs."""
    if keystore is not None and dev_key is not None:
        raise CommandError(f"give {flags.keystore} or {flags.dev_key}, not both")
    if required and keystore is None and dev_key is None:
        raise CommandError(
            f"this command signs a transaction: pass {flags.keystore} FILE "
            f"(or {flags.dev_key} N on a local anvil chain)"
        )


def check_dev_key_allowed(chain_id: int, flag: str = "--dev-key") -> None:
    """The anvil keys are public: anyone can spend from them on a real chain, so only chain 31337 accepts them."""
    from ledger.chain import LOCAL_CHAIN_ID

    if chain_id != LOCAL_CHAIN_ID:
        raise CommandError(
            f"{flag} is refused on chain {chain_id}: anvil development keys are public and work only on a local "
            f"anvil chain (id {LOCAL_CHAIN_ID}); sign with a keystore instead"
        )


def load_signer(
    keystore: Path | None, dev_key: int | None, *, chain_id: int, flags: KeyFlags = SIGNER_FLAGS
) -> LocalAccount | None:
    """The account the flags name (None when neither is given), decrypting a keystore with its password."""
    check_key_flags(keystore, dev_key, required=False, flags=flags)
    if dev_key is not None:
        check_dev_key_allowed(chain_id, flags.dev_key)
        from ledger.accounts import dev_account

        account = dev_account(dev_key)
        warn(f"using anvil development key {dev_key} ({account.address}): public, never use on a real chain")
        return account
    if keystore is None:
        return None
    from ledger import accounts

    env = flags.password_env if flags.password_env and flags.password_env in os.environ else accounts.PASSWORD_ENV_VAR
    return accounts.load_account(keystore.expanduser(), accounts.resolve_password(env))


def require_signer(
    keystore: Path | None, dev_key: int | None, *, chain_id: int, flags: KeyFlags = SIGNER_FLAGS
) -> LocalAccount:
    check_key_flags(keystore, dev_key, required=True, flags=flags)
    account = load_signer(keystore, dev_key, chain_id=chain_id, flags=flags)
    assert account is not None  # check_key_flags(required=True) guarantees a flag
    return account


def open_ledger(
    deployment: Path,
    rpc_url: str | None,
    keystore: Path | None,
    dev_key: int | None,
    need_signer: bool = True,
) -> Ledger:
    """Loads the deployment, connects (checking the chain id), and signs as the account the flags name."""
    from ledger.client import Ledger
    from ledger.deployment import Deployment

    check_key_flags(keystore, dev_key, required=need_signer)
    loaded = Deployment.load(deployment)
    if rpc_url:
        loaded = replace(loaded, rpc_url=rpc_url)
    if dev_key is not None:  # refuse before touching the network
        check_dev_key_allowed(loaded.chain_id)
    ledger = Ledger.connect(loaded)
    account = load_signer(keystore, dev_key, chain_id=loaded.chain_id)
    return ledger if account is None else ledger.as_account(account)
