"""How the ranks of a live run under torchrun stay together: rank 0 decides, the others follow.

Under `torchrun ... -m trainer.cli run`, rank 0 is the trainer the pool sees: it serves the coordinator API and the
SHARDCAST origin, spawns local mode's workers, and chooses each step's files (`TrainingLoop.select` over what the
coordinator accepted). The other ranks only train. Every rank runs the same `TrainingLoop.train` on the same files,
so their collectives (FSDP2's gathers and reductions, the checkpoint's and the state's gathers) line up.

Rank 0 tells the others what to do over a gloo group of its own (`Control`):
- at start, the resolved config (network mode reads the pool's terms on rank 0 alone), then every rank's newest
  saved state, which must agree before anyone resumes from it (`resume_loop`);
- one `Decision` at a time after that: "checkpoint" (write the current policy's checkpoint: a gather), "train"
  (the step's files, as paths and work keys), "wait" (nothing to train yet: sent every HEARTBEAT_SECONDS while
  rank 0 waits for data, so that a long wait never trips the collective timeout), "stop" (the last step, the
  deadline, or SIGTERM/SIGINT: torchrun forwards a signal to every rank, and the followers leave it to rank 0,
  so that all of them stop at the same step boundary).
Every decision carries rank 0's policy step; a follower at another step stops with an error instead of training
out of step. The ranks read a step's files by path, so they must see one inbox: one machine, or a folder they all
mount (the work key check refuses a file with other bytes).

A rank that dies closes its gloo connections, so the others' next collective fails at once and torchrun stops
them; a rank that hangs fails the others' collectives after `COLLECTIVE_TIMEOUT`.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

import torch.distributed as dist

from trainer.distributed import COLLECTIVE_TIMEOUT, DistributedError
from trainer.learner import World
from trainer.loop import Selection, TrainingLoop

if TYPE_CHECKING:
    from trainer.config import RunConfig

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 30.0  # at most this long between two decisions while rank 0 waits for data
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

DecisionKind = Literal["checkpoint", "train", "wait", "stop"]


@dataclass(frozen=True)
class Decision:
    """What every rank does next; `step` is rank 0's policy step when it decided."""

    kind: DecisionKind
    step: int
    files: tuple[tuple[str, bytes], ...] = ()  # "train": (path, work key) of each file, in the order trained
    idle_seconds: float = 0.0  # "train": how long rank 0 waited for the files (the step's metrics record it)


class Control:
    """Rank 0's channel to the other ranks: a gloo group of its own, so that a decision never mixes with the
    training's collectives (which may run over NCCL) and goes over the CPU wherever the model lies."""

    def __init__(self, world: World) -> None:
        if world.size < 2:
            raise DistributedError("a control group needs several ranks: one process decides alone")
        self.world = world
        self.group = dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)  # collective: every rank calls it
        self._sent = time.monotonic()

    def _broadcast(self, value: object) -> object:
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def share_config(self, config: RunConfig | None) -> RunConfig:
        """Rank 0's resolved config on every rank (the others pass None)."""
        from trainer.config import RunConfig

        shared = self._broadcast(config)
        if not isinstance(shared, RunConfig):
            raise DistributedError(f"rank 0 sent {type(shared).__name__} where its config belongs")
        return shared

    def agree(self, value: object, what: str) -> None:
        """Raises on every rank, together, unless every rank holds the same `value`."""
        values: list[object] = [None] * self.world.size
        dist.all_gather_object(values, value, group=self.group)
        if any(v != values[0] for v in values):
            by_rank = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
            raise DistributedError(f"the ranks disagree on {what} ({by_rank}): they must share the run folder")

    def send(self, decision: Decision) -> None:
        """Rank 0: every rank does `decision` next."""
        self._broadcast(decision)
        self._sent = time.monotonic()

    def receive(self) -> Decision:
        """A follower: rank 0's next decision (waits up to COLLECTIVE_TIMEOUT)."""
        decision = self._broadcast(None)
        if not isinstance(decision, Decision):
            raise DistributedError(f"rank 0 sent {type(decision).__name__} where a decision belongs")
        return decision

    def heartbeat_due(self) -> bool:
        return time.monotonic() - self._sent >= HEARTBEAT_SECONDS


# --- what every rank does the same way; `control` is None on one process --------------------------------


def resume_loop(loop: TrainingLoop, control: Control | None) -> bool:
    """`loop.resume()`, once every rank sees the same newest state: loading is collective under FSDP2, so ranks
    that resumed different steps, or one resuming while another does not, would wait on each other for ever."""
    if control is not None:
        states = loop.states()
        control.agree(states[-1][0] if states else None, "the newest training state")
    return loop.resume()


def save_checkpoint(loop: TrainingLoop, control: Control | None) -> Path:
    """Rank 0: the current policy's checkpoint, gathered from every rank."""
    if control is not None:
        control.send(Decision("checkpoint", loop.learner.step))
    return loop.save_checkpoint()


def train(loop: TrainingLoop, control: Control | None, selection: Selection, idle_seconds: float) -> dict[str, Any]:
    """Rank 0: one step on `selection`'s files, on every rank; the step's metrics record."""
    if control is not None:
        files = tuple((str(path), file.work_key) for path, file in zip(selection.paths, selection.files, strict=True))
        control.send(Decision("train", loop.learner.step, files, idle_seconds))
    return loop.train(selection.files, idle_seconds=idle_seconds)


# --- the other ranks ----------------------------------------------------------------------------------------


def follow(loop: TrainingLoop, control: Control) -> int:
    """A rank other than 0: does what rank 0 decides until it decides "stop"; returns the steps trained."""
    trained = 0
    with _signals_left_to_rank0(control.world.rank):
        while True:
            decision = control.receive()
            if decision.step != loop.learner.step:
                raise DistributedError(
                    f"rank 0 is at policy step {decision.step}, rank {control.world.rank} at {loop.learner.step}"
                )
            if decision.kind == "stop":
                return trained
            if decision.kind == "checkpoint":
                loop.save_checkpoint()
            elif decision.kind == "train":
                files = [loop.read(Path(path), key) for path, key in decision.files]
                loop.train(files, idle_seconds=decision.idle_seconds)
                trained += 1


@contextlib.contextmanager
def _signals_left_to_rank0(rank: int) -> Iterator[None]:
    """torchrun forwards SIGTERM and SIGINT to every rank. A follower that died of one mid-step would fail rank 0's
    collectives; it logs the signal instead and stops when rank 0, which got it too, decides "stop". torchrun
    kills what is still running 30 s after it forwarded the signal."""

    def note(signum: int, _frame: FrameType | None) -> None:
        log.info("rank %d: %s, stopping when rank 0 does", rank, signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, note) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
