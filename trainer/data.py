"""From verified rollout files to padded micro-batches, and the trainer's log-probs of their completions.

attested files inside the async window (the step loop's choice) -> build_samples (advantages per group, online
filter) -> prompt_units (a group's completions share one forward of their prompt) -> pack (trainer.packing)
-> collate_units (one micro-batch, what the learner trains on).

`collate` and `recompute_logprobs` lay out and score one row per completion, the plain way: the reference
the shared layout is tested against, and what a reader checking a file's log-probs by hand would write.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from transformers import PreTrainedModel

from protocol.rollouts import RolloutFile
from trainer.errors import TrainerError
from trainer.grpo import keep_group

log = logging.getLogger(__name__)


AdvantageFn = Callable[[Sequence[float]], Sequence[float]]  # one group's rewards -> one advantage per completion


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


@dataclass(frozen=True)
class PromptUnit:
    """Completions of one prompt, trained as one sequence: the prompt once, then each completion after it."""

    prompt: list[int]
    samples: list[Sample]  # every one has `prompt` as its input tokens

    @property
    def n_tokens(self) -> int:
        """Columns of the unit's row: the prompt, then each completion but its last token (which predicts nothing)."""
        return len(self.prompt) + sum(len(s.output_tokens) - 1 for s in self.samples)


def prompt_units(samples: Sequence[Sample], max_tokens: int) -> list[PromptUnit]:
    """The samples grouped by prompt (same group, same input tokens), in first-seen order.

    A group's completions share their prompt, so a unit computes the prompt's forward once instead of once
    per completion: with the default task's 80-token prompts and 8 completions of about 8 tokens, a step's
    forward shrinks about 5x. A unit that would exceed `max_tokens` is split into several, each with a copy
    of the prompt; a single sample over the budget still makes its own unit (the packer reports it).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    units: list[PromptUnit] = []
    open_unit: dict[tuple[str, tuple[int, ...]], PromptUnit] = {}  # the unit still taking samples, per prompt
    for sample in samples:
        key = (sample.group_key, tuple(sample.input_tokens))
        unit = open_unit.get(key)
        if unit is None or unit.n_tokens + len(sample.output_tokens) - 1 > max_tokens:
            unit = PromptUnit(sample.input_tokens, [])
            units.append(unit)
            open_unit[key] = unit
        unit.samples.append(sample)
    return units


@dataclass(frozen=True)
class SharedBatch:
    """A micro-batch of prompt units, one per row, right-padded; completions read their prompt's keys and values.

    Row r holds a prompt at columns [0, P), then each completion's tokens but the last, one after another;
    a completion's tokens have position ids P, P + 1, ... as if it followed the prompt alone, and `attention`
    lets each of them see the prompt and the earlier tokens of its own completion only. So every logit equals
    the one an unshared forward of prompt + completion gives (tests/trainer/test_data.py checks it).

    The N completions of the batch are then addressed as a (N, W) grid, W the longest completion:
    `positions[n, j]` is the flat index (row * T + column) of the logits that predict output token j of
    completion n, the prompt's last column for j = 0.
    """

    input_ids: torch.Tensor  # (R, T) int64, pad_id after each row's tokens
    position_ids: torch.Tensor  # (R, T) int64
    attention: torch.Tensor  # (R, 1, T, T) bool, True where query column t may attend to key column u
    positions: torch.Tensor  # (N, W) int64 flat indices into the (R * T) logits; 0 where loss_mask is False
    targets: torch.Tensor  # (N, W) int64, the output tokens; pad_id after each completion
    loss_mask: torch.Tensor  # (N, W) bool, True on the output tokens
    advantages: torch.Tensor  # (N,) float32
    tokens: int  # real (unpadded) columns of all rows: what the forward computes

    def to(self, device: torch.device | str) -> SharedBatch:
        return SharedBatch(
            input_ids=self.input_ids.to(device),
            position_ids=self.position_ids.to(device),
            attention=self.attention.to(device),
            positions=self.positions.to(device),
            targets=self.targets.to(device),
            loss_mask=self.loss_mask.to(device),
            advantages=self.advantages.to(device),
            tokens=self.tokens,
        )


def collate_units(units: Sequence[PromptUnit], pad_id: int) -> SharedBatch:
    """Lays prompt units out as a SharedBatch (see there); its completions come in unit order, then sample order."""
    if not units or any(not u.samples for u in units):
        raise ValueError("collate_units needs at least one unit, and every unit needs a sample")
    samples = [s for u in units for s in u.samples]
    if any(not s.input_tokens or not s.output_tokens for s in samples):
        raise ValueError("every sample needs a non-empty prompt and completion (rollout files guarantee both)")
    if any(s.input_tokens != u.prompt for u in units for s in u.samples):
        raise ValueError("a prompt unit holds a sample of another prompt")
    R, T = len(units), max(u.n_tokens for u in units)  # rows, columns
    N, W = len(samples), max(len(s.output_tokens) for s in samples)  # completions, the longest one
    input_ids = torch.full((R, T), pad_id, dtype=torch.int64)
    position_ids = torch.zeros((R, T), dtype=torch.int64)
    attention = torch.zeros((R, 1, T, T), dtype=torch.bool)
    positions = torch.zeros((N, W), dtype=torch.int64)
    targets = torch.full((N, W), pad_id, dtype=torch.int64)
    loss_mask = torch.zeros((N, W), dtype=torch.bool)
    n = 0
    for r, unit in enumerate(units):
        P = len(unit.prompt)
        input_ids[r, :P] = torch.tensor(unit.prompt, dtype=torch.int64)
        position_ids[r, :P] = torch.arange(P)
        attention[r, 0, :P, :P] = torch.ones((P, P), dtype=torch.bool).tril()
        start = P  # first column of the next completion
        for sample in unit.samples:
            L = len(sample.output_tokens)
            end = start + L - 1  # its tokens but the last
            input_ids[r, start:end] = torch.tensor(sample.output_tokens[:-1], dtype=torch.int64)
            position_ids[r, start:end] = torch.arange(P, P + L - 1)
            attention[r, 0, start:end, :P] = True
            attention[r, 0, start:end, start:end] = torch.ones((L - 1, L - 1), dtype=torch.bool).tril()
            # output token 0 is predicted by the prompt's last column, token j > 0 by the completion's column j - 1
            columns = torch.cat([torch.tensor([P - 1]), torch.arange(start, end)])
            positions[n, :L] = r * T + columns
            targets[n, :L] = torch.tensor(sample.output_tokens, dtype=torch.int64)
            loss_mask[n, :L] = True
            n += 1
            start = end
        padding = torch.arange(start, T)
        attention[r, 0, padding, padding] = True  # padding sees itself only: no row of the softmax is empty
        position_ids[r, start:] = torch.arange(T - start)
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    tokens = sum(u.n_tokens for u in units)
    return SharedBatch(input_ids, position_ids, attention, positions, targets, loss_mask, advantages, tokens)


ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")  # those that take a custom 4D mask (flash attention does not)


def shared_logprobs(
    model: PreTrainedModel, batch: SharedBatch, *, temperature: float = 1.0, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, W) log-probs of a SharedBatch's output tokens under logits / temperature, and their entropy if asked.

    Keeps the graph: call it under torch.no_grad() for log-probs that need none. Values off `loss_mask` are
    those of whatever logits row 0 column 0 predicts: mask them. Under autocast the model computes in bfloat16;
    the log-probs are float32 all the same (the logits are cast before log_softmax).
    """
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        raise TrainerError(
            f"the model's attention implementation {implementation!r} cannot take a shared-prompt mask; "
            f"load it with attn_implementation in {ATTENTION_IMPLEMENTATIONS}"
        )
    device = batch.attention.device
    dtype = next(model.parameters()).dtype
    if torch.is_autocast_enabled(device.type):  # sdpa casts the mask to bfloat16: a float32 min would become -inf
        dtype = torch.get_autocast_dtype(device.type)
    additive = torch.zeros(batch.attention.shape, dtype=dtype, device=device)
    additive.masked_fill_(~batch.attention, torch.finfo(dtype).min)  # (R, 1, T, T): eager and sdpa add it
    logits = model(
        input_ids=batch.input_ids, attention_mask=additive, position_ids=batch.position_ids, use_cache=False
    ).logits  # (R, T, V)
    picked, spread = chosen_logprobs(
        logits.flatten(0, 1), batch.positions.flatten(), batch.targets.flatten(), temperature, entropy=entropy
    )
    shape = batch.positions.shape  # (N, W)
    return picked.view(shape), (spread.view(shape) if spread is not None else None)


