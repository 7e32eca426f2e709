"""Calibrates TOPLOC thresholds for float32 models on CPU: honest recomputation against cheating.

    .venv/bin/python benchmarks/proof_calibration.py [--rows 32] [--tokens 256] [--seeds 0 1 2] [--model DIR]

A tiny Qwen2 (0.8M parameters, float32; or the model in --model DIR) generates completions with a KV
cache, token by token, and a proof is built from the hidden states of the generated tokens, as a worker
does. A validator prefills prompt + completion once with the checkpoint and compares. Per chunk of 32
tokens the table shows the spread of toploc's three statistics (exponent mismatches out of 128, mantissa
error mean and median):

honest:  cached decoding vs one prefill; decoding in a left-padded batch of 4 vs one prefill; cached
         decoding vs a prefill inside a left-padded batch (the validator batches too).
cheating: the completion comes from the same model with gaussian noise of std 1e-4 / 3e-4 / 1e-3 on every
         weight (1e-3 is about one small training step: a stale policy), from a model with another init
         seed, or one output token is changed after generation (only the chunks after it can move).

Thresholds must sit above the honest maximum and below the cheating minimum; the last lines say how many
chunks and rows each variant fails under `ProofThresholds.cpu_fp32()` and `ProofThresholds.gpu_bf16()`.
docs/proof-calibration.md records a run.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from engine.model.forward import forward_hidden
from engine.model.loading import load_model
from engine.proofs import PROOF_CHUNK, ChunkResult, ProofThresholds, compare_hidden


def tiny_qwen2(seed: int) -> PreTrainedModel:
    """The default calibration model: 4 layers, hidden 128, vocabulary 96 (0.8M parameters, float32)."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=96,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config).float().eval()


def with_noise(model: PreTrainedModel, noise: float, seed: int) -> PreTrainedModel:
    """A copy with N(0, noise^2) added to every weight: `noise` 1e-3 is about one small training step."""
    noisy = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed + 10_000)
    with torch.no_grad():
        for param in noisy.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * noise)
    return noisy


def reinitialised(model: PreTrainedModel, seed: int) -> PreTrainedModel:
    """The same architecture from another random init."""
    torch.manual_seed(seed)
    return type(model)(model.config).float().eval()


