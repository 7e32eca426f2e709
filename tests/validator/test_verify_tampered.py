"""Acceptance 2: every known way of cheating is rejected, with its reason code, by the check meant to catch it.

Tampered files are honest files whose rows or metadata were changed and then re-encoded with
`encode_rollouts`, so the format stays valid and only the targeted check can catch the change.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

import pytest

from engine.generate import Generated
from engine.model.loading import LoadedModel
from engine.proofs import num_chunks
from ledger.types import Reason
from protocol.rollouts import RolloutRow, SamplingMeta, encode_rollouts, work_units
from protocol.tasks.spec import TaskSpec, spec_hash
from validator.checks import names_another_node
from validator.config import ValidatorConfig
from validator.verdict import Verdict

OTHER_NODE = "0xFFcf8FDEE72ac11b5c542428B35EEF5769C409f0"


@pytest.fixture(scope="module")
def honest(generate: Callable[..., Generated]) -> Generated:
    """16 rows: 4 prompts x 4 samples, generated in one batch of 16 at step 5."""
    return generate(counter=7, prompts=4, group=4, step=5)


def _encode(generated: Generated, rows: list[RolloutRow] | None = None, **meta: Any) -> bytes:
    return encode_rollouts(dataclasses.replace(generated.meta, **meta), generated.rows if rows is None else rows)


def _replace_row(generated: Generated, index: int, **changes: Any) -> list[RolloutRow]:
    rows = list(generated.rows)
    rows[index] = dataclasses.replace(rows[index], **changes)
    return rows


def _first_row(generated: Generated, predicate: Callable[[RolloutRow], bool]) -> int:
    index = next((i for i, row in enumerate(generated.rows) if predicate(row)), None)
    assert index is not None, "the honest file has no row of the kind this test needs"
    return index


def _other_token(token: int, eos_token_ids: tuple[int, ...]) -> int:
    """A different id that is no EOS, so the finish reason stays consistent."""
    candidate = token + 1
    while candidate in eos_token_ids or candidate < 3:
        candidate += 1
    return candidate


def _rejected(verdict: Verdict, reason: Reason, check: str) -> None:
    assert not verdict.accepted, verdict.to_json()
    assert (verdict.reason, verdict.check) == (reason, check), verdict.to_json()


def test_the_untampered_file_is_accepted(honest: Generated, verify: Callable[..., Verdict]) -> None:
    data = _encode(honest)
    verdict = verify(data, work_key=hashlib.sha256(data).digest(), units=work_units(honest.rows), current_step=5)
    assert verdict.accepted, verdict.to_json()
    assert list(verdict.timings) == [
        "size", "work_key", "format", "metadata", "assignment", "step", "sampling_sanity", "rewards", "model"
    ]  # fmt: skip


def test_a_changed_middle_output_token_fails_the_proof(
    honest: Generated, verify: Callable[..., Verdict], checkpoint: LoadedModel
) -> None:
    index = _first_row(honest, lambda row: len(row.output_tokens) >= 8)
    tokens = list(honest.rows[index].output_tokens)
    middle = len(tokens) // 2
    tokens[middle] = _other_token(tokens[middle], checkpoint.eos_token_ids)
    verdict = verify(_encode(honest, _replace_row(honest, index, output_tokens=tokens)))
    _rejected(verdict, Reason.PROOF_INVALID, "model")
    assert verdict.evidence["row"] == index
    assert verdict.evidence["chunk"] == (middle + 1) // 32  # the next token's hidden state is the first to differ


def test_a_changed_last_output_token_fails_the_sampling_recheck(
    honest: Generated, verify: Callable[..., Verdict], checkpoint: LoadedModel
) -> None:
    """The last token's own hidden state does not depend on it, so only the seeded sampler can catch it."""
    index = _first_row(honest, lambda row: row.finish_reason == "length")
    tokens = list(honest.rows[index].output_tokens)
    tokens[-1] = _other_token(tokens[-1], checkpoint.eos_token_ids)
    verdict = verify(_encode(honest, _replace_row(honest, index, output_tokens=tokens)))
    _rejected(verdict, Reason.INVALID_SAMPLING, "model")
    assert (verdict.evidence["row"], verdict.evidence["position"]) == (index, len(tokens) - 1)


def test_a_stop_row_whose_eos_was_replaced_fails_sampling_sanity(
    honest: Generated, verify: Callable[..., Verdict], checkpoint: LoadedModel
) -> None:
    index = _first_row(honest, lambda row: row.finish_reason == "stop")
    tokens = list(honest.rows[index].output_tokens)
    tokens[-1] = _other_token(tokens[-1], checkpoint.eos_token_ids)
    verdict = verify(_encode(honest, _replace_row(honest, index, output_tokens=tokens)))
    _rejected(verdict, Reason.INVALID_SAMPLING, "sampling_sanity")


