"""The validator's first route, before and after issue 33: every row's prompt + completion prefilled on its own
(left-padded batches of `--batch` rows) against each distinct prompt prefilled once and its completions continued
from a copy of its keys and values (`validator.recompute.prefill_outputs`). Same rows, same model, same run.

Run: `.venv/bin/python benchmarks/verify_prefill.py [--size tiny|25m] [--prompts 8] [--group 8]`. Prints the
tokens each way feeds the model (padding included), the median seconds of each over `--repeats`, their ratio, the
largest difference of any hidden state or logit between the two, and the whole `verify_file` now, so the share of
the prefill in a file's check shows. A benchmark, not a test: it exits 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.proofs import NODE, SIZES  # noqa: E402
from engine.generate import generate_rollouts  # noqa: E402
from engine.inference.torch_backend import TorchBackend  # noqa: E402
from engine.model.forward import forward_hidden  # noqa: E402
from engine.model.loading import load_model  # noqa: E402
from engine.model.tiny import init_model  # noqa: E402
from protocol.plan import Job  # noqa: E402
from protocol.rollouts import RolloutRow, encode_rollouts  # noqa: E402
from protocol.tasks.sources import open_source  # noqa: E402
from protocol.tasks.spec import load_task_spec  # noqa: E402
from validator.config import ValidatorConfig  # noqa: E402
from validator.recompute import prefill_outputs  # noqa: E402
from validator.verify import Expected, verify_file  # noqa: E402


def rows_alone(model, rows: Sequence[RolloutRow], batch_size: int) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """The baseline: the first route before issue 33, each row's prompt + completion but its last token in
    left-padded batches, position ids from 0."""
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        sequences = [row.input_tokens + row.output_tokens[:-1] for row in batch]
        width = max(len(s) for s in sequences)
        input_ids = torch.zeros((len(batch), width), dtype=torch.int64)  # (B, T)
        mask = torch.zeros((len(batch), width), dtype=torch.int64)  # (B, T)
        for i, sequence in enumerate(sequences):
            input_ids[i, width - len(sequence) :] = torch.tensor(sequence)
            mask[i, width - len(sequence) :] = 1
        longest = max(len(row.output_tokens) for row in batch)
        out = forward_hidden(
            model, input_ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), logits_last=longest
        )
        for i, row in enumerate(batch):
            n = len(row.output_tokens)
            yield start + i, out.hidden[i, width - n :], out.logits[i, longest - n :]


def fed_tokens(model, action: Callable[[], object]) -> int:
    fed: list[int] = []
    hook = model.get_input_embeddings().register_forward_hook(lambda _m, args, _o: fed.append(args[0].numel()))
    try:
        action()
    finally:
        hook.remove()
    return sum(fed)


def median_seconds(action: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--task", type=Path, default=REPO / "configs" / "tasks" / "default.toml")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--batch", type=int, default=ValidatorConfig().prefill_batch_size, help="rows a forward")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as scratch:
        loaded = load_model(init_model(Path(scratch) / "model", seed=0, shape=SIZES[args.size]))
        spec = load_task_spec(args.task)
        source = open_source(spec)
        job = Job(pool_id=1, node=NODE, step=0, counter=0, prompts=args.prompts, group_size=args.group)
        generated = generate_rollouts(job, spec, source, loaded, TorchBackend.from_loaded(loaded))
        rows, model = generated.rows, loaded.model

        def before() -> list:
            return list(rows_alone(model, rows, args.batch))

        def after() -> list:
            return list(prefill_outputs(model, rows, args.batch))

        old = {i: (h, lg) for i, h, lg in before()}
        new = {i: (h, lg) for i, h, lg in after()}
        hidden_diff = max(float((old[i][0] - new[i][0]).abs().max()) for i in old)
        logit_diff = max(float((old[i][1] - new[i][1]).abs().max()) for i in old)
        tokens_before, tokens_after = fed_tokens(model, before), fed_tokens(model, after)
        before_s = median_seconds(before, args.repeats)
        after_s = median_seconds(after, args.repeats)
        data = encode_rollouts(generated.meta, rows)
        expected = Expected(node=NODE, pool_id=1, current_step=0)
        config = ValidatorConfig()
        verdict = verify_file(data, spec=spec, checkpoint=loaded, config=config, expected=expected, source=source)
        verify_s = median_seconds(
            lambda: verify_file(data, spec=spec, checkpoint=loaded, config=config, expected=expected, source=source),
            args.repeats,
        )

    prompt_tokens = sum(len(r.input_tokens) for r in rows)
    output_tokens = sum(len(r.output_tokens) for r in rows)
    print(
        f"{len(rows)} rows ({args.prompts} prompts x {args.group}), {prompt_tokens} prompt and {output_tokens} output "
        f"tokens; {args.size} model ({loaded.hidden_size} hidden), {args.threads} thread(s), {args.batch} rows a "
        f"forward; verify_file now: {'accepted' if verdict.accepted else 'REJECTED ' + str(verdict.reason)}"
    )
    print(f"  {'first route':<34} {'tokens fed':>10} {'seconds':>8}")
    print(f"  {'each row alone (before)':<34} {tokens_before:>10} {before_s:>8.3f}")
    print(f"  {'shared prompts (now)':<34} {tokens_after:>10} {after_s:>8.3f}")
    print(f"  speedup {before_s / after_s:.2f}x; tokens {tokens_before / tokens_after:.2f}x fewer")
    print(f"  largest difference: hidden {hidden_diff:.2e}, logit {logit_diff:.2e}")
    print(f"  verify_file now (every check): {verify_s:.3f} s, of which the prefill about {after_s / verify_s:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
