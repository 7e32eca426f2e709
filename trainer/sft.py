"""Supervised warm start: teach the tiny model the task's answer format and some arithmetic.

A randomly initialised model never produces `<answer>N</answer>`, so every reward is 0 and GRPO has no
signal. A short run of cross-entropy on worked answers (prompt -> `<answer>{answer}</answer><eos>`) moves
the pass rate into the band where groups have mixed rewards. Loss is on completion tokens only.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from core.config import Settings, setting
from engine.model.loading import LoadedModel
from protocol.plan import prompt_tokens
from protocol.tasks.prompts import build_messages
from protocol.tasks.sources import Problem, TaskSource
from protocol.tasks.spec import TaskSpec
from trainer.precision import Precision, PrecisionError


@dataclass(frozen=True)
class SFTConfig(Settings):
    """Hyperparameters of the warm start; the defaults land the default task in the RL band on 2 CPU cores."""

    steps: int = setting("optimiser steps", default=600, minimum=1)
    batch_size: int = setting("worked answers a step", default=64, minimum=1)
    lr: float = setting("peak learning rate (AdamW), after the warm-up", default=1.5e-3, above=0, below=1)
    warmup_steps: int = setting("steps of linear warm-up to the peak", default=20, minimum=0)
    weight_decay: float = setting("AdamW's decoupled weight decay", default=0.01, minimum=0)
    grad_clip: float = setting("largest gradient norm; larger ones are scaled down to it", default=1.0, above=0)
    seed: int = setting("the order of the worked answers", default=0, minimum=0)
    holdout: int = setting(
        "the last problems of the source: never trained on, used to measure the pass rate", default=256, minimum=1
    )


@dataclass(frozen=True)
class SFTStep:
    step: int
    loss: float
    lr: float
    seconds: float


def worked_answer(spec: TaskSpec, problem: Problem) -> str:
    """What an ideal completion says; the format the task's `extract_answer` reads."""
    return f"<answer>{problem.answer}</answer>"


def encode_example(loaded: LoadedModel, spec: TaskSpec, problem: Problem) -> tuple[list[int], list[int]]:
    """(prompt tokens, completion tokens ending in EOS) for one problem."""
    prompt = list(prompt_tokens(loaded.tokenizer, build_messages(spec, problem, None)))
    completion = loaded.tokenizer.encode(worked_answer(spec, problem), add_special_tokens=False)
    return prompt, [*completion, loaded.eos_token_ids[0]]


def collate(examples: Sequence[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Right-padded (B, T) input ids, attention mask, and labels with -100 outside the completions."""
    width = max(len(p) + len(c) for p, c in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, (prompt, completion) in enumerate(examples):
        sequence = prompt + completion
        ids[row, : len(sequence)] = torch.tensor(sequence)
        mask[row, : len(sequence)] = 1
        labels[row, len(prompt) : len(sequence)] = torch.tensor(completion)
    return ids, mask, labels


def lr_at(step: int, config: SFTConfig) -> float:
    """Linear warmup, then cosine decay to a tenth."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_ids(source: TaskSource, config: SFTConfig) -> Sequence[str]:
    ids = source.problem_ids()
    if len(ids) <= config.holdout:
        raise ValueError(f"the task has {len(ids)} problems; SFT needs more than the {config.holdout} held out")
    return ids[: len(ids) - config.holdout]


def held_out_ids(source: TaskSource, config: SFTConfig) -> Sequence[str]:
    """The problems SFT never trains on, for measuring the pass rate."""
    ids = source.problem_ids()
    return ids[max(0, len(ids) - config.holdout) :]


def run_sft(
    loaded: LoadedModel,
    spec: TaskSpec,
    source: TaskSource,
    config: SFTConfig,
    *,
    on_step: Callable[[SFTStep], None] | None = None,
    precision: Precision | None = None,
) -> PreTrainedModel:
    """Trains `loaded.model` in place and returns it (in eval mode).

    The model already lies on `precision.device` (None: float32 where it lies) with float32 weights; the forward
    runs under `precision.autocast()`, the cross-entropy over float32 logits, AdamW on the float32 weights.
    """
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    model = loaded.model
    device = next(model.parameters()).device
    if precision is not None and precision.device.type != device.type:
        raise PrecisionError(f"the model lies on {device} but SFT was set to train on {precision.device}")
    autocast = precision.autocast if precision is not None else contextlib.nullcontext
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    pad_id = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else loaded.eos_token_ids[0]
    pool = train_ids(source, config)
    started = time.perf_counter()
    for step in range(config.steps):
        batch = [
            encode_example(loaded, spec, source.problem(pool[rng.randrange(len(pool))]))
            for _ in range(config.batch_size)
        ]
        ids, mask, labels = (t.to(device) for t in collate(batch, pad_id))  # (B, T) each
        lr = lr_at(step, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with autocast():
            logits = model(input_ids=ids, attention_mask=mask).logits  # (B, T, V)
        # token t predicts t + 1: shift so that logits[:, t] is scored against labels[:, t + 1]
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].float().reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        if on_step is not None:
            on_step(SFTStep(step + 1, float(loss.item()), lr, time.perf_counter() - started))
    return model.eval()