def test_an_output_token_outside_the_vocabulary_fails_sampling_sanity(
    honest: Generated, verify: Callable[..., Verdict], checkpoint: LoadedModel
) -> None:
    tokens = list(honest.rows[0].output_tokens)
    tokens[0] = checkpoint.vocab_size
    verdict = verify(_encode(honest, _replace_row(honest, 0, output_tokens=tokens)))
    _rejected(verdict, Reason.INVALID_SAMPLING, "sampling_sanity")


def test_a_bent_logprob_fails_the_logprob_recheck(honest: Generated, verify: Callable[..., Verdict]) -> None:
    logprobs = list(honest.rows[3].output_logprobs)
    logprobs[0] += 0.01  # a trainer would weigh this token's update differently
    verdict = verify(_encode(honest, _replace_row(honest, 3, output_logprobs=logprobs)))
    _rejected(verdict, Reason.INVALID_SAMPLING, "model")
    assert (verdict.evidence["row"], verdict.evidence["position"]) == (3, 0)


@pytest.mark.parametrize("model", ["m1", "m0_step"], ids=["other-init-seed", "one-more-training-step"])
def test_a_file_from_another_model_that_says_so_is_rejected_by_its_model_hash(
    model: str, generate: Callable[..., Generated], verify: Callable[..., Verdict], checkpoint: LoadedModel
) -> None:
    generated = generate(counter=7, prompts=2, group=2, model=model)
    verdict = verify(_encode(generated))
    _rejected(verdict, Reason.PROOF_INVALID, "model")
    assert verdict.evidence["checkpoint"] == "0x" + checkpoint.model_hash.hex()


@pytest.mark.parametrize("model", ["m1", "m0_step"], ids=["other-init-seed", "one-more-training-step"])
def test_a_file_from_another_model_that_claims_the_checkpoint_fails_the_proofs(
    model: str, generate: Callable[..., Generated], verify: Callable[..., Verdict], checkpoint: LoadedModel
) -> None:
    generated = generate(counter=7, prompts=2, group=2, model=model)
    verdict = verify(_encode(generated, model_hash=checkpoint.model_hash))
    _rejected(verdict, Reason.PROOF_INVALID, "model")
    assert verdict.evidence["row"] == 0 and verdict.evidence["chunk"] == 0
    print(f"\n{model}: {verdict.detail}; {verdict.evidence}")


def test_a_temperature_claimed_but_not_used_fails_the_sampling_recheck(
    generate: Callable[..., Generated], verify: Callable[..., Verdict], task_spec: TaskSpec
) -> None:
    """Sampled at T=0.7 (sharper, so higher rewards) while the file claims the task's T=1.0."""
    cooler = dataclasses.replace(task_spec, sampling=dataclasses.replace(task_spec.sampling, temperature=0.7))
    generated = generate(counter=8, prompts=2, group=2, spec=cooler)
    claimed = SamplingMeta(temperature=1.0, top_p=task_spec.sampling.top_p, max_tokens=task_spec.sampling.max_tokens)
    verdict = verify(_encode(generated, sampling=claimed, task_spec_hash=spec_hash(task_spec)))
    _rejected(verdict, Reason.INVALID_SAMPLING, "model")


def test_a_faked_reward_is_rejected(honest: Generated, verify: Callable[..., Verdict]) -> None:
    row = honest.rows[2]
    faked = _replace_row(honest, 2, reward=row.reward + 1.0, task_reward=row.task_reward + 1.0)
    verdict = verify(_encode(honest, faked))
    _rejected(verdict, Reason.REWARD_MISMATCH, "rewards")
    assert (verdict.evidence["row"], verdict.evidence["field"]) == (2, "reward")


def test_a_problem_outside_the_assignment_is_rejected(honest: Generated, verify: Callable[..., Verdict]) -> None:
    rows = [
        dataclasses.replace(row, problem_id="basic_arithmetic/9999") if row.group == 1 else row for row in honest.rows
    ]
    verdict = verify(_encode(honest, rows))
    _rejected(verdict, Reason.WRONG_ASSIGNMENT, "assignment")
    assert verdict.evidence["field"] == "problem_id"


def test_a_prompt_altered_after_generation_is_rejected(honest: Generated, verify: Callable[..., Verdict]) -> None:
    prompt = list(honest.rows[5].input_tokens)
    prompt[10] = prompt[10] + 1
    verdict = verify(_encode(honest, _replace_row(honest, 5, input_tokens=prompt)))
    _rejected(verdict, Reason.WRONG_ASSIGNMENT, "assignment")
    assert (verdict.evidence["row"], verdict.evidence["position"]) == (5, 10)


def test_rerolled_seeds_are_rejected(honest: Generated, verify: Callable[..., Verdict]) -> None:
    verdict = verify(_encode(honest, _replace_row(honest, 1, seed=honest.rows[1].seed + 1)))
    _rejected(verdict, Reason.WRONG_ASSIGNMENT, "assignment")


