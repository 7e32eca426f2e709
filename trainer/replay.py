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
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from node.model.loading import LoadedModel, load_model
from node.tasks.sources import open_source
from node.tasks.spec import load_task_spec
from node.terms import step_window
from trainer.errors import TrainerError
from trainer.learner import Learner, LearnerConfig, World
from trainer.loop import RunPaths, TrainingLoop
from trainer.precision import DEVICES, DTYPES, check_choice, resolve_precision

log = logging.getLogger(__name__)

ALL_FILES = 1 << 30  # no cap on files a step: select() stops once it has rollouts_per_step completions


class ReplayError(TrainerError):
    """The rollout folder cannot be replayed: missing, or too little data for even one step."""


@dataclass(frozen=True)
class ReplayConfig:
    """What to replay and how; `learner` carries the optimiser, micro-batch and async settings."""

    model: Path  # the initial policy (Hugging Face layout); a resumed run starts from its saved state instead
    task: Path  # task spec (TOML): its sampling temperature is the one the log-probs are taken at
    rollouts: Path  # folder of rollout files (*.parquet), e.g. a run's inbox/
    run_dir: Path  # state, checkpoints, metrics.jsonl, trained.jsonl
    steps: int | None = None  # train until this policy step exists; None: until the folder runs out
    rollouts_per_step: int = 256  # completions each step trains on, as `prime-train run`
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    seed: int = 0
    device: str = "auto"  # trainer.precision.DEVICES; under torchrun pass the same to init_distributed
    dtype: str = "auto"  # the compute dtype, trainer.precision.DTYPES

    def __post_init__(self) -> None:
        check_choice("device", self.device, DEVICES)
        check_choice("dtype", self.dtype, DTYPES)
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be at least 1, got {self.steps}")
        if self.rollouts_per_step < 1:
            raise ValueError(f"rollouts_per_step must be at least 1, got {self.rollouts_per_step}")


@dataclass(frozen=True)
class ReplaySummary:
    start_step: int
    final_step: int
    world_size: int
    seconds: float
    stopped: str | None  # why it stopped before `steps`, or None
    last: dict[str, Any] | None  # the last step's metrics record
    run_dir: Path


@dataclass(frozen=True)
class ReaderPaths(RunPaths):
    """The run folder as a rank other than 0 sees it: states to resume from, but its log lines go nowhere."""

    @property
    def metrics(self) -> Path:
        return Path(os.devnull)

    @property
    def trained(self) -> Path:
        return Path(os.devnull)


class ShardedLoop(TrainingLoop):
    """A `TrainingLoop` that every rank runs over one FSDP2-sharded learner; rank 0 alone writes files.

    On rank 0 `loaded` holds a plain, unsharded copy of the model, brought up to date from the gathered weights
    before each checkpoint; the other ranks never save it. Held-out evaluation is not supported (it would sample
    from the copy on rank 0 alone), so `eval_every` stays 0.
    """

    def __init__(self, *args: Any, world: World, **kwargs: Any) -> None:
        if kwargs.get("eval_every"):
            raise ValueError("a sharded loop does not evaluate: leave eval_every at 0")
        super().__init__(*args, **kwargs)
        self.world = world

    def save_checkpoint(self) -> Path:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0 only
        full = get_model_state_dict(self.learner.model, options=options)  # collective: every rank gathers
        if self.world.rank != 0:
            return self.paths.checkpoint(self.learner.step)
        self.loaded.model.load_state_dict(full)
        return super().save_checkpoint()

    def save_state(self) -> Path:
        if self.world.rank == 0:
            return super().save_state()
        self.learner.state_dict()  # collective: takes part in the gathering rank 0 does inside save_state
        return self.paths.state / f"step_{self.learner.step}.pt"


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
    loaded = load_model(config.model, device=precision.device)  # float32 weights, moved once
    learner_config = replace(config.learner, temperature=spec.sampling.temperature or 1.0, seed=config.seed)
    pad_id = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else loaded.eos_token_ids[0]
    paths = RunPaths(config.run_dir)
    settings: dict[str, Any] = {"rollouts_per_step": config.rollouts_per_step, "max_files_per_step": ALL_FILES}
    loop: TrainingLoop
    if world.size == 1:
        learner = Learner(loaded.model, learner_config, pad_id=pad_id, precision=precision)
        loop = TrainingLoop(learner, loaded, spec, source, paths, **settings)
    else:
        from trainer.distributed import shard_model

        shard_model(loaded.model)
        learner = Learner(loaded.model, learner_config, pad_id=pad_id, precision=precision)  # after sharding
        # rank 0's plain copy for checkpoints stays on the CPU in float32: the gathered weights land there
        writer: LoadedModel = load_model(config.model) if world.rank == 0 else loaded
        own_paths = paths if world.rank == 0 else ReaderPaths(config.run_dir)
        loop = ShardedLoop(learner, writer, spec, source, own_paths, world=world, **settings)
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
