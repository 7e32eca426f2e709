"""The step loop over FSDP2 ranks: one model sharded across every rank under torchrun, and rank 0 alone writing.

`open_loop` is where a trainer command (`prime-train run`, `prime-train replay`) gets its `TrainingLoop`: on one
process a plain loop, under torchrun a `ShardedLoop` over the model sharded by `trainer.distributed`. Every rank
opens the same loop from the same run folder (on one machine, or a folder every rank sees); what each step trains
on is the caller's business (replay: every rank chooses from the same folder; run: rank 0 chooses and tells the
others, `trainer.ranks`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.model.loading import LoadedModel, load_model
from protocol.tasks.sources import TaskSource
from protocol.tasks.spec import TaskSpec
from trainer.learner import Learner, LearnerConfig, World
from trainer.loop import RunPaths, TrainingLoop
from trainer.precision import Precision


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


def open_loop(
    model: Path,
    learner_config: LearnerConfig,
    precision: Precision,
    spec: TaskSpec,
    source: TaskSource,
    paths: RunPaths,
    world: World,
    **settings: Any,
) -> TrainingLoop:
    """The loop of this rank over the policy in `model` (float32 weights on `precision.device`, moved once);
    `settings` are `TrainingLoop`'s keyword arguments. Under torchrun (`world.size > 1`, after `init_distributed`)
    the model is sharded before the optimiser is made, and rank 0 keeps a plain CPU copy to write checkpoints."""
    loaded = load_model(model, device=precision.device)
    pad_id = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else loaded.eos_token_ids[0]
    if world.size == 1:
        learner = Learner(loaded.model, learner_config, pad_id=pad_id, precision=precision)
        return TrainingLoop(learner, loaded, spec, source, paths, **settings)
    from trainer.distributed import shard_model

    shard_model(loaded.model)
    learner = Learner(loaded.model, learner_config, pad_id=pad_id, precision=precision)  # after sharding
    # rank 0's plain copy for checkpoints stays on the CPU in float32: the gathered weights land there
    writer: LoadedModel = load_model(model) if world.rank == 0 else loaded
    own_paths = paths if world.rank == 0 else ReaderPaths(paths.root)
    return ShardedLoop(learner, writer, spec, source, own_paths, world=world, **settings)
