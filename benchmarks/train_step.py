"""One GRPO step's forward and backward: one row per completion (the plain layout) against a group's completions
sharing one forward of their prompt (`trainer.data.prompt_units`, what the learner trains on), same samples.

Run: `.venv/bin/python benchmarks/train_step.py [--groups 32] [--group-size 8] [--repeats 5]`.

The samples are the default task's prompts with worked answers as completions (the shape an SFT-started run
trains on: about 80 prompt and 8 completion tokens), on the tiny model, one thread. Both layouts go through
first-fit-decreasing packing under the same token budget and the same GRPO loss; the script also checks that
they give the same loss.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from engine.model.loading import load_model
from engine.model.tiny import init_model
from protocol.tasks.sources import open_source
from protocol.tasks.spec import load_task_spec
from trainer.data import Sample, collate, collate_units, prompt_units, recompute_logprobs, shared_logprobs
from trainer.grpo import GRPOConfig, grpo_token_loss
from trainer.packing import pack_first_fit_decreasing
from trainer.sft import encode_example

TASK = Path(__file__).resolve().parent.parent / "configs" / "tasks" / "default.toml"


def make_samples(groups: int, group_size: int, seed: int) -> tuple[list[Sample], int]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        loaded = load_model(init_model(Path(tmp) / "tiny", seed=seed))
    spec = load_task_spec(TASK)
    source = open_source(spec)
    problems = [source.problem(pid) for pid in list(source.problem_ids())[:groups]]
    samples = []
    for g, problem in enumerate(problems):
        prompt, worked = encode_example(loaded, spec, problem)
        for _ in range(group_size):  # worked answers and wrong ones of other lengths: mixed rewards
            wrong = loaded.tokenizer.encode(f"<answer>{rng.randint(-100, 200)}</answer>", add_special_tokens=False)
            output = worked if rng.random() < 0.3 else [*wrong, loaded.eos_token_ids[0]]
            samples.append(Sample(prompt, output, None, rng.gauss(0, 1), 0.0, f"00:{g}", 0, b"\x00"))
    return samples, loaded.tokenizer.pad_token_id or 0


def plain_step(model: torch.nn.Module, samples: list[Sample], budget: int, pad: int) -> tuple[float, int]:
    bins = pack_first_fit_decreasing([s.n_tokens for s in samples], budget)
    batches = [collate([samples[i] for i in b], pad) for b in bins]
    total = sum(int(b.loss_mask.sum()) for b in batches)
    loss_sum = 0.0
    for batch in batches:
        logp = recompute_logprobs(model, batch, no_grad=False)  # type: ignore[arg-type]
        out = grpo_token_loss(logp, logp.detach(), batch.advantages, batch.loss_mask, GRPOConfig())
        (out.loss * out.tokens / total).backward()
        loss_sum += float(out.loss.detach()) * out.tokens
    return loss_sum / total, sum(int(b.attention_mask.sum()) for b in batches)


def shared_step(model: torch.nn.Module, samples: list[Sample], budget: int, pad: int) -> tuple[float, int]:
    units = prompt_units(samples, budget)
    bins = pack_first_fit_decreasing([u.n_tokens for u in units], budget)
    batches = [collate_units([units[i] for i in b], pad) for b in bins]
    total = sum(int(b.loss_mask.sum()) for b in batches)
    loss_sum = 0.0
    for batch in batches:
        logp, _ = shared_logprobs(model, batch)  # type: ignore[arg-type]
        out = grpo_token_loss(logp, logp.detach(), batch.advantages, batch.loss_mask, GRPOConfig())
        (out.loss * out.tokens / total).backward()
        loss_sum += float(out.loss.detach()) * out.tokens
    return loss_sum / total, sum(b.tokens for b in batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    samples, pad = make_samples(args.groups, args.group_size, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(init_model(Path(tmp) / "tiny", seed=1)).model
    model.train()
    steps: dict[str, Callable[..., tuple[float, int]]] = {
        "one row per completion": plain_step,
        "shared prompt": shared_step,
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    results: dict[str, tuple[float, int]] = {}
    for _ in range(args.repeats):  # interleaved, so drift hits both alike
        for name, step in steps.items():
            model.zero_grad(set_to_none=True)
            started = time.perf_counter()
            results[name] = step(model, samples, args.micro_batch_tokens, pad)
            times[name].append(time.perf_counter() - started)
    print(f"{len(samples)} completions in {args.groups} groups, {args.threads} thread(s), median of {args.repeats}")
    print(f"{'layout':26}{'seconds':>9}{'tokens':>9}{'loss':>14}  all runs")
    for name in steps:
        loss, tokens = results[name]
        runs = " ".join(f"{t:.2f}" for t in times[name])
        print(f"{name:26}{statistics.median(times[name]):9.3f}{tokens:9d}{loss:14.8f}  {runs}")
    base, ours = (statistics.median(times[n]) for n in steps)
    print(f"speedup of the shared prompt: {base / ours:.1f}x")


if __name__ == "__main__":
    main()
