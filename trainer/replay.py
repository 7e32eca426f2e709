"""`prime-train replay`: GRPO on a folder of recorded rollout files, on one process or several under torchrun.

The same step loop as a live run (`trainer.loop.TrainingLoop`), with a folder of `*.parquet` files as the only
source: at policy step s it chooses unused files of steps [s - k, s] as a live run does (`TrainingLoop.select`,
freshest policy first, until it has `rollouts_per_step` completions), and stops, without waiting, when the
folder holds too few. It resumes from the newest state in the run folder, so a replay can be continued, or
re-trained from recorded accepted data with other settings.

Under torchrun every rank reads the same folder and makes the same choices (select depends on the files alone),
the learner runs sharded with FSDP2 (`trainer.distributed`), and rank 0 alone writes the run folder. Gathering
the weights and the training state is collective, so every rank takes part in each save.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from core.config import REQUIRED, Settings, held, same_as, setting, setting_of
from protocol.tasks.sources import open_source
from protocol.tasks.spec import load_task_spec
from protocol.terms import step_window
from trainer.config import DataSettings, RunSettings
from trainer.errors import TrainerError
from trainer.learner import LearnerConfig, World
from trainer.loop import RunPaths
from trainer.precision import resolve_precision
from trainer.sharded import open_loop

log = logging.getLogger(__name__)

ALL_FILES = 1 << 30  # no cap on files a step: select() stops once it has rollouts_per_step completions


class ReplayError(TrainerError):
    """The rollout folder cannot be replayed: missing, or too little data for even one step."""


@dataclass(frozen=True)
class ReplayConfig(Settings):
    """What to replay and how: `prime-train replay`'s flags, each bounded as `prime-train run` declares it
    (trainer.toml's [run] and [data]); `learner` carries the optimiser, micro-batch and async settings."""

    model: Path = setting(
        "the initial policy (Hugging Face layout); a resumed run starts from its state", default=REQUIRED
    )
    task: Path = setting(
        "task spec (TOML): its sampling temperature is the one log-probs are taken at", default=REQUIRED
    )
    rollouts: Path = setting("folder of rollout files (*.parquet), e.g. a run's inbox/", default=REQUIRED)
    run_dir: Path = setting("state, checkpoints, metrics.jsonl, trained.jsonl", default=REQUIRED)
    steps: int | None = setting_of(
        RunSettings, "steps", "train until this policy step exists; None: until the folder runs out", default=None
    )
    rollouts_per_step: int = same_as(DataSettings, "rollouts_per_step", "completions each step trains on")
    learner: LearnerConfig = held("the optimiser, micro-batch and async settings", default_factory=LearnerConfig)
    seed: int = same_as(RunSettings, "seed", "the run's seed")
    device: str = same_as(RunSettings, "device", "where it trains; under torchrun pass the same to init_distributed")
    dtype: str = same_as(RunSettings, "dtype", "the compute dtype")


@dataclass(frozen=True)
class ReplaySummary:
    start_step: int
    final_step: int
    world_size: int
    seconds: float
    stopped: str | None  # why it stopped before `steps`, or None
    last: dict[str, Any] | None  # the last step's metrics record
    run_dir: Path


def replay(
    config: ReplayConfig, world: World, *, on_step: Callable[[dict[str, Any]], None] | None = None
) -> ReplaySummary:
    """Trains on `config.rollouts` until policy step `config.steps` or until the folder runs out of data.

    Call it on every rank with the same config; `on_step` runs on rank 0 after each step. Raises `ReplayError`
    when the folder is missing or cannot fill even the first step.
    """
    started = time.monotonic()
    if not config.rollouts.is_dir():
        raise ReplayError(f"no rollout folder at {config.rollouts}")
    torch.manual_seed(config.seed)
    spec = load_task_spec(config.task)
    source = open_source(spec)
    precision = resolve_precision(config.device, config.dtype)  # after init_distributed: cuda is the rank's GPU
    log.info("rank %d: %s", world.rank, precision.describe())
    learner_config = replace(config.learner, temperature=spec.sampling.temperature or 1.0, seed=config.seed)
    settings: dict[str, Any] = {"rollouts_per_step": config.rollouts_per_step, "max_files_per_step": ALL_FILES}
    paths = RunPaths(config.run_dir)
    loop = open_loop(config.model, learner_config, precision, spec, source, paths, world, **settings)
    learner = loop.learner
    loop.resume()
    start_step = learner.step
    last: dict[str, Any] | None = None
    stopped: str | None = None
    while config.steps is None or learner.step < config.steps:
        selection = loop.select(sorted(config.rollouts.glob("*.parquet")))
        if selection.rows < config.rollouts_per_step:
            window = step_window(learner.step, learner_config.async_level)
            stopped = (
                f"policy step {learner.step} needs {config.rollouts_per_step} completions of steps "
                f"[{max(window.oldest, 0)}, {learner.step}]; {config.rollouts} has {selection.rows} left"
            )
            break
        last = loop.train(selection.files, idle_seconds=0.0)
        if on_step is not None and world.rank == 0:
            on_step(last)
    if learner.step == start_step and stopped is not None:
        raise ReplayError(f"nothing to train on: {stopped}")
    if stopped is not None:
        log.warning("stopped: %s", stopped)
    return ReplaySummary(
        start_step=start_step,
        final_step=learner.step,
        world_size=world.size,
        seconds=time.monotonic() - started,
        stopped=stopped,
        last=last,
        run_dir=config.run_dir,
    )
