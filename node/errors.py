"""The node package's exception tree; every error it raises derives from `NodeError`."""


class NodeError(Exception):
    """Base of every error raised by the node package."""
