"""False slashes at volume: honest rows through the validator's own code, and cheating rows at the same thresholds.

    .venv/bin/python benchmarks/false_slash.py [--quick] [--rows 100000] [--model DIR] [--backend vllm]
        [--dtype bfloat16]

Honest files are made by the worker's code (`generate_rollouts` with `TorchBackend`, in a worker thread as the
daemon runs it) and judged by the validator's (`validator.verify.verify_file`, every check), under the conditions
that differ between a worker and a validator in real life:

- torch threads 1 and 2 on each side;
- idle cores, or one busy-loop process per core beside both;
- a new policy arriving mid-generation: another thread loads a checkpoint while the worker generates, and the
  file is generated with the freshly loaded copy (what the worker's prefetch does);
- batch shapes: prompts x group size (groups share one prompt prefill whose KV cache is copied to each
  request), the worker's decode batch, the validator's prefill batch (cycled file by file).

Per condition it prints the rows, the false rejects of `verify_file` (the goal is 0), the rejects toploc's own
comparison would have made on the same recomputed hidden states (the code before issue 17), the chunks whose
near-tie boundary entries were left out, and the largest honest statistic of each threshold. Then, at the same
thresholds, the share of cheating rows the validator's row check catches: completions from a one-step-stale
model (1e-3 noise on the weights), from another model (another init), and honest rows with one output token
changed (reason 7 by the proof, or 5 by the sampling recheck when it is the last token).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import math
import multiprocessing
import random
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import toploc
import torch

from engine.generate import Generated, generate_rollouts, sampling_params
from engine.inference.sampler import claimed_gaps
from engine.inference.select import Engine, choose
from engine.memory import longest_sequence
from engine.model.loading import LoadedModel, load_model
from engine.proofs import PROOF_CHUNK, ProofCheck, proof_topk, split_proof, verify_proof
from protocol.plan import Job
from protocol.rollouts import RolloutRow, encode_rollouts
from protocol.tasks.problem import TaskSource
from protocol.tasks.sources import open_source
from protocol.tasks.spec import TaskSpec, load_task_spec
from validator.config import ValidatorConfig
from validator.recompute import check_row_recomputed, prefill_outputs
from validator.verify import verify_file

REPO = Path(__file__).resolve().parent.parent
NODE = "0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc"
# (prompts, group size, worker decode batch, validator prefill batch), cycled file by file
SHAPES = [(8, 8, 64, 8), (16, 4, 64, 8), (4, 16, 16, 32), (32, 1, 32, 1), (8, 24, 192, 8), (2, 2, 1, 4)]


@dataclass(frozen=True)
class Condition:
    worker_threads: int
    validator_threads: int
    busy: bool
    prefetch: bool

    def __str__(self) -> str:
        load = "busy" if self.busy else "idle"
        return f"w{self.worker_threads} v{self.validator_threads} {load}{' +prefetch' if self.prefetch else ''}"


@dataclass
class Tally:
    files: int = 0
    rows: int = 0
    rejected: int = 0  # files verify_file rejected as slashable: each one a false slash
    borderline: int = 0  # files refused as borderline (not clear on the second route): refused, not slashed
    toploc_rejected: int = 0  # rows toploc's comparison would have failed (the code before issue 17)
    skipped_chunks: int = 0  # chunks with a near-tie boundary entry left out
    worst: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WORST, 0.0))
    reasons: list[str] = field(default_factory=list)


WORST = ("exp_mismatches", "mant_err_mean", "mant_err_median", "boundary_skipped", "sampling_gap", "logprob_diff")


def busy_loop() -> None:
    while True:
        pass


def load_until(model_dir: Path, stop: threading.Event) -> None:
    """A prefetch that never ends: the next policy loading in another thread while the worker generates."""
    while not stop.is_set():
        load_model(model_dir)


ENGINES: dict[str, Engine] = {}  # the worker's engine, one per backend for the whole run (vLLM's is built once)


def rows_of(job: Job, spec: TaskSpec, source: TaskSource, loaded: LoadedModel, batch: int, backend: str) -> Generated:
    if backend not in ENGINES:
        choice = choose(backend, "cpu", dtype=spec.sampling.dtype)
        longest = functools.partial(longest_sequence, spec, source)  # vLLM's max_model_len, as the worker sets it
        ENGINES[backend] = Engine(choice, batch_size=batch, sequence_tokens=longest)
    engine = ENGINES[backend]
    engine.batch_size = batch
    if backend == "torch":
        return generate_rollouts(job, spec, source, loaded, engine.backend(loaded))
    # vLLM generates on the engine's own thread, as the worker does: its CPU attention refuses a thread whose OpenMP
    # count differs from the one it started with, and the conditions change the calling thread's count
    return engine.thread.submit(lambda: generate_rollouts(job, spec, source, loaded, engine.backend(loaded))).result()


def diagnose(rows: list[RolloutRow], model: LoadedModel, config: ValidatorConfig, spec: TaskSpec, tally: Tally) -> None:
    """What each threshold saw on these honest rows, and toploc's own verdict on the same hidden states."""
    params = sampling_params(spec)
    th = config.thresholds
    for index, hidden, full in prefill_outputs(model.model, rows, config.prefill_batch_size):
        row = rows[index]
        logits = full[..., : model.sampled_vocab_size]  # the ids the sampler draws from, as the validator reads them
        check: ProofCheck = verify_proof(hidden, row.proofs, th)
        for chunk in check.chunks:
            for name in ("exp_mismatches", "mant_err_mean", "mant_err_median", "boundary_skipped"):
                tally.worst[name] = max(tally.worst[name], float(getattr(chunk, name)))
            tally.skipped_chunks += chunk.boundary_skipped > 0
        n_out, size = hidden.shape
        bf16 = hidden.detach().to(torch.bfloat16).contiguous()
        chunks = split_proof(row.proofs, n_out, size)
        assert isinstance(chunks, list)
        theirs = toploc.verify_proofs_bytes(bf16, chunks, PROOF_CHUNK, proof_topk(size), skip_prefill=True)
        tally.toploc_rejected += any(
            r.exp_mismatches > th.max_exp_mismatches
            or r.mant_err_mean > th.max_mant_err_mean
            or r.mant_err_median > th.max_mant_err_median
            for r in theirs
        )
        tokens = torch.tensor(row.output_tokens)
        positions = torch.arange(len(row.output_tokens))
        gap = float(claimed_gaps(logits, tokens, row.seed, positions, params).max())
        tally.worst["sampling_gap"] = max(tally.worst["sampling_gap"], gap)
        recorded = torch.tensor(row.output_logprobs, dtype=torch.float64)
        recomputed = torch.log_softmax(logits.float() / params.temperature, -1).gather(-1, tokens[:, None])[:, 0]
        difference = float((recorded - recomputed.double()).abs().max())  # as check_logprobs computes it
        tally.worst["logprob_diff"] = max(tally.worst["logprob_diff"], difference)


