"""Does RL learn? The local mode of `prime-train run` from the SFT warm-started tiny model on the default task.

Run: `.venv/bin/python benchmarks/learning.py [--minutes 10] [--workers 2]`.

1. The SFT model: `prime-train init-model` (seed 0) then `prime-train sft` (600 steps), cached in
   ~/.cache/prime-node/warm-start/ by the task's spec hash and the SFT settings (about 3 minutes the first time;
   `devnet/warmstart.py`, shared with `prime-devnet up`).
2. Its pass rate on the task's held-out problems (the last 256, which neither SFT nor RL ever trains on), 4 samples
   each at the task's own sampling (temperature 1).
3. The RL task: the other 9,744 problems, and of those only the ones whose pass rate under the SFT model lies in
   `--band` (the offline filter of `prime-train filter`, 8 samples each; about 70 s the first time, then cached
   with the SFT model). `--band 0 1` keeps them all.
4. `prime-train run --local-workers N --max-minutes M`: the coordinator, the SHARDCAST origin and N worker
   processes (the worker daemon of `prime-node start` in local mode, `python -m node.daemon.local`) that fetch
   each new policy, generate with proofs, journal and upload; the trainer trains on what arrives and
   measures the held-out problems every `--eval-every` steps (`[eval] task`). Local mode keeps its keys in
   encrypted keystores (`run/keys/`); their password is PRIME_KEYSTORE_PASSWORD, or, when that is not set, a random
   one made for this run and passed to `prime-train run` in its environment. The run folder is replaced at every
   start, so nothing needs the throwaway password afterwards.
5. The pass rate of the last policy on the same problems, the same samples, the same seeds; the reward curve
   (`prime-train plot`) and the trainer's idle time.

The goal of issue 5: at least +25 points of pass rate within 10 minutes on a 2-core machine. It also prints the
trainer's seconds per step beside the reference of docs/trainer.md (REFERENCE_STEP_SECONDS: 0.36 s on an idle
2-core machine, local mode, k = 2), so a change that slows the step shows. `--short` is the check any change that
touches the trainer can afford: 3 minutes, 64 held-out problems x 2 samples, evaluations every 50 steps.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# the packages first: run as a script, this folder is sys.path[0], and its shardcast.py would shadow the shardcast
# package that trainer.config imports
sys.path.insert(0, str(REPO))
TASK = REPO / "configs" / "tasks" / "default.toml"
# The trainer's seconds per step (Learner.train_step) in docs/trainer.md's k = 2 runs: 1,211 steps in 430 s busy,
# local mode, one worker, one training thread, on an idle 2-core machine.
REFERENCE_STEP_SECONDS = 0.36
SHORT = {"minutes": 3.0, "eval_problems": 64, "eval_samples": 2, "eval_every": 50}


def prime_train(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([sys.executable, "-m", "trainer.cli", *args], check=True, cwd=REPO, env=env)


def keystore_env() -> dict[str, str]:
    """The environment of `prime-train run`: PRIME_KEYSTORE_PASSWORD as set, else a throwaway one for this run."""
    from ledger.accounts import PASSWORD_ENV_VAR

    if os.environ.get(PASSWORD_ENV_VAR):
        return dict(os.environ)
    return os.environ | {PASSWORD_ENV_VAR: secrets.token_urlsafe(24)}


def sft_model(sft_steps: int, seed: int) -> Path:
    from devnet.warmstart import DEFAULT_CACHE, warm_start_model

    print(f"SFT model: building or loading ({sft_steps} steps, seed {seed}) in {DEFAULT_CACHE}")
    started = time.perf_counter()
    model, cached = warm_start_model(TASK, sft_steps=sft_steps, seed=seed)
    print(f"SFT model: {model} ({'cached' if cached else f'{time.perf_counter() - started:.0f} s'})")
    return model


def held_out_rate(model: Path, problems: int, samples: int) -> float:
    from trainer.evaluate import held_out_pass_rate

    return held_out_pass_rate(model, TASK, problems=problems, samples=samples, seed=123).rate


def training_task(model: Path, args: argparse.Namespace) -> Path:
    """The task RL draws problems from: the default task without its held-out problems, which only the
    evaluations see, and of the others only the problems whose pass rate under `model` lies in `--band`
    (`devnet.warmstart.rl_task`, shared with `prime-devnet up`; cached with the SFT model)."""
    from devnet.warmstart import rl_task

    task, _ = rl_task(model, TASK, held_out=args.eval_problems, band=tuple(args.band), seed=args.seed)
    return task


def write_config(path: Path, run_dir: Path, model: Path, task: Path, args: argparse.Namespace) -> None:
    """A local-mode trainer.toml for the run: `TrainerSettings` (trainer/config.py) written with `to_toml`."""
    from trainer.config import (
        CoordinatorSettings,
        DataSettings,
        EvalSettings,
        LocalSettings,
        RunSettings,
        ShardcastSettings,
        TrainerSettings,
    )
    from trainer.learner import OptimConfig

    settings = TrainerSettings(
        run=RunSettings(
            dir=run_dir, model=model, task=task, steps=100_000, max_minutes=args.minutes, threads=args.train_threads
        ),
        data=DataSettings(async_level=args.async_level, rollouts_per_step=args.rollouts_per_step),
        optim=OptimConfig(lr=args.lr, vector_lr_scale=args.vector_lr_scale, warmup_steps=3, micro_batch_tokens=16384),
        coordinator=CoordinatorSettings(port=0, prompts_per_task=args.prompts_per_task, group_size=args.group_size),
        shardcast=ShardcastSettings(port=0, keep=args.async_level + 3),
        evaluation=EvalSettings(every=args.eval_every, problems=128, task=TASK),
        local=LocalSettings(workers=args.workers, threads=1),
    )
    path.write_text(settings.to_toml())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget of the RL run")
    parser.add_argument("--workers", type=int, default=1, help="local workers (1 leaves the trainer a core)")
    parser.add_argument("--model", type=Path, help="start from this model instead of the cached SFT model")
    parser.add_argument("--sft-steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--vector-lr-scale", type=float, default=10.0, help="lr multiplier for norm gains and biases")
    parser.add_argument("--async-level", type=int, default=2, help="k; local mode takes the oldest files first")
    parser.add_argument("--rollouts-per-step", type=int, default=256)
    parser.add_argument("--prompts-per-task", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--train-threads", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--eval-problems", type=int, default=256)
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument(
        "--band",
        type=float,
        nargs=2,
        default=(0.1, 0.9),
        metavar=("MIN", "MAX"),
        help="offline filter: RL draws only problems whose SFT pass rate lies in [MIN, MAX] (0 1: all of them)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "learning", help="run folder (replaced)")
    quick = ", ".join(f"{k} {v}" for k, v in SHORT.items())
    parser.add_argument("--short", action="store_true", help=f"the trainer's quick check: {quick}")
    args = parser.parse_args()
    if args.short:
        for name, value in SHORT.items():
            setattr(args, name, value)
    args.out = args.out.resolve()  # the run folder goes into a config file read from another directory

    model = args.model or sft_model(args.sft_steps, args.seed)
    before = held_out_rate(model, args.eval_problems, args.eval_samples)
    print(f"pass rate before RL: {before:.1%} ({args.eval_problems} held-out problems x {args.eval_samples})")

    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    config = args.out / "trainer.toml"
    task = training_task(model, args)
    write_config(config, args.out / "run", model, task, args)
    started = time.perf_counter()
    prime_train("run", "--config", str(config), "--json", env=keystore_env())
    seconds = time.perf_counter() - started

    records = [json.loads(line) for line in (args.out / "run" / "metrics.jsonl").read_text().splitlines()]
    last_step = records[-1]["step"]
    final = args.out / "run" / "checkpoints" / f"step_{last_step}"
    after = held_out_rate(final, args.eval_problems, args.eval_samples)
    png = args.out / "reward.png"
    prime_train("plot", "--metrics", str(args.out / "run" / "metrics.jsonl"), "--out", str(png))
    idle = records[-1]["idle_seconds_total"]
    train = sum(r["train_seconds"] for r in records)
    rows = sum(r["rows"] for r in records)
    print()
    print(f"{'':28}{'value':>12}")
    print(f"{'RL wall time (s)':28}{seconds:12.0f}")
    print(f"{'policy steps':28}{last_step:12d}")
    print(f"{'completions trained on':28}{rows:12d}")
    print(f"{'trainer busy (s)':28}{train:12.0f}")
    per_step = train / max(last_step, 1)
    print(
        f"{'trainer seconds per step':28}{per_step:12.3f}   reference {REFERENCE_STEP_SECONDS:.2f} (docs/trainer.md):"
        f" {per_step / REFERENCE_STEP_SECONDS:.2f}x"
    )
    print(f"{'trainer idle (s)':28}{idle:12.0f}   {idle / max(seconds, 1e-9):.0%} of the run waiting for data")
    print(f"{'pass rate before':28}{before:12.1%}")
    print(f"{'pass rate after':28}{after:12.1%}")
    print(f"{'change (points)':28}{100 * (after - before):+12.1f}   goal: >= +25 within 10 minutes")
    print(f"reward curve: {png}")


if __name__ == "__main__":
    main()
