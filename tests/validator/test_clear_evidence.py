"""Slash only on clear evidence: a failing row is recomputed alone in float64, and only a clear failure there is
slashable; a failure near the thresholds is refused as borderline (refused on chain by the daemon, never slashed)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from engine.generate import Generated
from engine.model.loading import LoadedModel
from engine.proofs import build_proof, proof_topk
from ledger.types import Reason
from protocol.rollouts import RolloutRow, encode_rollouts
from validator.config import ValidatorConfig, ValidatorConfigError
from validator.recompute import prefill_outputs
from validator.verdict import Outcome, Verdict


@pytest.fixture(scope="module")
def honest(generate: Callable[..., Generated]) -> Generated:
    return generate(counter=31, prompts=4, group=4)


def nudged_proof(row: RolloutRow, checkpoint: LoadedModel, entries: int, factor: float) -> bytes:
    """The row's proof rebuilt from its honest hidden states with `entries` of chunk 0's top-k scaled by `factor`:
    a few mantissa units off, the size of disagreement that sits just past the thresholds."""
    ((_, hidden, _),) = prefill_outputs(checkpoint.model, [row], 1)  # (n_out, H)
    chunk = hidden[:32].clone()
    flat = chunk.reshape(-1)
    top = flat.to(torch.bfloat16).abs().topk(proof_topk(hidden.shape[1])).indices
    flat[top[:entries]] *= factor
    return build_proof(torch.cat([chunk, hidden[32:]]))


def with_row(generated: Generated, index: int, **changes: object) -> bytes:
    rows = list(generated.rows)
    rows[index] = dataclasses.replace(rows[index], **changes)  # type: ignore[arg-type]
    return encode_rollouts(generated.meta, rows)


def test_a_failure_near_the_threshold_is_borderline_and_not_slashable(
    honest: Generated, verify: Callable[..., Verdict], checkpoint: LoadedModel
) -> None:
    index = next(i for i, row in enumerate(honest.rows) if len(row.output_tokens) >= 8)
    data = with_row(honest, index, proofs=nudged_proof(honest.rows[index], checkpoint, entries=3, factor=1.06))
    verdict = verify(data)
    assert not verdict.accepted and verdict.reason == Reason.PROOF_INVALID, verdict.to_json()
    assert verdict.outcome is Outcome.BORDERLINE and verdict.detail.startswith("borderline:")
    assert verdict.to_dict()["evidence"]["borderline"] is True  # what the evidence and `prime-validate file` show
    (recheck,) = verdict.evidence["rechecked"]
    assert recheck["row"] == index and recheck["confirmed"] and not recheck["clear"]
    assert 0.1 < recheck["second"]["evidence"]["mant_err_mean"] <= 0.4  # past the limit, within 4x of it
    assert recheck["second"]["route"] == "alone, float64"


def test_a_clear_failure_confirmed_alone_in_float64_is_slashable(
    generate: Callable[..., Generated], verify: Callable[..., Verdict], checkpoint: LoadedModel
) -> None:
    stale = generate(counter=32, prompts=2, group=4, model="m0_step")  # one training step behind, claiming m0
    data = encode_rollouts(dataclasses.replace(stale.meta, model_hash=checkpoint.model_hash), stale.rows)
    verdict = verify(data)
    assert not verdict.accepted and verdict.reason in (Reason.PROOF_INVALID, Reason.INVALID_SAMPLING)
    assert verdict.outcome is Outcome.SLASHABLE and "borderline" not in verdict.to_dict()["evidence"], verdict.to_json()
    assert verdict.detail.endswith("confirmed alone in float64")
    first = verdict.evidence["rechecked"][0]
    assert first["confirmed"] and first["clear"] and verdict.evidence["failing_rows"] == len(stale.rows)
    assert len(verdict.evidence["rechecked"]) == 1  # the first clear row decides: no more float64 recomputation


def test_a_many_row_failure_with_no_clear_row_stays_borderline_after_max_rechecks(
    honest: Generated, verify: Callable[..., Verdict], checkpoint: LoadedModel
) -> None:
    rows = list(honest.rows)
    long_rows = [i for i, row in enumerate(rows) if len(row.output_tokens) >= 8][:3]
    for i in long_rows:
        rows[i] = dataclasses.replace(rows[i], proofs=nudged_proof(rows[i], checkpoint, entries=3, factor=1.06))
    verdict = verify(encode_rollouts(honest.meta, rows), config=ValidatorConfig(max_rechecked_rows=2))
    assert verdict.outcome is Outcome.BORDERLINE and verdict.evidence["failing_rows"] == 3
    assert [r["row"] for r in verdict.evidence["rechecked"]] == long_rows[:2]


def test_the_policy_settings_are_bounded() -> None:
    with pytest.raises(ValidatorConfigError, match="clear_factor"):
        ValidatorConfig(clear_factor=1.0)
    with pytest.raises(ValidatorConfigError, match="max_rechecked_rows"):
        ValidatorConfig(max_rechecked_rows=0)


def test_a_changed_last_token_is_caught_by_the_sampling_recheck_and_is_clear(
    honest: Generated, verify: Callable[..., Verdict], checkpoint: LoadedModel
) -> None:
    # the last token's own hidden state does not depend on it: only the seeded sampling recheck sees the change
    index = next(i for i, row in enumerate(honest.rows) if row.finish_reason == "length")
    tokens = list(honest.rows[index].output_tokens)
    tokens[-1] = next(
        t for t in range(3, checkpoint.vocab_size) if t != tokens[-1] and t not in checkpoint.eos_token_ids
    )
    verdict = verify(with_row(honest, index, output_tokens=tokens))
    assert (verdict.reason, verdict.outcome) == (Reason.INVALID_SAMPLING, Outcome.SLASHABLE), verdict.to_json()
    second = verdict.evidence["rechecked"][0]["second"]["evidence"]
    config = ValidatorConfig()
    assert second.get("outside_nucleus") or second["gap"] > config.clear_factor * config.sampling_margin
    verdict.to_json()  # the evidence is JSON (no infinities)