def honest_runs(
    conditions: list[Condition], rows_wanted: int, model_dir: Path, spec: TaskSpec, backend: str = "torch"
) -> Iterator[tuple[Condition, Tally]]:
    source = open_source(spec)
    loaded = load_model(model_dir, dtype=dtype_of(spec))
    counter = itertools.count()
    per_condition = math.ceil(rows_wanted / len(conditions))
    for condition in conditions:
        tally = Tally()
        busy = [multiprocessing.Process(target=busy_loop, daemon=True) for _ in range(2 if condition.busy else 0)]
        for process in busy:
            process.start()
        stop = threading.Event()
        loader = threading.Thread(target=load_until, args=(model_dir, stop))
        try:
            if condition.prefetch:
                loader.start()
            torch.set_num_threads(condition.worker_threads)
            with ThreadPoolExecutor(1) as worker:  # the daemon generates in a worker thread (asyncio.to_thread)
                while tally.rows < per_condition:
                    prompts, group, decode_batch, prefill_batch = SHAPES[tally.files % len(SHAPES)]
                    job = Job(1, NODE, 0, next(counter), prompts, group)
                    # the newly held policy
                    held = load_model(model_dir, dtype=dtype_of(spec)) if condition.prefetch else loaded
                    generated = worker.submit(rows_of, job, spec, source, held, decode_batch, backend).result()
                    data = encode_rollouts(generated.meta, generated.rows)
                    torch.set_num_threads(condition.validator_threads)
                    config = ValidatorConfig.for_precision(spec.sampling.dtype, prefill_batch_size=prefill_batch)
                    verdict = verify_file(data, spec=spec, checkpoint=loaded, config=config, source=source)
                    diagnose(generated.rows, loaded, config, spec, tally)
                    torch.set_num_threads(condition.worker_threads)
                    tally.files += 1
                    tally.rows += len(generated.rows)
                    if verdict.borderline:  # refused, never slashed: counted apart from the slashable rejects
                        tally.borderline += 1
                        tally.reasons.append(f"counter {job.counter}: borderline: {verdict.detail}")
                    elif not verdict.accepted:
                        tally.rejected += 1
                        why = f"{verdict.reason!r} at {verdict.check}: {verdict.detail}"
                        tally.reasons.append(f"counter {job.counter}: {why}")
        finally:
            stop.set()
            if loader.is_alive():
                loader.join()
            for process in busy:
                process.kill()
        yield condition, tally


