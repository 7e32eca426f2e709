"""A checkpoint whose LM head is padded past its tokenizer's ids, as a real Qwen's is: the validator recomputes over
the same ids the worker sampled, accepts an honest file, and rejects a padded id as outside the vocabulary."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from engine.generate import Generated, generate_rollouts
from engine.inference.torch_backend import TorchBackend
from engine.model.loading import LoadedModel, load_model
from ledger.types import Reason
from node.daemon.faults import Fault, falsify
from protocol.plan import Job
from protocol.rollouts import RolloutRow, encode_rollouts
from protocol.tasks.sources import TaskSource
from protocol.tasks.spec import TaskSpec
from tests.padded_vocabulary import PADDING, padded_tiny_model
from validator import recompute
from validator.checks import SAMPLING_SANITY
from validator.config import ValidatorConfig
from validator.verdict import Outcome, Verdict
from validator.verify import Expected, verify_file

NODE = "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1"


@pytest.fixture(scope="module")
def padded_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return padded_tiny_model(tmp_path_factory.mktemp("padded") / "model")


@pytest.fixture(scope="module")
def checkpoint(padded_dir: Path) -> LoadedModel:
    """The validator's copy."""
    return load_model(padded_dir)


@pytest.fixture(scope="module")
def honest(padded_dir: Path, task_spec: TaskSpec, task_source: TaskSource) -> Generated:
    worker = load_model(padded_dir)  # the worker's own copy
    job = Job(pool_id=0, node=NODE, step=0, counter=5, prompts=4, group_size=4)
    return generate_rollouts(job, task_spec, task_source, worker, TorchBackend.from_loaded(worker))


def _verify(data: bytes, checkpoint: LoadedModel, spec: TaskSpec, source: TaskSource) -> Verdict:
    expected = Expected(work_key=None, node=NODE, pool_id=0, units=None, current_step=0)
    return verify_file(
        data, spec=spec, checkpoint=checkpoint, config=ValidatorConfig(), expected=expected, source=source
    )


def _with_token(rows: list[RolloutRow], token: int, *, last: bool) -> tuple[list[RolloutRow], int]:
    """The rows with the last or the middle output token of the first row of 3 or more changed to `token`; its index.

    The last is never fed back, so no hidden state a proof commits to changes; the middle is the tamper fault's."""
    index = next(i for i, r in enumerate(rows) if len(r.output_tokens) >= 3)
    tokens = list(rows[index].output_tokens)
    tokens[-1 if last else len(tokens) // 2] = token
    changed = list(rows)
    changed[index] = dataclasses.replace(rows[index], output_tokens=tokens)
    return changed, index


def test_an_honest_file_from_a_padded_head_is_accepted(
    honest: Generated, checkpoint: LoadedModel, task_spec: TaskSpec, task_source: TaskSource
) -> None:
    assert max(t for row in honest.rows for t in row.output_tokens) < checkpoint.sampled_vocab_size
    verdict = _verify(encode_rollouts(honest.meta, honest.rows), checkpoint, task_spec, task_source)
    assert verdict.accepted, verdict.to_json()


@pytest.mark.parametrize("past", [0, PADDING - 1], ids=["first-padded-row", "last-padded-row"])
def test_a_padded_id_is_rejected_as_outside_the_vocabulary(
    honest: Generated, checkpoint: LoadedModel, task_spec: TaskSpec, task_source: TaskSource, past: int
) -> None:
    """An id the LM head has a row for and the tokenizer has not: the vocabulary check's reason, slashable."""
    token = checkpoint.sampled_vocab_size + past
    assert token < checkpoint.vocab_size
    rows, index = _with_token(honest.rows, token, last=True)
    verdict = _verify(encode_rollouts(honest.meta, rows), checkpoint, task_spec, task_source)
    assert verdict.outcome is Outcome.SLASHABLE and verdict.reason == Reason.INVALID_SAMPLING, verdict.to_json()
    assert verdict.check == SAMPLING_SANITY and verdict.evidence["row"] == index, verdict.to_json()
    assert f"output token {token} is outside the vocabulary" in verdict.detail
    # the recomputation, which never runs for such a file, says the same: it reads the same 263 logits
    model = recompute.check_model(rows, honest.meta, checkpoint, ValidatorConfig())
    assert isinstance(model, Verdict) and model.reason == Reason.INVALID_SAMPLING, model
    assert f"token {token} is outside the vocabulary [0, {checkpoint.sampled_vocab_size})" in model.detail


def test_the_tamper_fault_changes_a_token_into_another_real_id(
    honest: Generated, checkpoint: LoadedModel, task_spec: TaskSpec, task_source: TaskSource
) -> None:
    """The worker's backend bounds it by the ids it samples, so the cheater it simulates is caught by the recheck
    of the seeded choice, not by the cheaper vocabulary check."""
    last = checkpoint.sampled_vocab_size - 1
    rows, _ = _with_token(honest.rows, last, last=False)  # + 1 is a padded id if the fault were bounded by rows
    bound = TorchBackend.from_loaded(checkpoint).vocab_size
    tampered = falsify(Fault.TAMPER_TOKENS, rows, vocab_size=bound, async_level=2)
    assert max(t for row in tampered for t in row.output_tokens) < checkpoint.sampled_vocab_size
    verdict = _verify(encode_rollouts(honest.meta, tampered), checkpoint, task_spec, task_source)
    assert not verdict.accepted and "outside the vocabulary" not in verdict.detail, verdict.to_json()
