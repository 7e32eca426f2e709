"""The outcome of verifying one rollout file: accepted, or rejected with a reason code and the evidence.

A verdict is what a validator attests to on chain (`Attestation(poolId, workKey, accepted, reason)`) and
what a person reads when a node disputes a slash, so it names the check that decided, says why in one
sentence, and carries the numbers behind it (row, chunk, expected and found values).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from ledger.types import Reason

ACCEPTED_CHECK = "all"  # `Verdict.check` of an accepted file: every check passed


@dataclass(frozen=True)
class Verdict:
    """One file's verdict. `reason` is None exactly when `accepted`; evidence values are JSON-serialisable."""

    accepted: bool
    reason: Reason | None
    check: str  # the check that decided: its name, or ACCEPTED_CHECK
    detail: str  # one readable sentence
    evidence: dict[str, Any] = field(default_factory=dict)  # row index, chunk, expected and found values
    timings: dict[str, float] = field(default_factory=dict)  # seconds per check that ran, in order

    def __post_init__(self) -> None:
        if self.accepted != (self.reason is None):
            raise ValueError(f"a verdict has a reason iff it rejects: accepted={self.accepted}, reason={self.reason}")

    @property
    def borderline(self) -> bool:
        """A rejection not clear enough to slash (validator.recompute): refused for training, never sent on chain."""
        return self.evidence.get("borderline") is True

    def with_timings(self, timings: dict[str, float]) -> Verdict:
        return replace(self, timings=dict(timings))

    def to_dict(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "reason": None if self.reason is None else int(self.reason),
            "reason_name": None if self.reason is None else self.reason.name.lower(),
            "check": self.check,
            "detail": self.detail,
            "evidence": self.evidence,
            "timings": {name: round(seconds, 6) for name, seconds in self.timings.items()},
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)


def reject(reason: Reason, check: str, detail: str, **evidence: Any) -> Verdict:
    """A rejection; the keyword arguments become the evidence."""
    return Verdict(accepted=False, reason=reason, check=check, detail=detail, evidence=evidence)


def accept(detail: str, **evidence: Any) -> Verdict:
    return Verdict(accepted=True, reason=None, check=ACCEPTED_CHECK, detail=detail, evidence=evidence)
