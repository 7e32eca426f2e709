"""The validator package's exception tree; every error it raises derives from `ValidatorError`."""

from __future__ import annotations

from collections.abc import Sequence

from node.errors import NodeError


class ValidatorError(NodeError):
    """Base of every error raised by the validator package."""


class ValidatorStateError(ValidatorError):
    """The state folder is missing, belongs to another pool, chain or validator, or is not a validator state."""


class NotAValidator(ValidatorError):
    """The signing account is not a validator of the pool on chain."""

    def __init__(self, address: str, pool_id: int) -> None:
        super().__init__(
            f"{address} is not a validator of pool {pool_id}: the pool owner appoints it with "
            f"`prime-pool validator add {pool_id} {address}`"
        )
        self.address, self.pool_id = address, pool_id


class CheckpointGone(ValidatorError):
    """Every checkpoint source answered, and none holds the step any more: files of that step cannot be verified."""

    def __init__(self, step: int, sources: Sequence[str]) -> None:
        super().__init__(f"the checkpoint of step {step} is no longer offered by any source ({', '.join(sources)})")
        self.step, self.sources = step, tuple(sources)
