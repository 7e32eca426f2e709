"""Each `prime-node start --simulate-fault` makes the file its cheater would upload, and the validator rejects it
with the reason docs/worker.md names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from engine.generate import Generated, generate_rollouts
from engine.inference.torch_backend import TorchBackend
from engine.model.loading import LoadedModel, load_model
from ledger.types import Reason
from node.daemon.faults import Fault, falsify, perturb_weights
from protocol.plan import Job
from protocol.rollouts import encode_rollouts
from protocol.tasks.sources import TaskSource
from protocol.tasks.spec import TaskSpec
from validator.verdict import Verdict

STEP = 5
NODE = "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1"  # the node the conftest's files are for


@pytest.fixture(scope="module")
def honest(generate: Callable[..., Generated]) -> Generated:
    return generate(counter=3, prompts=2, group=4, step=STEP)


def cheat(honest: Generated, fault: Fault, vocab_size: int) -> bytes:
    rows = falsify(fault, honest.rows, vocab_size=vocab_size, async_level=2)
    return encode_rollouts(honest.meta, rows)


@pytest.mark.parametrize(
    ("fault", "reasons"),
    [
        (Fault.FAKE_REWARD, {Reason.REWARD_MISMATCH}),
        (Fault.STALE_STEP, {Reason.STALE_STEP}),
        (Fault.TAMPER_TOKENS, {Reason.INVALID_SAMPLING, Reason.PROOF_INVALID}),
    ],
)
def test_a_falsified_file_is_rejected_for_its_fault(
    honest: Generated, verify: Callable[..., Verdict], checkpoint: LoadedModel, fault: Fault, reasons: set[Reason]
) -> None:
    verdict = verify(cheat(honest, fault, vocab_size=checkpoint.vocab_size), current_step=STEP)
    assert not verdict.accepted and verdict.reason in reasons, verdict.to_json()


def test_generating_with_perturbed_weights_fails_the_model_check(
    model_dirs: dict[str, Path], task_spec: TaskSpec, task_source: TaskSource, verify: Callable[..., Verdict]
) -> None:
    loaded = load_model(model_dirs["m0"])  # the worker's own copy: the validator's stays untouched
    perturb_weights(loaded)
    job = Job(pool_id=0, node=NODE, step=STEP, counter=3, prompts=2, group_size=4)
    generated = generate_rollouts(job, task_spec, task_source, loaded, TorchBackend.from_loaded(loaded))
    verdict = verify(encode_rollouts(generated.meta, generated.rows), current_step=STEP)
    assert not verdict.accepted and verdict.check == "model", verdict.to_json()
    assert verdict.reason in {Reason.PROOF_INVALID, Reason.INVALID_SAMPLING}, verdict.to_json()