def cheating_rows(
    rows: list[RolloutRow], liar: LoadedModel, eos: tuple[int, ...], rng: random.Random
) -> list[RolloutRow]:
    """Each honest row with one output token changed (never turning a finished row into a malformed one)."""
    changed = []
    vocab = liar.sampled_vocab_size  # a token the model could have sampled, never an LM-head padding row
    for row in rows:
        last = len(row.output_tokens) - 1
        positions = list(range(last if row.finish_reason == "stop" else last + 1))
        if not positions:
            continue
        at = rng.choice(positions)
        tokens = list(row.output_tokens)
        tokens[at] = rng.choice([t for t in range(vocab) if t != tokens[at] and t not in eos])
        changed.append(dataclasses.replace(row, output_tokens=tokens))
    return changed


def detection(model_dir: Path, spec: TaskSpec, rows_wanted: int) -> dict[str, tuple[int, int]]:
    """(caught, rows) per kind of cheating, by the validator's row check at the default thresholds."""
    torch.set_num_threads(2)
    source = open_source(spec)
    honest = load_model(model_dir, dtype=dtype_of(spec))
    stale = load_model(model_dir, dtype=dtype_of(spec))
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in stale.model.parameters():
            param.add_((torch.randn(param.shape, generator=generator) * 1e-3).to(param.dtype))
    torch.manual_seed(11)
    foreign_model = type(honest.model)(honest.model.config).to(dtype_of(spec)).eval()  # type: ignore[arg-type]
    foreign = dataclasses.replace(honest, model=foreign_model)
    config = ValidatorConfig.for_precision(spec.sampling.dtype)
    params = sampling_params(spec)
    rng = random.Random(3)
    results: dict[str, tuple[int, int]] = {}
    for kind, liar in (("stale model (1e-3 noise)", stale), ("another model", foreign), ("one changed token", honest)):
        caught = total = 0
        counter = itertools.count(10**6)
        while total < rows_wanted:
            job = Job(1, NODE, 0, next(counter), min(16, math.ceil(rows_wanted / 8)), 8)  # 128 rows, or fewer
            rows = rows_of(job, spec, source, liar, 128, "torch").rows  # liars perturbed in memory
            if liar is honest:
                rows = cheating_rows(rows, honest, honest.eos_token_ids, rng)
            for index, hidden, logits in prefill_outputs(honest.model, rows, config.prefill_batch_size):
                result = check_row_recomputed(
                    index, rows[index], hidden, logits, params, config, vocab=honest.sampled_vocab_size
                )
                caught += not isinstance(result, ProofCheck)
                total += 1
        results[kind] = (caught, total)
    return results


def dtype_of(spec: TaskSpec) -> torch.dtype:
    return getattr(torch, spec.sampling.dtype)


