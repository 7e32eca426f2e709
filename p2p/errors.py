"""The p2p package's exception tree: every error it raises derives from `P2PError`."""

from __future__ import annotations

from core.errors import NodeError


class P2PError(NodeError):
    """Base of the p2p errors; `context` holds the offending values (peer, address, topic ...)."""

    def __init__(self, message: str, **context: object) -> None:
        detail = ", ".join(f"{key}={value!r}" for key, value in context.items())
        super().__init__(f"{message} ({detail})" if detail else message)
        self.context = context


class NotRunningError(P2PError):
    """The host is not started, or it has stopped (or crashed) since."""


class PeerError(P2PError):
    """A call to one peer failed: it cannot be dialled, timed out, or refused the request."""

    def __init__(self, message: str, peer_id: str, **context: object) -> None:
        super().__init__(message, peer_id=peer_id, **context)
        self.peer_id = peer_id


class MessageError(P2PError):
    """A message that cannot be encoded, decoded or published: bad schema, wrong topic, too large."""
