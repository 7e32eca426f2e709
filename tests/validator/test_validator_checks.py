"""The pure checks on hand-made rows: step window, group layout, EOS and finish_reason rules, verdicts, config."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from engine.proofs import ProofThresholds
from ledger.types import Reason
from protocol.rollouts import RolloutRow
from validator.checks import check_sampling_sanity, check_step, check_work_key, group_shape
from validator.config import ValidatorConfig, ValidatorConfigError
from validator.verdict import Outcome, Verdict, accept, reject

EOS = (7, 8)
MAX_TOKENS = 5
VOCAB = 20


def row(**changes: Any) -> RolloutRow:
    fields: dict[str, Any] = {
        "problem_id": "p/0",
        "group": 0,
        "input_tokens": [1, 2, 3],
        "output_tokens": [4, 5, 7],
        "output_logprobs": [-1.0, -1.0, -1.0],
        "finish_reason": "stop",
        "reward": 0.0,
        "task_reward": 0.0,
        "length_penalty": 0.0,
        "target_length": -1,
        "seed": 1,
        "step": 0,
        "proofs": b"x",
    }
    return RolloutRow(**(fields | changes))


def sanity(*rows: RolloutRow) -> Verdict | None:
    return check_sampling_sanity(rows, max_tokens=MAX_TOKENS, vocab_size=VOCAB, eos_token_ids=EOS)


@pytest.mark.parametrize(
    ("step", "current", "accepted"),
    [(5, None, True), (5, 5, True), (3, 5, True), (2, 5, False), (6, 5, False), (0, 1, True), (0, 0, True)],
)
def test_the_step_window_is_current_minus_async_level_to_current(
    step: int, current: int | None, accepted: bool
) -> None:
    verdict = check_step(step, current, async_level=2)
    assert (verdict is None) == accepted
    if verdict is not None:
        assert verdict.reason is Reason.STALE_STEP and verdict.evidence["current_step"] == current


@pytest.mark.parametrize(
    ("step", "earliest", "current", "accepted"),
    [(7, 9, 15, True), (6, 9, 15, False), (15, 9, 15, True), (16, 9, 15, False), (0, 0, 15, True)],
)
def test_an_uncertain_submission_time_widens_the_window_to_earliest_minus_async_level(
    step: int, earliest: int, current: int, accepted: bool
) -> None:
    verdict = check_step(step, current, async_level=2, earliest_step=earliest)
    assert (verdict is None) == accepted
    if verdict is not None:
        assert verdict.evidence["earliest_step"] == earliest and verdict.evidence["current_step"] == current


def test_work_key_is_skipped_when_not_given_and_compared_when_given() -> None:
    assert check_work_key(b"data", None) is None
    assert check_work_key(b"data", hashlib.sha256(b"data").digest()) is None
    verdict = check_work_key(b"data", b"\x00" * 32)
    assert verdict is not None and verdict.reason is Reason.HASH_MISMATCH


def test_groups_must_be_numbered_from_zero_equal_sized_and_in_plan_order() -> None:
    assert group_shape([row(group=0), row(group=0), row(group=1), row(group=1)]) == (2, 2)
    assert group_shape([row(group=0)]) == (1, 1)
    for groups in ([0, 0, 1], [1, 1], [0, 2], [0, 1, 0, 1]):
        verdict = group_shape([row(group=g) for g in groups])
        assert isinstance(verdict, Verdict) and verdict.reason is Reason.WRONG_ASSIGNMENT, groups


@pytest.mark.parametrize(
    ("tokens", "finish"),
    [([4, 5, 7], "stop"), ([8], "stop"), ([4, 5, 6, 9, 7], "stop"), ([4, 5, 6, 9, 10], "length")],
)
def test_consistent_finish_reasons_pass(tokens: list[int], finish: str) -> None:
    assert sanity(row(output_tokens=tokens, finish_reason=finish)) is None


@pytest.mark.parametrize(
    ("tokens", "finish"),
    [
        ([4, 5, 6], "stop"),  # no EOS at all
        ([4, 7, 7], "stop"),  # an EOS before the last token: generation would have stopped there
        ([4, 5, 6, 9], "length"),  # "length" with fewer than max_tokens
        ([4, 7, 6, 9, 10], "length"),  # an EOS inside a "length" row
        ([4, 5, 6, 9, 10, 7], "stop"),  # more than max_tokens
        ([4, VOCAB, 7], "stop"),  # outside the vocabulary
    ],
    ids=["stop-without-eos", "eos-before-last", "length-too-short", "eos-in-length", "too-long", "outside-vocab"],
)
def test_inconsistent_rows_fail_sampling_sanity(tokens: list[int], finish: str) -> None:
    verdict = sanity(row(), row(output_tokens=tokens, finish_reason=finish))
    assert verdict is not None and verdict.reason is Reason.INVALID_SAMPLING
    assert verdict.evidence["row"] == 1


def test_a_verdict_has_a_reason_exactly_when_it_rejects() -> None:
    with pytest.raises(ValueError, match="reason iff"):
        Verdict(Outcome.ACCEPTED, reason=Reason.BAD_FORMAT, check="format", detail="x")
    for rejected in (Outcome.SLASHABLE, Outcome.BORDERLINE):
        with pytest.raises(ValueError, match="reason iff"):
            Verdict(rejected, reason=None, check="format", detail="x")


def test_verdict_json_has_reason_code_name_evidence_and_timings() -> None:
    verdict = reject(Reason.PROOF_INVALID, "model", "row 3: bad chunk", row=3, chunk=1).with_timings({"model": 0.5})
    assert json.loads(verdict.to_json()) == {
        "accepted": False,
        "reason": 7,
        "reason_name": "proof_invalid",
        "check": "model",
        "detail": "row 3: bad chunk",
        "evidence": {"row": 3, "chunk": 1},
        "timings": {"model": 0.5},
    }
    assert json.loads(accept("ok", rows=2).to_json())["reason"] is None


@pytest.mark.parametrize(
    "changes",
    [
        {"async_level": -1},
        {"async_level": True},
        {"sampling_margin": -0.1},
        {"sampling_margin": float("nan")},
        {"logprob_atol": 0.0},
        {"logprob_atol": float("inf")},
        {"max_file_bytes": 0},
        {"max_rows": 0},
        {"max_tokens": 1.5},
        {"prefill_batch_size": 0},
        {"thresholds": (8, 0.1, 1.0)},
        {"grace_seconds": 0},
        {"poll_seconds": float("nan")},
        {"checkpoints_kept": 0},
        {"clock_slack": -1.0},
        {"dtype": "float16"},
        {"device": "tpu"},
    ],
    ids=lambda changes: next(iter(changes)),
)
def test_config_values_out_of_bounds_are_refused_with_the_field_name(changes: dict[str, Any]) -> None:
    name = next(iter(changes))
    with pytest.raises(ValidatorConfigError, match=f"ValidatorConfig.{name}"):
        ValidatorConfig(**changes)


def test_the_default_config_uses_the_cpu_fp32_thresholds() -> None:
    assert ValidatorConfig().thresholds == ProofThresholds.cpu_fp32()


def test_each_precision_has_its_calibrated_tolerances_and_fields_override_them() -> None:
    assert ValidatorConfig.for_precision("float32") == ValidatorConfig()
    bf16 = ValidatorConfig.for_precision("bfloat16")
    assert (bf16.dtype, bf16.thresholds) == ("bfloat16", ProofThresholds.bf16())
    fp32 = ValidatorConfig()
    assert bf16.logprob_atol > fp32.logprob_atol and bf16.sampling_margin > fp32.sampling_margin
    assert ValidatorConfig.for_precision("bfloat16", logprob_atol=0.5, device="cuda:1").logprob_atol == 0.5
    with pytest.raises(ValidatorConfigError, match=r"ValidatorConfig\.dtype"):
        ValidatorConfig.for_precision("float16")
