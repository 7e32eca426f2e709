"""Logging set-up, called once at start-up by a command: quiet for one-shot commands, timestamped for daemons.

`PRIME_DEBUG=1` turns on the prime packages' debug logs (and, in the command-line kit, tracebacks).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

DEBUG_ENV_VAR = "PRIME_DEBUG"
# The project's packages, lowest layer first (docs/architecture.md): whose logs a command shows, what the worker
# image copies, what the import-layer test ranks; pyproject.toml's list is checked against this one.
PACKAGES = ("core", "ledger", "protocol", "engine", "shardcast", "p2p", "node", "validator", "trainer", "devnet")


def debug_enabled() -> bool:
    """Whether PRIME_DEBUG=1; read at start-up by the command-line edge, and nowhere deeper."""
    return os.environ.get(DEBUG_ENV_VAR) == "1"


def configure_logging() -> None:
    """For one-shot commands: library warnings (an RPC retry, say) stay quiet, since the outcome is one line.

    PRIME_DEBUG=1 shows the prime packages' debug logs. Daemon commands call `configure_daemon_logging` instead.
    """
    logging.basicConfig(level=logging.WARNING if debug_enabled() else logging.ERROR, format="%(name)s: %(message)s")
    if debug_enabled():
        for package in PACKAGES:
            logging.getLogger(package).setLevel(logging.DEBUG)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is when a record is emitted, not to the stream it was at set-up: a command
    run in-process (typer's CliRunner in tests) swaps stderr and closes its copy afterwards."""

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _: object) -> None:
        """Ignored: StreamHandler.__init__ and setStream assign a stream; this handler always takes sys.stderr."""


def configure_daemon_logging(level: int = logging.INFO) -> None:
    """For long-running commands: timestamped logs of the prime packages on stderr (debug with PRIME_DEBUG=1)."""
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[_Stderr()],
        force=True,
    )
    for package in PACKAGES:
        logging.getLogger(package).setLevel(logging.DEBUG if debug_enabled() else level)
