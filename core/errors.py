"""The two roots of the project's exceptions: `CoreError` (the utilities', a person's bad input) and `NodeError`
(everything above the ledger: the protocol kernel, the engine, SHARDCAST, p2p, and the roles, whose own trees
derive from it, so every command prints them as one line)."""

from __future__ import annotations


class CoreError(Exception):
    """Base of every error raised by the core package."""


class InputError(CoreError):
    """A value a person gave (a flag, an argument, a config entry) is missing, malformed, or does not fit with
    another; the message names it and says what would do. Commands raise it as `ledger.cli.common.CommandError`."""


class ParseError(InputError):
    """A value a person typed could not be read; `text` is what they typed."""

    def __init__(self, message: str, *, text: str) -> None:
        super().__init__(message)
        self.text = text


class NodeError(Exception):
    """Base of every error raised above the ledger: protocol, engine, shardcast, p2p, node, validator, trainer."""


def one_line(exc: BaseException) -> str:
    """The exception's message on a single line; its type name when the message is empty."""
    message = " ".join(str(exc).split())
    return message or type(exc).__name__