def _left_pad(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids, attention mask and position ids (B, T) for left-padded sequences."""
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[0] * (width - len(s)) + s for s in seqs])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def decode(
    model: PreTrainedModel, prompts: list[list[int]], n_out: int, seed: int
) -> list[tuple[list[int], torch.Tensor]]:
    """Samples `n_out` tokens per prompt with a KV cache, in one left-padded batch: (tokens, hidden (n_out, H))."""
    generator = torch.Generator().manual_seed(seed)
    ids, mask, positions = _left_pad(prompts)
    out = forward_hidden(model, ids, attention_mask=mask, position_ids=positions, use_cache=True)
    hidden: list[torch.Tensor] = []  # n_out x (B, H)
    tokens: list[torch.Tensor] = []  # n_out x (B,)
    for step in range(n_out):
        hidden.append(out.hidden[:, -1])
        token = torch.multinomial(torch.softmax(out.logits[:, -1], -1), 1, generator=generator)  # (B, 1)
        tokens.append(token[:, 0])
        if step == n_out - 1:
            break
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        positions = positions[:, -1:] + 1
        out = forward_hidden(
            model,
            token,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=out.past_key_values,
            use_cache=True,
        )
    stacked_tokens = torch.stack(tokens, dim=1)  # (B, n_out)
    stacked_hidden = torch.stack(hidden, dim=1)  # (B, n_out, H)
    return [(stacked_tokens[b].tolist(), stacked_hidden[b]) for b in range(len(prompts))]


def prefill(model: PreTrainedModel, rows: list[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
    """The validator's recomputation: hidden (n_out, H) of each (prompt, output), prefilled in one padded batch."""
    seqs = [prompt + output for prompt, output in rows]
    ids, mask, positions = _left_pad(seqs)
    hidden = forward_hidden(model, ids, attention_mask=mask, position_ids=positions).hidden  # (B, T, H)
    width = ids.shape[1]
    result = []
    for b, (prompt, output) in enumerate(rows):
        start = width - len(seqs[b]) + len(prompt) - 1  # position whose logits sampled output token 0
        result.append(hidden[b, start : start + len(output)])
    return result


@dataclass
class Variant:
    name: str
    honest: bool
    rows: list[list[ChunkResult]]  # per row, the chunks that can tell (for a changed token: those after it)


def run_calibration(model: PreTrainedModel, n_rows: int, n_tokens: int, seed: int) -> list[Variant]:
    """Measures every variant of the module docstring on `n_rows` completions of `n_tokens` tokens."""
    generator = torch.Generator().manual_seed(seed)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    prompts = [
        torch.randint(1, vocab, (int(torch.randint(4, 24, (1,), generator=generator)),), generator=generator).tolist()
        for _ in range(n_rows)
    ]

    def single(m: PreTrainedModel, salt: int) -> list[tuple[list[int], torch.Tensor]]:
        return [decode(m, [p], n_tokens, seed + salt + i)[0] for i, p in enumerate(prompts)]

    def check(generated: list[tuple[list[int], torch.Tensor]], batch: int = 1) -> list[list[ChunkResult]]:
        pairs = [(p, tokens) for p, (tokens, _) in zip(prompts, generated, strict=True)]
        recomputed = [h for start in range(0, len(pairs), batch) for h in prefill(model, pairs[start : start + batch])]
        return [list(compare_hidden(h, r)) for (_, h), r in zip(generated, recomputed, strict=True)]

    honest = single(model, 0)
    batched = [
        row
        for start in range(0, n_rows, 4)
        for row in decode(model, prompts[start : start + 4], n_tokens, seed + start)
    ]
    variants = [
        Variant("honest: cached decode vs prefill", True, check(honest)),
        Variant("honest: batch-4 decode vs prefill", True, check(batched)),
        Variant("honest: decode vs batch-4 prefill", True, check(honest, batch=4)),
    ]
    for noise in (1e-4, 3e-4, 1e-3):
        variants.append(
            Variant(f"cheat: weights + N(0, {noise:g})", False, check(single(with_noise(model, noise, seed), 0)))
        )
    variants.append(Variant("cheat: other init seed", False, check(single(reinitialised(model, seed + 1), 0))))

    changed_rows = []
    for i, (prompt, (tokens, hidden)) in enumerate(zip(prompts, honest, strict=True)):
        at = int(torch.randint(0, n_tokens - 1, (1,), generator=generator))  # never the last token: no later state
        altered = list(tokens)
        altered[at] = (altered[at] + 1 + i) % vocab
        (recomputed,) = prefill(model, [(prompt, altered)])
        first = (at + 1) // PROOF_CHUNK  # output token at + 1 is the first whose hidden state sees the change
        changed_rows.append(list(compare_hidden(hidden, recomputed))[first:])
    variants.append(Variant("cheat: one output token changed", False, changed_rows))
    return variants


def _spread(values: list[float]) -> str:
    return f"{min(values):>7.3g} {statistics.median(values):>7.3g} {max(values):>7.3g}"


def _fails(variant: Variant, thresholds: ProofThresholds) -> tuple[int, int, int]:
    def bad(c: ChunkResult) -> bool:
        return (
            c.exp_mismatches > thresholds.max_exp_mismatches
            or c.mant_err_mean > thresholds.max_mant_err_mean
            or c.mant_err_median > thresholds.max_mant_err_median
        )

    chunks = [c for row in variant.rows for c in row]
    return sum(map(bad, chunks)), len(chunks), sum(any(map(bad, row)) for row in variant.rows)


def print_table(variants: list[Variant], named: dict[str, ProofThresholds]) -> None:
    print(f"{'variant':<36} {'exp mismatches /128':>23} {'mantissa mean':>23} {'mantissa median':>23}")
    print(f"{'':<36}" + f" {'min':>7} {'median':>7} {'max':>7}" * 3)
    for v in variants:
        chunks = [c for row in v.rows for c in row]
        mean = [min(c.mant_err_mean, 999.0) for c in chunks]  # 2**64 means "every exponent mismatched"
        print(
            f"{v.name:<36} {_spread([c.exp_mismatches for c in chunks])} {_spread(mean)} "
            f"{_spread([min(c.mant_err_median, 999.0) for c in chunks])}"
        )
    for label, thresholds in named.items():
        print(f"\nunder {label} {thresholds}: failing chunks / chunks, failing rows / rows")
        for v in variants:
            bad_chunks, n_chunks, bad_rows = _fails(v, thresholds)
            print(f"  {v.name:<36} {bad_chunks:>4}/{n_chunks:<4} {bad_rows:>3}/{len(v.rows)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=32, help="completions per variant and seed")
    parser.add_argument("--tokens", type=int, default=256, help="output tokens per completion")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="model, prompt and sampling seeds")
    parser.add_argument(
        "--model", type=Path, help="a model directory in HF layout (float32, CPU) instead of the tiny one"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for tiny models)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model).model if args.model else None
    started = time.perf_counter()
    runs = [run_calibration(loaded or tiny_qwen2(seed), args.rows, args.tokens, seed) for seed in args.seeds]
    variants = runs[0]
    for more in runs[1:]:
        for merged, extra in zip(variants, more, strict=True):
            merged.rows.extend(extra.rows)
    seconds = time.perf_counter() - started
    print(f"{args.rows} rows x {args.tokens} tokens per variant and seed, seeds {args.seeds}, {seconds:.0f} s\n")
    print_table(variants, {"cpu_fp32()": ProofThresholds.cpu_fp32(), "gpu_bf16()": ProofThresholds.gpu_bf16()})


if __name__ == "__main__":
    main()
