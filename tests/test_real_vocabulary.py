"""The real vocabulary through every role, in minutes on 2 cores: the 2-layer variant of Qwen2.5-0.5B's shape
(151,936 embedding rows, hidden 896, a BPE tokenizer of 8,192 ids) makes a file with proofs, the validator
accepts it, and the trainer takes a GRPO step on it. What the tiny model's 263-id vocabulary hides (the memory and
the cost of 151,936-wide logits, ids the tokenizer cannot produce) runs here on every CI run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from engine.generate import generate_rollouts
from engine.inference.torch_backend import TorchBackend
from engine.model.loading import LoadedModel, load_model
from engine.model.shapes import QWEN25_05B
from engine.model.tiny import init_model
from protocol.plan import Job
from protocol.rollouts import encode_rollouts, read_rollouts
from protocol.rollouts.reader import RolloutFile
from protocol.tasks.sources import open_source
from protocol.tasks.spec import load_task_spec
from trainer.learner import Learner, LearnerConfig
from validator.config import ValidatorConfig
from validator.verify import Expected, verify_file

TASK = Path(__file__).resolve().parents[1] / "configs" / "tasks" / "default.toml"
NODE = "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    shape = dataclasses.replace(QWEN25_05B.with_layers(2), dtype="float32")  # the default task's precision
    path = init_model(tmp_path_factory.mktemp("real") / "model", seed=0, shape=shape, specs=[load_task_spec(TASK)])
    return load_model(path)


def test_a_real_vocabulary_file_is_made_proven_verified_and_trained_on(loaded: LoadedModel, tmp_path: Path) -> None:
    spec = load_task_spec(TASK)
    source = open_source(spec)
    assert loaded.vocab_size == 151_936 and len(loaded.tokenizer) == 8_192
    job = Job(pool_id=0, node=NODE, step=0, counter=0, prompts=2, group_size=4)
    generated = generate_rollouts(job, spec, source, loaded, TorchBackend.from_loaded(loaded, max_batch_size=8))
    data = encode_rollouts(generated.meta, generated.rows)
    assert all(max(row.output_tokens) < len(loaded.tokenizer) for row in generated.rows), "an id no text has"
    expected = Expected(work_key=None, node=NODE, pool_id=0, units=None, current_step=0)
    verdict = verify_file(
        data, spec=spec, checkpoint=loaded, config=ValidatorConfig(), expected=expected, source=source
    )
    assert verdict.accepted, verdict
    path = tmp_path / "file.parquet"
    path.write_bytes(data)
    honest = read_rollouts(path, max_bytes=1 << 26)
    # a random model scores 0 everywhere, so no group would carry a gradient: give each group mixed rewards
    rows = [dataclasses.replace(r, reward=float(i % 2), task_reward=float(i % 2)) for i, r in enumerate(honest.rows)]
    mixed = RolloutFile(honest.meta, rows, honest.work_key, honest.size)
    before = [p.detach().clone() for p in loaded.model.parameters()]
    learner = Learner(loaded.model, LearnerConfig(lr=1e-4, warmup_steps=0), pad_id=loaded.tokenizer.pad_token_id or 0)
    stats = learner.train_step([mixed])
    assert stats.step == 1 and stats.groups_kept == 2 and stats.trained_tokens > 0
    assert torch.isfinite(torch.tensor(stats.loss)) and stats.mean_ratio == pytest.approx(1.0, abs=1e-4)
    assert any(not torch.equal(p, b) for p, b in zip(loaded.model.parameters(), before, strict=True))