LOGPROB_CHUNK_TOKENS = 512  # rows of logits made float32 at once: 311 MB at Qwen's 151,936 ids


def chosen_logprobs(
    logits: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor, temperature: float, *, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(M,) float32 log-probs of `targets` under log_softmax(logits[rows] / temperature), and their entropies if
    asked, from (L, V) logits in any dtype.

    At a real vocabulary the logits dominate a step's memory (8,192 tokens x 151,936 ids x 4 bytes is 5 GB), and
    the plain way holds three more copies of them for the backward pass (the float32 cast, the scaled logits,
    the log-softmax). This takes LOGPROB_CHUNK_TOKENS rows at a time under activation checkpointing, so what is
    kept is the model's logits alone, and each chunk's float32 work is done again in the backward pass. The
    values are log_softmax's: the chosen logit less the log-sum-exp of its row."""

    def chunk(source: torch.Tensor, index: torch.Tensor, chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scaled = source[index].float() / temperature  # (c, V)
        normaliser = torch.logsumexp(scaled, dim=-1)  # (c,)
        picked = scaled.gather(-1, chosen.unsqueeze(-1)).squeeze(-1) - normaliser
        if not entropy:
            return picked, picked.new_zeros(())
        return picked, normaliser - (torch.softmax(scaled, dim=-1) * scaled).sum(-1)  # -sum p log p

    pieces = []
    for start in range(0, rows.numel(), LOGPROB_CHUNK_TOKENS):
        args = (logits, rows[start : start + LOGPROB_CHUNK_TOKENS], targets[start : start + LOGPROB_CHUNK_TOKENS])
        if torch.is_grad_enabled() and logits.requires_grad:
            pieces.append(torch.utils.checkpoint.checkpoint(chunk, *args, use_reentrant=False))
        else:
            pieces.append(chunk(*args))
    if not pieces:
        empty = logits.new_zeros(0, dtype=torch.float32)
        return empty, (empty if entropy else None)
    picked = torch.cat([p for p, _ in pieces])
    return picked, (torch.cat([e for _, e in pieces]) if entropy else None)


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
