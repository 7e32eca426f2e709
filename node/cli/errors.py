"""Turn known errors into one red line on stderr and exit code 1, so users never see a traceback.

A command body runs inside `cli_errors()` (a context manager, also usable as a decorator). Errors
the user can act on (ledger errors, OS errors such as a missing directory, bad values) print their
message; anything else is a bug and propagates with its traceback. `PRIME_DEBUG=1` prints the full
traceback of known errors too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.text import Text

from ledger.errors import LedgerError

DEBUG_ENV_VAR = "PRIME_DEBUG"

# Known errors: the ones a person fixes by changing input, files or flags, not code.
KNOWN_ERRORS: tuple[type[Exception], ...] = (LedgerError, OSError, ValueError)


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
        console = Console(stderr=True, highlight=False, soft_wrap=True)
        if debug_enabled():
            console.print_exception()
        console.print(Text(f"error: {one_line(exc)}", style="bold red"))
        raise typer.Exit(1) from None
