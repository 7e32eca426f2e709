"""A validator judges a pool's files only in the pool's precision (its task's sampling.dtype): another precision's
tolerances would fail honest files or pass cheating ones, so every mismatch is refused before any verdict."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.generate import Generated
from engine.model.loading import load_model
from protocol.rollouts import encode_rollouts
from protocol.tasks.spec import TaskSpec
from validator.config import ValidatorConfig, ValidatorConfigError
from validator.verdict import Verdict
from validator.verify import verify_file


def test_a_config_of_another_precision_than_the_task_is_refused_not_applied(
    generate: Callable[..., Generated], verify: Callable[..., Verdict]
) -> None:
    generated = generate(counter=1, prompts=1, group=2)
    data = encode_rollouts(generated.meta, generated.rows)
    assert verify(data).accepted  # the float32 task's own tolerances
    with pytest.raises(ValidatorConfigError, match=r"sampling\.dtype = 'float32'"):
        verify(data, ValidatorConfig.for_precision("bfloat16"))


def test_a_checkpoint_loaded_in_another_precision_than_the_config_is_refused(
    generate: Callable[..., Generated], task_spec: TaskSpec, model_dirs: dict[str, Path]
) -> None:
    generated = generate(counter=2, prompts=1, group=2)
    data = encode_rollouts(generated.meta, generated.rows)
    held = load_model(model_dirs["m0"], dtype=torch.bfloat16)
    with pytest.raises(ValidatorConfigError, match="the checkpoint's precision too, which is bfloat16"):
        verify_file(data, spec=task_spec, checkpoint=held, config=ValidatorConfig())
