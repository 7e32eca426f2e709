"""The trainer's step loop, independent of where files come from: choose files, train, checkpoint, log.

At policy step s the loop trains on accepted files whose step lies in [s - k, s] (k = async level) and that no
earlier step consumed. It waits until `rollouts_per_step` completions are available (the wait is the trainer's
idle time, logged per step), then takes files, the freshest policy first (or the oldest: `order = "oldest"`), until
it has that many; the rest wait for the next step while they are inside its window. Files older than s - k are
consumed without training (logged as stale), so a slow worker's late file can never be trained on, however late it
arrives.

After each update it writes, in this order:
1. the rollout checkpoint `checkpoints/step_<s+1>/` (Hugging Face layout, what workers load);
2. the full training state `state/step_<s+1>.pt` (weights, optimiser, kept past policies, RNG, consumed work
   keys, assignment counters), written to a temporary name, fsynced, then renamed: a crash leaves either the
   old state or the new one;
3. one line of `metrics.jsonl` and one of `trained.jsonl` (the work keys of the step);
then it hands the memory the step freed back to the system (`trainer/memory.py`).
A restart loads the newest state; a file consumed by a step whose state was saved is never trained on again,
and a step whose state was not saved is trained again from the previous state, on the files available then.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from core import trace
from core.heap import release_free_memory
from engine.model.loading import LoadedModel
from engine.model.tiny import save_model_dir
from protocol.rollouts import RolloutFile, RolloutFormatError, inspect_rollouts, read_rollouts
from protocol.rollouts.writer import write_atomically
from protocol.tasks.sources import TaskSource
from protocol.tasks.spec import TaskSpec
from protocol.terms import DEFAULT_MAX_FILE_BYTES, step_window
from trainer.errors import TrainerError
from trainer.evaluate import PassRate, sample_rewards
from trainer.inbox import named_work_key
from trainer.learner import Learner, StepStats

log = logging.getLogger(__name__)

STATE_FORMAT = 1
KEEP_STATES = 2
# What malloc may keep free between steps (trainer/memory.py). Handing a tiny-model step's memory back after every
# step and faulting it in again in the next cost about 5% of the step (docs/trainer.md, "The step's lost third").
KEEP_FREE_BYTES = 256 << 20

# Which files of the window a step takes first. "freshest": the least off-policy data; when more arrives than the
# trainer uses (the network's nodes get half a step's files more than needed) the oldest surplus goes stale.
# "oldest": first come, first trained, so a worker may run further ahead without its files going stale (local
# mode, where each worker's untrained uploads are capped): the queue absorbs the jitter of both sides.
FileOrder = Literal["freshest", "oldest"]
FILE_ORDERS: tuple[FileOrder, ...] = ("freshest", "oldest")


class StateError(TrainerError):
    """A saved training state cannot be used to resume this run."""


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def trained(self) -> Path:
        return self.root / "trained.jsonl"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step_{step}"


@dataclass(frozen=True)
class Candidate:
    """What `select` keeps of a file it may train on: its summary, not its rows (a run's window holds thousands of
    files, and rows as Python objects cost far more than the file); the chosen ones are read whole."""

    path: Path
    work_key: bytes
    assignment: tuple[str, int]  # (node, counter): see `assignment_of`
    step: int


@dataclass
class Selection:
    files: list[RolloutFile]
    rows: int
    stale: int  # files consumed without training in this selection
    paths: list[Path] = field(default_factory=list)  # where `files` were read, in their order


@dataclass
class LoopCounters:
    consumed: set[bytes] = field(default_factory=set)  # work keys trained on or skipped as stale
    # (node, counter) of every file trained on: one assignment is trained on once, whatever files claim it
    assignments: set[tuple[str, int]] = field(default_factory=set)
    stale_files: int = 0
    idle_seconds: float = 0.0
    started: float = field(default_factory=time.monotonic)


def assignment_of(file: RolloutFile) -> tuple[str, int]:
    """The assignment a file answers: (node, counter) is handed out once (signed by the coordinator)."""
    return file.meta.node, file.meta.counter


def _append_line(path: Path, record: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True, allow_nan=False) + "\n")


class TrainingLoop:
    """Owns the learner between steps; every method runs on the training thread (they block)."""

    def __init__(
        self,
        learner: Learner,
        loaded: LoadedModel,
        spec: TaskSpec,
        source: TaskSource,
        paths: RunPaths,
        *,
        rollouts_per_step: int,
        max_files_per_step: int,
        eval_every: int = 0,
        eval_problems: int = 128,
        eval_task: tuple[TaskSpec, TaskSource] | None = None,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        order: FileOrder = "freshest",
    ) -> None:
        if order not in FILE_ORDERS:
            raise ValueError(f"order must be one of {FILE_ORDERS}, got {order!r}")
        self.learner, self.loaded, self.spec, self.source, self.paths = learner, loaded, spec, source, paths
        self.order = order
        self.rollouts_per_step, self.max_files_per_step = rollouts_per_step, max_files_per_step
        self.eval_every, self.eval_problems, self.max_file_bytes = eval_every, eval_problems, max_file_bytes
        self.eval_spec, self.eval_source = eval_task or (spec, source)
        self.counters = LoopCounters()
        self.assignment_counters: dict[str, int] = {}
        self._parsed: dict[Path, Candidate | None] = {}  # None: unreadable, refused once and never re-read
        for folder in (paths.root, paths.state, paths.checkpoints):
            folder.mkdir(parents=True, exist_ok=True)

    # --- resume -------------------------------------------------------------------------------------

    def states(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.paths.state.glob("step_*.pt"):
            number = path.stem.removeprefix("step_")
            if number.isdigit():
                found.append((int(number), path))
        return sorted(found)

    def resume(self) -> bool:
        """Loads the newest saved state, if any; True when it did."""
        states = self.states()
        if not states:
            return False
        step, path = states[-1]
        try:
            saved = torch.load(path, weights_only=True)
        except Exception as exc:
            raise StateError(f"cannot read the training state {path}: {exc}") from exc
        if saved.get("format") != STATE_FORMAT or saved.get("step") != step:
            raise StateError(f"{path} is not a training state of format {STATE_FORMAT} for step {step}")
        self.learner.load_state_dict(saved["learner"])
        self.counters.consumed = {bytes.fromhex(k) for k in saved["consumed"]}
        self.counters.assignments = {(str(n), int(c)) for n, c in saved.get("assignments", [])}  # none before issue 19
        self.counters.stale_files = int(saved["stale_files"])
        self.counters.idle_seconds = float(saved["idle_seconds"])
        self.assignment_counters = {str(k): int(v) for k, v in saved["assignment_counters"].items()}
        log.info("resumed from %s: policy step %d, %d files consumed", path, step, len(self.counters.consumed))
        return True

    # --- data ---------------------------------------------------------------------------------------

    def _candidate(self, path: Path) -> Candidate | None:
        """The file at `path`, inspected once; None if it can never be trained on (unreadable, or several steps)."""
        if path in self._parsed:
            return self._parsed[path]
        try:
            summary = inspect_rollouts(path, max_bytes=self.max_file_bytes)
        except RolloutFormatError as exc:
            log.error("never training on %s: %s", path, exc)
            self._parsed[path] = None
            return None
        candidate = None
        if len(summary.steps) == 1:
            [step] = summary.steps
            assignment = (summary.meta.node, summary.meta.counter)
            candidate = Candidate(path, summary.work_key, assignment, step)
        else:
            log.error("never training on %s: its rows claim several policy steps", path)
        self._parsed[path] = candidate
        return candidate

    def select(self, paths: Iterable[Path]) -> Selection:
        """The files to train the current step on, among accepted `paths`; consumes the stale ones it meets."""
        window = step_window(self.learner.step, self.learner.config.async_level)
        ready: list[Candidate] = []
        stale = 0
        for path in paths:
            named = named_work_key(path)
            if named is not None and named in self.counters.consumed:
                continue  # trained on or stale: not read again (every look lists every upload of the run)
            candidate = self._candidate(path)
            if candidate is None or candidate.work_key in self.counters.consumed:
                continue
            if candidate.assignment in self.counters.assignments:
                log.warning("never training on %s: its assignment was trained on already (another file)", path)
                self.counters.consumed.add(candidate.work_key)
                del self._parsed[path]
                continue
            if candidate.step < window.oldest:
                log.warning("not training on %s: step %d is older than the window %s", path, candidate.step, window)
                self.counters.consumed.add(candidate.work_key)
                self.counters.stale_files += 1
                del self._parsed[path]
                stale += 1
            elif candidate.step in window:
                ready.append(candidate)
        newest_first = self.order == "freshest"
        ready.sort(key=lambda c: (-c.step if newest_first else c.step, c.work_key))
        chosen: list[tuple[Candidate, RolloutFile]] = []
        taken: set[tuple[str, int]] = set()
        rows = 0
        for candidate in ready:
            if rows >= self.rollouts_per_step or len(chosen) == self.max_files_per_step:
                break
            if candidate.assignment in taken:  # two files of one assignment: only the first one counts
                continue
            file = self._read_upload(candidate.path, candidate.work_key)
            if file is None:  # not the bytes it was inspected as: never again
                self._parsed[candidate.path] = None
                continue
            taken.add(candidate.assignment)
            chosen.append((candidate, file))
            rows += len(file.rows)
        return Selection([f for _, f in chosen], rows, stale, [c.path for c, _ in chosen])

    def _read_upload(self, path: Path, work_key: bytes) -> RolloutFile | None:
        """The rows of the file at `path` if it is the upload `work_key`; None (the reason logged) if it cannot be
        read or holds other bytes (rewritten since it was inspected: the inbox never rewrites)."""
        try:
            file = read_rollouts(path, max_bytes=self.max_file_bytes)
        except RolloutFormatError as exc:
            log.error("never training on %s: %s", path, exc)
            return None
        if file.work_key != work_key:
            log.error("never training on %s: its bytes changed after it was inspected", path)
            return None
        return file

    def read(self, path: Path, work_key: bytes) -> RolloutFile:
        """The file at `path`, read as `select` reads it, which must be the upload `work_key` (another rank chose it,
        `trainer.ranks`): a file that cannot be read, or holds other bytes, is a `TrainerError`."""
        file = self._read_upload(path, work_key)
        if file is None:
            chosen = f"0x{work_key.hex()}"
            raise TrainerError(f"{path} is not the upload {chosen} rank 0 chose: do the ranks share its folder?")
        return file

    def forget(self, files: Iterable[RolloutFile]) -> None:
        keys = {f.work_key for f in files}
        self._parsed = {p: c for p, c in self._parsed.items() if c is None or c.work_key not in keys}

    # --- a step -------------------------------------------------------------------------------------

    def train(self, files: list[RolloutFile], *, idle_seconds: float) -> dict[str, Any]:
        """Trains one step, writes the checkpoint and the state; returns the metrics record."""
        stats: StepStats = self.learner.train_step(files)
        self.counters.consumed.update(f.work_key for f in files)
        self.counters.assignments.update(assignment_of(f) for f in files)
        self.counters.idle_seconds += idle_seconds
        self.forget(files)
        trace.record("train", stats.seconds, step=stats.step, files=len(files))
        with trace.span("checkpoint", step=stats.step):
            self.save_checkpoint()
            self.save_state()
        record = stats.as_record()
        record["train_seconds"] = record.pop("seconds")
        record.update(
            seconds=round(time.monotonic() - self.counters.started, 3),
            idle_seconds=round(idle_seconds, 3),
            idle_seconds_total=round(self.counters.idle_seconds, 3),
            stale_files_total=self.counters.stale_files,
        )
        if self.eval_every and stats.step % self.eval_every == 0:
            with trace.span("evaluate", step=stats.step):
                record["eval_pass_rate"] = self.evaluate()
        _append_line(self.paths.metrics, record)
        _append_line(self.paths.trained, {"step": stats.step, "work_keys": ["0x" + f.work_key.hex() for f in files]})
        # what the step freed goes back to the system past KEEP_FREE_BYTES: between steps little more than what is
        # live stays, and a small model's next step reuses its last one's memory instead of faulting it in again
        release_free_memory(above=KEEP_FREE_BYTES)
        return record

    def eval_problem_ids(self) -> list[str]:
        """The last `eval_problems` problems of the evaluation task (the run's own task unless one was given)."""
        return list(self.eval_source.problem_ids())[-self.eval_problems :]

    def evaluate(self) -> float:
        """Pass rate on `eval_problem_ids()`, one sample each at the evaluation task's sampling."""
        self.loaded.model.eval()
        ids = self.eval_problem_ids()
        rewards = sample_rewards(
            self.loaded, self.eval_spec, self.eval_source, ids, samples=1, seed=10_000 + self.learner.step
        )
        return PassRate.of(rewards).rate

    def save_checkpoint(self) -> Path:
        """The current policy as `checkpoints/step_<s>/`, in the pool's precision (its task's sampling.dtype: what
        workers and validators compute in, so a bfloat16 pool publishes half the bytes of the float32 weights the
        learner keeps); the older ones beyond the last two are removed."""
        target = self.paths.checkpoint(self.learner.step)
        dtype = self.spec.sampling.dtype
        save_model_dir(self.loaded.model, self.loaded.tokenizer, target, overwrite=True, dtype=dtype)
        for path in self.paths.checkpoints.glob("step_*"):
            number = path.name.removeprefix("step_")
            if number.isdigit() and int(number) < self.learner.step - 1:
                shutil.rmtree(path, ignore_errors=True)
        return target

    def save_state(self) -> Path:
        step = self.learner.step
        state = {
            "format": STATE_FORMAT,
            "step": step,
            "learner": self.learner.state_dict(),
            "consumed": sorted(k.hex() for k in self.counters.consumed),
            "assignments": sorted([node, counter] for node, counter in self.counters.assignments),
            "stale_files": self.counters.stale_files,
            "idle_seconds": self.counters.idle_seconds,
            "assignment_counters": dict(self.assignment_counters),
        }
        path = self.paths.state / f"step_{step}.pt"
        write_atomically(path, lambda handle: torch.save(state, handle))
        for _, old in self.states()[:-KEEP_STATES]:
            old.unlink(missing_ok=True)
        return path
