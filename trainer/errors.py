"""The trainer package's exception tree: every error it raises derives from `TrainerError`.

It is a `NodeError` so that every command's `cli_errors` prints a trainer failure as one line.
"""

from __future__ import annotations

from core.errors import NodeError


class TrainerError(NodeError):
    """Base of every error raised by the trainer package."""
