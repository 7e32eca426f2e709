"""From verified rollout files to padded micro-batches, and the trainer's log-probs of their completions.

load_accepted (files inside the async window) -> build_samples (advantages per group, online filter)
-> pack (trainer.packing) -> collate (one padded micro-batch) -> recompute_logprobs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import PreTrainedModel

from node.rollouts import RolloutFile, RolloutFormatError, read_rollouts
from trainer.errors import TrainerError
from trainer.grpo import keep_group

log = logging.getLogger(__name__)

DEFAULT_MAX_FILE_BYTES = 64 << 20  # the validator's default upload limit (validator.config)

AdvantageFn = Callable[[Sequence[float]], Sequence[float]]  # one group's rewards -> one advantage per completion


class UnreadableRolloutError(TrainerError):
    """A rollout file on the trainer's disk does not read back as a valid rollout file."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"cannot train on {path}: {detail}")
        self.path = path
        self.detail = detail


class MixedStepError(TrainerError):
    """A file's rows claim different policy steps; node generation never writes one and validators reject it."""

    def __init__(self, path: Path, steps: list[int]) -> None:
        super().__init__(f"{path}: rows claim several policy steps {steps[:8]}; a file must come from one step")
        self.path = path
        self.steps = steps


class FutureRolloutError(TrainerError):
    """A file claims a policy step the trainer has not reached: no node can hold those weights yet."""

    def __init__(self, path: Path, step: int, current_step: int) -> None:
        super().__init__(f"{path} claims step {step}, ahead of the trainer's step {current_step}; it is refused")
        self.path = path
        self.step = step
        self.current_step = current_step


class DuplicateRolloutError(TrainerError):
    """The same file (same work key) was passed twice; its groups would be merged and counted twice."""

    def __init__(self, work_key: bytes) -> None:
        super().__init__(f"rollout file 0x{work_key.hex()} is listed more than once")
        self.work_key = work_key


@dataclass(frozen=True)
class Sample:
    """One completion ready for training."""

    input_tokens: list[int]  # the prompt
    output_tokens: list[int]  # the completion, EOS included when it stopped
    old_logprobs: list[float] | None  # per output token, the trainer's own under the generating policy; None: not yet
    advantage: float
    reward: float
    group_key: str  # "<work_key hex>:<group>": unique across files
    step: int  # policy step that generated it
    work_key: bytes  # sha256 of the file it came from

    @property
    def n_tokens(self) -> int:
        """Prompt + completion: its columns in a batch and its cost in a packing budget."""
        return len(self.input_tokens) + len(self.output_tokens)


@dataclass(frozen=True)
class StaleFile:
    path: Path
    step: int


@dataclass(frozen=True)
class AcceptedRollouts:
    files: list[RolloutFile]  # to train on, in the order given
    stale: list[StaleFile]  # older than the window: reported, never trained on


def _file_step(path: Path, file: RolloutFile) -> int:
    steps = sorted({row.step for row in file.rows})
    if len(steps) != 1:  # the writer does not enforce one step, but node generation writes job.step to every row
        raise MixedStepError(path, steps)
    return steps[0]


def load_accepted(
    paths: Sequence[Path | str], *, current_step: int, async_level: int, max_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> AcceptedRollouts:
    """Reads the files and keeps those whose step lies in [current_step - async_level, current_step].

    A file's rows share one step (DESIGN section 8; validator.checks rejects mixed files), so the window is
    decided per file, and a file mixing steps raises MixedStepError. Older files come back in `stale` (and
    are logged); a file ahead of `current_step` raises FutureRolloutError, an unreadable one
    UnreadableRolloutError.
    """
    if current_step < 0 or async_level < 0:
        raise ValueError(f"current_step and async_level must be >= 0, got {current_step} and {async_level}")
    oldest = current_step - async_level
    accepted: list[RolloutFile] = []
    stale: list[StaleFile] = []
    for path in map(Path, paths):
        try:
            file = read_rollouts(path, max_bytes=max_bytes)
        except RolloutFormatError as exc:
            raise UnreadableRolloutError(path, str(exc)) from exc
        step = _file_step(path, file)
        if step > current_step:
            raise FutureRolloutError(path, step, current_step)
        if step < oldest:
            log.warning(
                "not training on %s: step %d is older than the window [%d, %d]", path, step, oldest, current_step
            )
            stale.append(StaleFile(path, step))
        else:
            accepted.append(file)
    return AcceptedRollouts(accepted, stale)


@dataclass(frozen=True)
class SampleSet:
    samples: list[Sample]
    groups_kept: int
    groups_dropped: int  # all rewards equal: zero advantage, no signal


def rewards_all_equal(rewards: Sequence[float]) -> bool:
    """True when a group carries no learning signal: the online filter of `trainer.grpo.keep_group`."""
    return len(rewards) == 0 or not keep_group(torch.tensor(rewards, dtype=torch.float32))


def build_samples(files: Sequence[RolloutFile], advantage_fn: AdvantageFn) -> SampleSet:
    """Samples of every group with mixed rewards, in file order, then group order, then row order."""
    groups: dict[tuple[bytes, int], list[int]] = {}  # (work key, group) -> row indices, in first-seen order
    by_key: dict[bytes, RolloutFile] = {}
    for file in files:
        if file.work_key in by_key:
            raise DuplicateRolloutError(file.work_key)
        by_key[file.work_key] = file
        for index, row in enumerate(file.rows):
            groups.setdefault((file.work_key, row.group), []).append(index)
    samples: list[Sample] = []
    dropped = 0
    for (work_key, group), indices in groups.items():
        rows = [by_key[work_key].rows[i] for i in indices]
        rewards = [row.reward for row in rows]
        if rewards_all_equal(rewards):
            dropped += 1
            continue
        advantages = [float(a) for a in advantage_fn(rewards)]
        if len(advantages) != len(rows):
            raise ValueError(f"advantage_fn returned {len(advantages)} advantages for a group of {len(rows)}")
        samples.extend(
            Sample(
                input_tokens=row.input_tokens,
                output_tokens=row.output_tokens,
                old_logprobs=None,
                advantage=advantage,
                reward=row.reward,
                group_key=f"{work_key.hex()}:{group}",
                step=row.step,
                work_key=work_key,
            )
            for row, advantage in zip(rows, advantages, strict=True)
        )
    return SampleSet(samples, groups_kept=len(groups) - dropped, groups_dropped=dropped)


@dataclass(frozen=True)
class Batch:
    """One right-padded micro-batch. Row b holds prompt + completion at columns [0, len_b), padding after."""

    input_ids: torch.Tensor  # (B, T) int64, pad_id after each sequence
    attention_mask: torch.Tensor  # (B, T) int64, 1 on real tokens
    position_ids: torch.Tensor  # (B, T) int64, 0 .. T-1 on every row
    targets: torch.Tensor  # (B, T) int64, targets[:, t] = input_ids[:, t + 1]; pad_id where there is none
    loss_mask: torch.Tensor  # (B, T) bool, True where targets[:, t] is an output token
    advantages: torch.Tensor  # (B,) float32
    old_logprobs: torch.Tensor | None  # (B, T) float32 at loss_mask positions, 0 elsewhere; None if not filled

    def to(self, device: torch.device | str) -> Batch:
        old = self.old_logprobs
        return Batch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            position_ids=self.position_ids.to(device),
            targets=self.targets.to(device),
            loss_mask=self.loss_mask.to(device),
            advantages=self.advantages.to(device),
            old_logprobs=None if old is None else old.to(device),
        )