def test_a_dropped_sample_leaves_unequal_groups_and_is_rejected(
    honest: Generated, verify: Callable[..., Verdict]
) -> None:
    verdict = verify(_encode(honest, honest.rows[:-1]))
    _rejected(verdict, Reason.WRONG_ASSIGNMENT, "assignment")


@pytest.mark.parametrize("current_step", [8, 4], ids=["stale", "from-the-future"])
def test_a_step_outside_the_async_window_is_rejected(
    current_step: int, honest: Generated, verify: Callable[..., Verdict]
) -> None:
    verdict = verify(_encode(honest), current_step=current_step)  # the file is from step 5; async level 2
    _rejected(verdict, Reason.STALE_STEP, "step")
    assert verdict.borderline  # the current step is nobody's signed word: refused unpaid, never slashed (issue 32)


def test_rows_from_different_steps_are_rejected(honest: Generated, verify: Callable[..., Verdict]) -> None:
    verdict = verify(_encode(honest, _replace_row(honest, 4, step=4)))
    _rejected(verdict, Reason.BAD_FORMAT, "metadata")


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_file_is_rejected_as_bad_format(
    damage: str, honest: Generated, verify: Callable[..., Verdict]
) -> None:
    data = bytearray(_encode(honest))
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:
        middle = len(data) // 2
        data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    verdict = verify(bytes(data))
    _rejected(verdict, Reason.BAD_FORMAT, "format")


def test_proofs_swapped_between_rows_are_rejected(honest: Generated, verify: Callable[..., Verdict]) -> None:
    """Two rows with the same number of chunks, so the proofs are well-formed and toploc must compare them."""
    chunks = [num_chunks(len(row.output_tokens)) for row in honest.rows]
    a, b = next((i, j) for i in range(len(chunks)) for j in range(i + 1, len(chunks)) if chunks[i] == chunks[j])
    rows = _replace_row(honest, a, proofs=honest.rows[b].proofs)
    rows[b] = dataclasses.replace(rows[b], proofs=honest.rows[a].proofs)
    verdict = verify(_encode(honest, rows))
    _rejected(verdict, Reason.PROOF_INVALID, "model")
    assert verdict.evidence["row"] == a and "exp_mismatches" in verdict.evidence


def test_inflated_units_are_rejected(honest: Generated, verify: Callable[..., Verdict]) -> None:
    verdict = verify(_encode(honest), units=work_units(honest.rows) + 1)
    _rejected(verdict, Reason.BAD_FORMAT, "metadata")
    assert verdict.evidence["field"] == "units"


def test_a_file_naming_another_node_than_its_submitter_is_rejected(
    honest: Generated, verify: Callable[..., Verdict]
) -> None:
    verdict = verify(_encode(honest), node=OTHER_NODE)
    _rejected(verdict, Reason.BAD_FORMAT, "metadata")
    assert verdict.evidence["field"] == "node"
    # a squatter's record of another node's key: invalidated on chain, but no attestation is posted on the file
    assert names_another_node(verdict.check, verdict.detail)
    assert not names_another_node(verify(_encode(honest), pool_id=1).check, verify(_encode(honest), pool_id=1).detail)


def test_a_file_for_another_pool_is_rejected(honest: Generated, verify: Callable[..., Verdict]) -> None:
    verdict = verify(_encode(honest), pool_id=1)
    _rejected(verdict, Reason.BAD_FORMAT, "metadata")


def test_a_file_scored_with_another_task_spec_is_rejected(honest: Generated, verify: Callable[..., Verdict]) -> None:
    verdict = verify(_encode(honest, task_spec_hash=b"\x01" * 32))
    _rejected(verdict, Reason.BAD_FORMAT, "metadata")


def test_sampling_claims_other_than_the_task_are_rejected(honest: Generated, verify: Callable[..., Verdict]) -> None:
    verdict = verify(_encode(honest, sampling=SamplingMeta(temperature=0.7, top_p=1.0, max_tokens=64)))
    _rejected(verdict, Reason.BAD_FORMAT, "metadata")


def test_bytes_other_than_the_submitted_work_key_are_rejected(
    honest: Generated, verify: Callable[..., Verdict]
) -> None:
    verdict = verify(_encode(honest), work_key=hashlib.sha256(b"something else").digest())
    _rejected(verdict, Reason.HASH_MISMATCH, "work_key")


def test_a_file_over_the_size_limit_is_refused_unread(honest: Generated, verify: Callable[..., Verdict]) -> None:
    data = _encode(honest)
    verdict = verify(data, ValidatorConfig(max_file_bytes=len(data) - 1), work_key=hashlib.sha256(data).digest())
    _rejected(verdict, Reason.BAD_FORMAT, "size")
