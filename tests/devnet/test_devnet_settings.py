"""`prime-devnet up` refuses settings it cannot run with one line, before it starts anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from devnet.cli import app


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "1", "--cheater"], "--cheater needs at least 2 workers"),
        (["--model", "no-such-model"], "is not a model folder"),
    ],
)
def test_settings_it_cannot_run_are_refused_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["up", "--dir", str(tmp_path / "run"), *args])
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run" / "logs").exists()  # nothing was started


def test_the_trainer_toml_it_writes_loads_to_its_settings(tmp_path: Path) -> None:
    """The devnet builds trainer.toml as `TrainerSettings` and writes it with `to_toml`: no key spelled by hand."""
    from devnet.network import Devnet, DevnetSettings
    from trainer.config import load_run_config

    settings = DevnetSettings(root=tmp_path, workers=2, steps=7, minutes=2.5, async_level=1, lr=2e-4)
    devnet = Devnet(settings, lambda _: None, lambda _: None)
    devnet.pool_id = 3
    devnet._write_trainer_config(tmp_path / "model", api_port=8611, origin_port=8711)
    config = load_run_config(tmp_path / "trainer.toml")
    assert (config.run_dir, config.model, config.task) == (tmp_path / "run", tmp_path / "model", settings.task)
    assert (config.steps, config.max_minutes, config.serve_after, config.train_threads) == (7, 2.5, True, 1)
    assert (config.learner.async_level, config.learner.lr, config.learner.vector_lr_scale) == (1, 2e-4, 10.0)
    assert (config.api.prompts_per_task, config.api.group_size, config.rollouts_per_step) == (16, 8, 256)
    assert (config.api_port, config.shardcast_port, config.keep_versions) == (8611, 8711, 4)
    assert config.pool is not None and (config.pool.id, config.pool.deployment) == (3, tmp_path / "deployment.json")