def collate(samples: Sequence[Sample], pad_id: int) -> Batch:
    """Pads samples on the right into one batch.

    Right padding: under the causal mask no real token can see the padding after it, so every real
    position's logits equal an unpadded forward's, position ids are plain 0 .. T-1, and column t predicts
    column t + 1 on every row. (Generation pads on the left only to append new tokens in one column.)
    """
    if not samples:
        raise ValueError("collate needs at least one sample")
    if any(not s.input_tokens or not s.output_tokens for s in samples):
        raise ValueError("every sample needs a non-empty prompt and completion (rollout files guarantee both)")
    filled = [s.old_logprobs is not None for s in samples]
    if any(filled) and not all(filled):
        raise ValueError("either every sample of a batch has old_logprobs or none has")
    B, T = len(samples), max(s.n_tokens for s in samples)  # batch, time
    input_ids = torch.full((B, T), pad_id, dtype=torch.int64)
    attention_mask = torch.zeros((B, T), dtype=torch.int64)
    targets = torch.full((B, T), pad_id, dtype=torch.int64)
    loss_mask = torch.zeros((B, T), dtype=torch.bool)
    old = torch.zeros((B, T), dtype=torch.float32) if all(filled) else None
    for b, sample in enumerate(samples):
        sequence = torch.tensor(sample.input_tokens + sample.output_tokens, dtype=torch.int64)
        P, L = len(sample.input_tokens), len(sequence)  # prompt length, sequence length
        input_ids[b, :L] = sequence
        attention_mask[b, :L] = 1
        targets[b, : L - 1] = sequence[1:]
        loss_mask[b, P - 1 : L - 1] = True  # the logits at P-1 .. L-2 predict output tokens 0 .. O-1
        if old is not None and sample.old_logprobs is not None:
            if len(sample.old_logprobs) != L - P:
                raise ValueError(f"sample {b}: {len(sample.old_logprobs)} old_logprobs for {L - P} output tokens")
            old[b, P - 1 : L - 1] = torch.tensor(sample.old_logprobs, dtype=torch.float32)
    position_ids = torch.arange(T, dtype=torch.int64).expand(B, T).contiguous()
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return Batch(input_ids, attention_mask, position_ids, targets, loss_mask, advantages, old)


def recompute_logprobs(
    model: PreTrainedModel, batch: Batch, *, temperature: float = 1.0, no_grad: bool = True
) -> torch.Tensor:
    """(B, T) float32 log-probs of `batch.targets` under log_softmax(logits / temperature); 0 off loss_mask.

    Pass the sampling temperature the rollouts were drawn at: the recorded log-probs use the same scaling.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    with torch.no_grad() if no_grad else contextlib.nullcontext():
        logits = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        ).logits  # (B, T, V)
        logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, T, V)
        picked = logprobs.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)  # (B, T)
        return picked.masked_fill(~batch.loss_mask, 0.0)


def with_old_logprobs(samples: Sequence[Sample], batch: Batch, logprobs: torch.Tensor) -> list[Sample]:
    """The samples of `batch` (in its row order) with old_logprobs taken from a (B, T) recompute_logprobs result."""
    if len(samples) != batch.loss_mask.shape[0] or logprobs.shape != batch.loss_mask.shape:
        raise ValueError(
            f"{len(samples)} samples, {tuple(logprobs.shape)} log-probs for a batch of {tuple(batch.loss_mask.shape)}"
        )
    values = logprobs.detach().float().cpu()
    mask = batch.loss_mask.cpu()
    return [replace(s, old_logprobs=values[b][mask[b]].tolist()) for b, s in enumerate(samples)]
