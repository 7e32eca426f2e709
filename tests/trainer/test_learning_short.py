"""The short version of benchmarks/learning.py: local mode from a briefly warm-started model moves the weights, and
the last step's update lowers the GRPO loss on the files it was trained on (with the same old log-probs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.model.loading import load_model
from engine.model.tiny import init_model, save_model_dir
from protocol.rollouts import read_rollouts
from protocol.tasks.sources import open_source
from protocol.tasks.spec import load_task_spec
from trainer.config import (
    CoordinatorSettings,
    DataSettings,
    LocalSettings,
    RunSettings,
    ShardcastSettings,
    TrainerSettings,
)
from trainer.data import build_samples, collate
from trainer.grpo import GRPOConfig, group_advantages, grpo_token_loss
from trainer.learner import OptimConfig
from trainer.sft import SFTConfig, run_sft

REPO = Path(__file__).parents[2]
TASK = REPO / "configs" / "tasks" / "default.toml"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short SFT: enough for a few correct answers at temperature 1, so some groups have mixed rewards."""
    root = tmp_path_factory.mktemp("short")
    loaded = load_model(init_model(root / "tiny", seed=0))
    spec = load_task_spec(TASK)
    run_sft(loaded, spec, open_source(spec), SFTConfig(steps=200, batch_size=32, lr=3e-3, holdout=256))
    return save_model_dir(loaded.model, loaded.tokenizer, root / "warm")


def loss_under(model_dir: Path, files: list[Path], old_dir: Path) -> float:
    """The GRPO loss of `files` under the weights in `model_dir`, old log-probs from the weights in `old_dir`."""
    samples = build_samples(
        [read_rollouts(f, max_bytes=1 << 26) for f in files],
        lambda r: group_advantages(torch.tensor(r)).tolist(),
    ).samples
    model, old = load_model(model_dir), load_model(old_dir)
    batch = collate(samples, model.tokenizer.pad_token_id or 0)

    def logprobs(m: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad():
            logits = m(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        return torch.log_softmax(logits.float(), -1).gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)

    out = grpo_token_loss(logprobs(model.model), logprobs(old.model), batch.advantages, batch.loss_mask, GRPOConfig())
    return float(out.loss)


def test_local_mode_moves_the_weights_and_lowers_the_loss_of_its_last_step(tmp_path: Path, warm_model: Path) -> None:
    config = tmp_path / "trainer.toml"
    settings = TrainerSettings(
        run=RunSettings(dir=tmp_path / "run", model=warm_model, task=TASK, steps=4, threads=1),
        data=DataSettings(async_level=0, rollouts_per_step=128),
        optim=OptimConfig(lr=1e-4, warmup_steps=0),
        coordinator=CoordinatorSettings(port=0, prompts_per_task=8, group_size=8),
        shardcast=ShardcastSettings(port=0),
        local=LocalSettings(workers=2),
    )
    config.write_text(settings.to_toml())
    subprocess.run(
        [sys.executable, "-m", "trainer.cli", "run", "--config", str(config), "--json"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=300,
        env=os.environ | {"OMP_NUM_THREADS": "1", "PRIME_KEYSTORE_PASSWORD": "learning-short-test"},  # local keystores
    )
    run = tmp_path / "run"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert sum(m["trained_tokens"] for m in metrics) > 0, "no group had mixed rewards: nothing was learned from"
    last = json.loads((run / "trained.jsonl").read_text().splitlines()[-1])
    files = [run / "inbox" / f"{key.removeprefix('0x')}.parquet" for key in last["work_keys"]]
    before, after = run / "checkpoints" / "step_3", run / "checkpoints" / "step_4"
    changed = [
        not torch.equal(a, b)
        for a, b in zip(load_model(before).model.parameters(), load_model(after).model.parameters(), strict=True)
    ]
    assert any(changed)
    if metrics[-1]["trained_tokens"]:  # k = 0: the last step's files came from policy 3, the weights in `before`
        assert loss_under(after, files, before) < loss_under(before, files, before)
