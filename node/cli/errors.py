"""One-line errors for commands that use the node package (prime-node, prime-train, prime-validate).

`ledger.cli.common.cli_errors` knows the core's and the ledger's errors; imports point ledger <- node, so the node
package's own `NodeError` tree (with the validator's and the trainer's, which derive from it) is added here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ledger.cli.common import cli_errors
from node.errors import NodeError


@contextmanager
def node_cli_errors() -> Iterator[None]:
    """`cli_errors`, plus `NodeError`: a known failure prints one line and exits 1."""
    with cli_errors(NodeError):
        yield
