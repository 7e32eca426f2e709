"""The outcome of judging one rollout file, and what each outcome sends on chain.

A verdict is what a validator attests to (`Attestation(poolId, workKey, accepted, reason)`) and what a person reads
when a node disputes a slash, so it names the check that decided, says why in one sentence, and carries the numbers
behind it (row, chunk, expected and found values).

Judging a file ends in one of four outcomes (`Outcome`): accepted; rejected and slashable; rejected but borderline
(refused, never slashed); or not judged at all, because this validator could not (`validator.errors.CouldNotJudge`:
never the worker's fault). A `Verdict` is one of the first three; the fourth is never a verdict, so it is never
attested. `sanction` is the one place that says what each outcome sends on chain.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from ledger.types import Reason

ACCEPTED_CHECK = "all"  # `Verdict.check` of an accepted file: every check passed
BORDERLINE_KEY = "borderline"  # the evidence key a borderline verdict is written with (`Verdict.to_dict`)


class Outcome(StrEnum):
    """How judging a file ended. The values are what the validator's store holds (`validator.store`)."""

    ACCEPTED = "accepted"  # every check passed: attested, paid after its window, trained on
    SLASHABLE = "slashable"  # rejected on clear evidence: attested, invalidated (the provider slashed, node ejected)
    BORDERLINE = "borderline"  # rejected, not clear on the second route: attested, refused (never paid), never slashed
    UNJUDGED = "unjudged"  # this validator could not judge it (its own failure): never attested, nothing sent


class Sanction(StrEnum):
    """What a validator sends on chain against a rejected file (WorkLedger); the value is the call's name."""

    INVALIDATE = "invalidateBatch"  # slashes the provider and ejects the node; the whole batch is never paid
    REFUSE = "refuseLeaf"  # the file is never paid; no slash, the node stays a member


def sanction(outcome: Outcome) -> Sanction | None:
    """What goes on chain for `outcome`: invalidateBatch only for a slashable rejection, refuseLeaf for a borderline
    one, nothing for an accepted file (it is paid) or one this validator could not judge (never the worker's fault).

    The daemon's choice of transaction, and which of its rows still have one to send, are both this function.
    """
    if outcome is Outcome.SLASHABLE:
        return Sanction.INVALIDATE
    if outcome is Outcome.BORDERLINE:
        return Sanction.REFUSE
    return None


@dataclass(frozen=True)
class Verdict:
    """One file's verdict: accepted, slashable or borderline (never UNJUDGED). `reason` is None exactly when accepted;
    evidence values are JSON-serialisable."""

    outcome: Outcome
    reason: Reason | None
    check: str  # the check that decided: its name, or ACCEPTED_CHECK
    detail: str  # one readable sentence
    evidence: dict[str, Any] = field(default_factory=dict)  # row index, chunk, expected and found values
    timings: dict[str, float] = field(default_factory=dict)  # seconds per check that ran, in order

    def __post_init__(self) -> None:
        if self.outcome is Outcome.UNJUDGED:
            raise ValueError("a file this validator could not judge has no verdict: raise CouldNotJudge")
        if self.accepted != (self.reason is None):
            raise ValueError(f"a verdict has a reason iff it rejects: outcome={self.outcome}, reason={self.reason}")
        if BORDERLINE_KEY in self.evidence:  # written from the outcome, so it can never disagree with it
            raise ValueError(f"{BORDERLINE_KEY!r} is the outcome, not evidence: build the verdict with borderline()")

    @property
    def accepted(self) -> bool:
        return self.outcome is Outcome.ACCEPTED

    @property
    def borderline(self) -> bool:
        """A rejection not clear enough to slash (validator.recompute): refused for training and payment."""
        return self.outcome is Outcome.BORDERLINE

    def with_timings(self, timings: dict[str, float]) -> Verdict:
        return replace(self, timings=dict(timings))

    def to_dict(self) -> dict[str, Any]:
        """The verdict as `prime-validate file` prints it and the evidence keeps it; `recorded_outcome` reads it."""
        evidence = (self.evidence | {BORDERLINE_KEY: True}) if self.borderline else self.evidence
        return {
            "accepted": self.accepted,
            "reason": None if self.reason is None else int(self.reason),
            "reason_name": None if self.reason is None else self.reason.name.lower(),
            "check": self.check,
            "detail": self.detail,
            "evidence": evidence,
            "timings": {name: round(seconds, 6) for name, seconds in self.timings.items()},
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)


def recorded_outcome(verdict: Mapping[str, Any]) -> Outcome:
    """The outcome of a verdict written by `Verdict.to_dict` (kept evidence, `prime-validate file`'s output)."""
    if verdict["accepted"]:
        return Outcome.ACCEPTED
    return Outcome.BORDERLINE if verdict.get("evidence", {}).get(BORDERLINE_KEY) is True else Outcome.SLASHABLE


def reject(reason: Reason, check: str, detail: str, **evidence: Any) -> Verdict:
    """A slashable rejection; the keyword arguments become the evidence."""
    return Verdict(Outcome.SLASHABLE, reason, check, detail, evidence)


def borderline(reason: Reason, check: str, detail: str, **evidence: Any) -> Verdict:
    """A rejection not clear enough to slash: refused (never trained on, never paid), never slashed."""
    return Verdict(Outcome.BORDERLINE, reason, check, detail, evidence)


def accept(detail: str, **evidence: Any) -> Verdict:
    return Verdict(Outcome.ACCEPTED, None, ACCEPTED_CHECK, detail, evidence)