def in_precision(task: Path, dtype: str) -> Path:
    """A copy of the task spec whose sampling.dtype is `dtype` (the pool's precision: both sides follow it)."""
    lines = task.read_text().splitlines()
    lines = [line for line in lines if not line.replace(" ", "").startswith("dtype=")]
    at = lines.index("[sampling]") + 1
    copy = Path(tempfile.mkdtemp(prefix="false-slash-")) / task.name
    copy.write_text("\n".join([*lines[:at], f'dtype = "{dtype}"', *lines[at:]]) + "\n")
    return copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 conditions, about 2,000 honest rows: a smoke run")
    parser.add_argument("--rows", type=int, help="honest rows in all (default 100,000; 2,000 with --quick)")
    parser.add_argument("--cheating-rows", type=int, help="rows per kind of cheating (3,000; quick 500; 0: none)")
    parser.add_argument(
        "--no-busy", action="store_true",
        help="no busy-loop processes beside the two sides (a large model's rows are slow enough already)",
    )  # fmt: skip
    parser.add_argument("--model", type=Path, help="model directory (default: the devnet's warm-start model)")
    parser.add_argument("--task", type=Path, default=REPO / "configs" / "tasks" / "default.toml")
    parser.add_argument(
        "--backend", choices=("torch", "vllm"), default="torch",
        help="the worker's engine for the honest rows (the validator always recomputes with the torch prefill)",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"),
        help="the pool's precision, which both sides follow (default: the task's sampling.dtype)",
    )  # fmt: skip
    args = parser.parse_args()
    spec = load_task_spec(in_precision(args.task, args.dtype) if args.dtype else args.task)
    if args.model is None:
        from devnet.warmstart import warm_start_model

        args.model, _ = warm_start_model(args.task, sft_steps=600)
    every = [
        Condition(w, v, busy, prefetch)
        for busy in (False, True)
        for w in (1, 2)
        for v in (1, 2)
        for prefetch in (False, True)
    ]
    quick = [Condition(1, 2, False, False), Condition(2, 1, not args.no_busy, True)]
    conditions = quick if args.quick else [c for c in every if not (args.no_busy and c.busy)]
    rows = args.rows if args.rows is not None else 2_000 if args.quick else 100_000  # 0: detection only
    cheating = args.cheating_rows if args.cheating_rows is not None else 500 if args.quick else 3_000
    defaults = ValidatorConfig.for_precision(spec.sampling.dtype)
    thresholds, margin, atol = defaults.thresholds, defaults.sampling_margin, defaults.logprob_atol
    print(
        f"model {args.model}; worker engine {args.backend}; {spec.sampling.dtype} on both sides; "
        f"thresholds {thresholds}; sampling margin {margin:g}, "
        f"log-prob atol {atol:g}"
    )
    print(
        f"{'condition':<22} {'files':>6} {'rows':>7} {'slashed files':>13} {'borderline':>10} {'toploc rejects':>14} "
        f"{'skipped':>7} {'exp':>4} {'mean':>7} {'median':>6} {'gap':>8} {'logprob':>8}"
    )
    total = Tally()
    for condition, tally in honest_runs(conditions, rows, args.model, spec, args.backend):
        w = tally.worst
        print(
            f"{condition!s:<22} {tally.files:>6} {tally.rows:>7} {tally.rejected:>13} {tally.borderline:>10} "
            f"{tally.toploc_rejected:>14} "
            f"{tally.skipped_chunks:>7} {w['exp_mismatches']:>4.0f} {w['mant_err_mean']:>7.4f} "
            f"{w['mant_err_median']:>6.1f} {w['sampling_gap']:>8.1e} {w['logprob_diff']:>8.1e}",
            flush=True,
        )
        for reason in tally.reasons[:5]:
            print(f"  rejected {reason}")
        total.files += tally.files
        total.rows += tally.rows
        total.rejected += tally.rejected
        total.borderline += tally.borderline
        total.toploc_rejected += tally.toploc_rejected
        total.skipped_chunks += tally.skipped_chunks
        total.worst = {k: max(total.worst[k], w[k]) for k in WORST}
    w = total.worst
    print(
        f"honest rows {total.rows} in {total.files} files: false slashes {total.rejected}, "
        f"borderline {total.borderline}; "
        f"toploc's comparison would have rejected {total.toploc_rejected} rows"
    )
    print(
        "smallest margins: exponent mismatches "
        f"{thresholds.max_exp_mismatches - w['exp_mismatches']:.0f} of {thresholds.max_exp_mismatches}, "
        f"mantissa mean {thresholds.max_mant_err_mean - w['mant_err_mean']:.4f} of {thresholds.max_mant_err_mean}, "
        f"median {thresholds.max_mant_err_median - w['mant_err_median']:.1f} of {thresholds.max_mant_err_median}, "
        f"boundary skips {thresholds.max_boundary_skips - w['boundary_skipped']:.0f} "
        f"of {thresholds.max_boundary_skips}, "
        f"sampling gap {margin - w['sampling_gap']:.2e} of {margin:g}, "
        f"log-prob {atol - w['logprob_diff']:.2e} of {atol:g}"
    )
    if cheating == 0:  # --cheating-rows 0: honest rows only (another run of the same model measured detection)
        return
    started = time.perf_counter()
    for kind, (caught, n) in detection(args.model, spec, cheating).items():
        print(f"detected {kind}: {caught}/{n} rows ({100 * caught / n:.2f}%)")
    print(f"detection measured in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
