"""The validator package's exception tree; every error it raises derives from `ValidatorError`."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from core.errors import NodeError
from core.exhaustion import exhausted


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


class Unjudged(StrEnum):
    """Why a validator could not judge a file: always a reason of its own, never the file's."""

    MEMORY = "memory"  # core.exhaustion.Resource's three first
    DISK = "disk"
    DESCRIPTORS = "descriptors"
    CHECKPOINT = "checkpoint"  # the checkpoint of the file's step could not be had
    INTERNAL = "internal"  # the validator's own code failed: an exception inside a check

    @classmethod
    def of(cls, exc: BaseException, otherwise: Unjudged) -> Unjudged:
        """The resource `exc` says ran out (core.exhaustion), else `otherwise`."""
        resource = exhausted(exc)
        return otherwise if resource is None else cls(resource.value)


class CouldNotJudge(ValidatorError):
    """The validator could not judge a file, for a reason of its own (`cause`): never a verdict on the file.

    A check returns a rejecting Verdict for every fault of the file; whatever a check raises instead is the
    validator's failure (its memory, disk or descriptors ran out, or its own code failed), as is a checkpoint it
    cannot have. The daemon tries such a file again with back-off, then records it unverifiable (never attested,
    never invalidated); `prime-validate file` exits with its own code.
    """

    def __init__(self, check: str, cause: Unjudged, message: str) -> None:
        super().__init__(message)
        self.check, self.cause = check, cause

    @classmethod
    def during(
        cls, check: str, exc: BaseException, otherwise: Unjudged = Unjudged.INTERNAL, *, what: str | None = None
    ) -> CouldNotJudge:
        """The failure `exc` raised while `check` (described as `what`) ran; raise it `from exc`."""
        cause = Unjudged.of(exc, otherwise)
        doing = what or f"the {check} check"
        return cls(check, cause, f"{doing} failed on this validator's side ({cause}): {type(exc).__name__}: {exc}")


class CheckpointGone(CouldNotJudge):
    """Every checkpoint source answered, and none holds the step any more: files of that step can never be verified
    here (the daemon records them unverifiable at once, with no retry)."""

    def __init__(self, step: int, sources: Sequence[str]) -> None:
        super().__init__(
            "model",  # validator.checks.MODEL, the check that needs it
            Unjudged.CHECKPOINT,
            f"the checkpoint of step {step} is no longer offered by any source ({', '.join(sources)})",
        )
        self.step, self.sources = step, tuple(sources)
