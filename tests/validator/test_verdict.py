"""The four outcomes of judging a file, and what each sends on chain: only a slashable rejection is ever invalidated
(a slash); a borderline one is refused, never slashed; a file this validator could not judge is never a verdict."""

from __future__ import annotations

import json

import pytest

from ledger.types import Reason
from validator.verdict import Outcome, Sanction, Verdict, accept, borderline, recorded_outcome, reject, sanction


def test_only_a_slashable_outcome_is_ever_sent_as_an_invalidation() -> None:
    """Every outcome there is, a new one too: the daemon's transaction and its store's open rows both ask `sanction`.
    On batches an invalidation is `invalidateBatch` (the batch void, the node slashed and ejected) and a refusal
    `refuseLeaf` (tests/validator/test_daemon_refusal.py sends both on anvil)."""
    sent = {outcome: sanction(outcome) for outcome in Outcome}
    assert [outcome for outcome, action in sent.items() if action is Sanction.INVALIDATE] == [Outcome.SLASHABLE]
    assert sent == {
        Outcome.ACCEPTED: None,  # paid after its window
        Outcome.SLASHABLE: Sanction.INVALIDATE,
        Outcome.BORDERLINE: Sanction.REFUSE,  # never paid, never slashed
        Outcome.UNJUDGED: None,  # this validator's failure, never the worker's
    }


def test_a_file_that_could_not_be_judged_has_no_verdict() -> None:
    with pytest.raises(ValueError, match="CouldNotJudge"):
        Verdict(Outcome.UNJUDGED, Reason.PROOF_INVALID, "model", "out of memory")


def test_borderline_is_an_outcome_and_the_old_evidence_flag_cannot_make_a_slashable_verdict() -> None:
    """`reject(..., borderline=True)` was how a verdict said it before the outcome type: it would now be a slashable
    verdict that reads as borderline, so it is refused."""
    with pytest.raises(ValueError, match="borderline"):
        reject(Reason.PROOF_INVALID, "model", "row 3 at 2.1x the threshold", borderline=True)
    refused = borderline(Reason.PROOF_INVALID, "model", "borderline: row 3", row=3)
    assert (refused.outcome, refused.accepted, refused.borderline) == (Outcome.BORDERLINE, False, True)
    assert refused.evidence == {"row": 3}


def test_the_written_verdict_keeps_the_borderline_key_and_reads_back_to_its_outcome() -> None:
    """`prime-validate file` prints `to_dict` and the evidence keeps it: readers still find `"borderline": true`."""
    verdicts = [
        accept("fine", rows=4),
        reject(Reason.PROOF_INVALID, "model", "row 0: clear", row=0),
        borderline(Reason.STALE_STEP, "step", "outside [3, 5]", step=0),
    ]
    for verdict in verdicts:
        written = json.loads(verdict.to_json())
        assert ("borderline" in written["evidence"]) is verdict.borderline
        assert recorded_outcome(written) is verdict.outcome


def test_evidence_written_before_the_outcome_type_is_read_as_it_was_meant() -> None:
    """Records kept by a validator from before: the borderline mark is an evidence key, set to true or absent."""
    old_borderline = {"accepted": False, "reason": 7, "evidence": {"row": 3, "borderline": True, "rechecked": []}}
    old_slashable = {"accepted": False, "reason": 7, "evidence": {"row": 3, "rechecked": []}}
    old_accepted = {"accepted": True, "reason": None, "evidence": {"rows": 4}}
    assert recorded_outcome(old_borderline) is Outcome.BORDERLINE
    assert recorded_outcome(old_slashable) is Outcome.SLASHABLE
    assert recorded_outcome(old_accepted) is Outcome.ACCEPTED
