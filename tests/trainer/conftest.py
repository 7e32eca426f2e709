"""Fixtures of the trainer's tests: the default task and a fresh tiny model, one of each per test module."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.model.tiny import init_model
from protocol.tasks.sources import TaskSource, open_source
from protocol.tasks.spec import TaskSpec, load_task_spec

DEFAULT_TASK = Path(__file__).parents[2] / "configs" / "tasks" / "default.toml"


@pytest.fixture(scope="module")
def task() -> tuple[TaskSpec, TaskSource]:
    """The default task's spec and its opened source."""
    spec = load_task_spec(DEFAULT_TASK)
    return spec, open_source(spec)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model initialised with seed 0; a module that needs another defines its own."""
    return init_model(tmp_path_factory.mktemp("model") / "tiny", seed=0)
