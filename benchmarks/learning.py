"""Does RL learn? The local mode of `prime-train run` from the SFT warm-started tiny model on the default task.

Run: `.venv/bin/python benchmarks/learning.py [--minutes 10] [--workers 2]`.

1. The SFT model: `prime-train init-model` (seed 0) then `prime-train sft` (600 steps), cached in
   ~/.cache/prime-node/warm-start/ by the task's spec hash and the SFT settings (about 3 minutes the first time;
   `node/devnet/warmstart.py`, shared with `prime-devnet up`).
2. Its pass rate on the task's held-out problems (the last 256, which SFT never trains on), 4 samples each at the
   task's own sampling (temperature 1).
3. `prime-train run --local-workers N --max-minutes M`: the coordinator, the SHARDCAST origin and N worker
   processes that fetch each new policy, generate with proofs and upload; the trainer trains on what arrives.
4. The pass rate of the last policy on the same problems, the same samples, the same seeds; the reward curve
   (`prime-train plot`) and the trainer's idle time.

The goal of issue 5: at least +25 points of pass rate within 10 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TASK = REPO / "configs" / "tasks" / "default.toml"


def prime_train(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "trainer.cli", *args], check=True, cwd=REPO)


def sft_model(sft_steps: int, seed: int) -> Path:
    from node.devnet.warmstart import DEFAULT_CACHE, warm_start_model

    print(f"SFT model: building or loading ({sft_steps} steps, seed {seed}) in {DEFAULT_CACHE}")
    started = time.perf_counter()
    model, cached = warm_start_model(TASK, sft_steps=sft_steps, seed=seed)
    print(f"SFT model: {model} ({'cached' if cached else f'{time.perf_counter() - started:.0f} s'})")
    return model


def held_out_rate(model: Path, problems: int, samples: int) -> float:
    from trainer.evaluate import held_out_pass_rate

    return held_out_pass_rate(model, TASK, problems=problems, samples=samples, seed=123).rate


def write_config(path: Path, run_dir: Path, model: Path, args: argparse.Namespace) -> None:
    path.write_text(
        f"""[run]
dir = "{run_dir}"
model = "{model}"
task = "{TASK}"
steps = 100000
max_minutes = {args.minutes}
threads = {args.train_threads}

[data]
async_level = {args.async_level}
rollouts_per_step = {args.rollouts_per_step}

[optim]
lr = {args.lr}
vector_lr_scale = {args.vector_lr_scale}
warmup_steps = 3
micro_batch_tokens = 16384

[coordinator]
port = 0
prompts_per_task = {args.prompts_per_task}
group_size = {args.group_size}

[shardcast]
port = 0
keep = {args.async_level + 3}

[eval]
every = {args.eval_every}
problems = 128

[local]
workers = {args.workers}
threads = 1
"""
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget of the RL run")
    parser.add_argument("--workers", type=int, default=1, help="local workers (1 leaves the trainer a core)")
    parser.add_argument("--model", type=Path, help="start from this model instead of the cached SFT model")
    parser.add_argument("--sft-steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--vector-lr-scale", type=float, default=1.0, help="lr multiplier for norm gains and biases")
    parser.add_argument("--async-level", type=int, default=1)
    parser.add_argument("--rollouts-per-step", type=int, default=256)
    parser.add_argument("--prompts-per-task", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--train-threads", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-problems", type=int, default=256)
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "learning", help="run folder (replaced)")
    args = parser.parse_args()
    args.out = args.out.resolve()  # the run folder goes into a config file read from another directory

    model = args.model or sft_model(args.sft_steps, args.seed)
    before = held_out_rate(model, args.eval_problems, args.eval_samples)
    print(f"pass rate before RL: {before:.1%} ({args.eval_problems} held-out problems x {args.eval_samples})")

    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    config = args.out / "trainer.toml"
    write_config(config, args.out / "run", model, args)
    started = time.perf_counter()
    prime_train("run", "--config", str(config), "--json")
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
    print(f"{'trainer idle (s)':28}{idle:12.0f}   {idle / max(seconds, 1e-9):.0%} of the run waiting for data")
    print(f"{'pass rate before':28}{before:12.1%}")
    print(f"{'pass rate after':28}{after:12.1%}")
    print(f"{'change (points)':28}{100 * (after - before):+12.1f}   goal: >= +25 within 10 minutes")
    print(f"reward curve: {png}")


if __name__ == "__main__":
    main()
