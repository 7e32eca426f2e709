"""The trainer package's exception tree: every error it raises derives from `TrainerError`."""

from __future__ import annotations


class TrainerError(Exception):
    """Base of every error raised by the trainer package."""
