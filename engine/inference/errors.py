"""The inference package's errors, apart from the modules that raise them: the sampler and the backends import this
and nothing of each other's."""

from __future__ import annotations

from core.errors import NodeError


class InferenceError(NodeError):
    """Generation cannot run as asked: a bad request, a model limit, or a missing backend."""
