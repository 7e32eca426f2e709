"""The trainer's resident memory over training steps, by where the steps run: the cause of the coordinator's growth
under benchmarks/scale.py, side by side with its fix in one run.

Run: `.venv/bin/python benchmarks/train_memory.py` (`--steps`, `--files-per-step`, `--threads`, `--file PATH`).

Three ways of running the same steps of the real `Learner` (the tiny model on CPU, the files of benchmarks/scale.py:
8 prompts x 8 completions each), each in a process of its own so that none inherits another's heap:
- "threads in turn": step i on thread i mod `--threads`, as the event loop's default pool handed the step loop's
  calls to whichever of its threads was idle (min(32, cores + 4) of them, shared with role lookups and the rest);
- "one thread": every step on one thread (`trainer.memory.TrainingThread`, what `prime-train run` does now);
- "one thread + release": the same, and `core.heap.release_free_memory` after each step (issue 32);
- "one thread + release above": the same, but only while malloc keeps more than `trainer.loop.KEEP_FREE_BYTES`
  (256 MiB) free (what it does now: a step reuses what the last one freed instead of faulting it in again).

Printed per way: the process's RSS after the first and the last step, the peak, and malloc's bytes in use and free
(kept in its arenas) after the last step, the median seconds of a step (its release included); then the ratio of
each way's last RSS to the first way's. A benchmark,
not a test: it exits 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WAYS = ("threads in turn", "one thread", "one thread + release", "one thread + release above")


def rss_bytes() -> tuple[int, int]:
    """(RSS, peak RSS) of this process, from /proc."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) << 10, int(fields["VmHWM"].split()[0]) << 10


def run_way(way: str, file: Path, model: Path, steps: int, files_per_step: int, threads: int) -> dict[str, object]:
    """Trains `steps` steps the way `way` says, in this process; returns what memory did."""
    import torch

    from core.heap import heap_bytes, release_free_memory
    from engine.model.loading import load_model
    from protocol.rollouts import read_rollouts
    from trainer.learner import Learner, LearnerConfig
    from trainer.precision import resolve_precision

    torch.set_num_threads(1)
    template = read_rollouts(file, max_bytes=1 << 26)
    loaded = load_model(model)
    learner = Learner(loaded.model, LearnerConfig(), pad_id=loaded.tokenizer.pad_token_id or 0,
                      precision=resolve_precision("cpu", "float32"))  # fmt: skip
    pools = [ThreadPoolExecutor(1) for _ in range(threads if way == "threads in turn" else 1)]

    def step() -> None:
        rows = [dataclasses.replace(row, step=learner.step) for row in template.rows]
        files = [dataclasses.replace(template, rows=rows, work_key=bytes([k]) * 32) for k in range(files_per_step)]
        learner.train_step(files)

    from trainer.loop import KEEP_FREE_BYTES

    after: list[int] = []
    seconds: list[float] = []
    for i in range(steps):
        started = time.perf_counter()
        pools[i % len(pools)].submit(step).result()
        if way.endswith("release"):
            release_free_memory()
        elif way.endswith("release above"):
            release_free_memory(above=KEEP_FREE_BYTES)
        seconds.append(time.perf_counter() - started)
        after.append(rss_bytes()[0])
    in_use, free = heap_bytes() or (0, 0)
    return {"way": way, "rss_after_step": after, "peak": rss_bytes()[1], "heap_in_use": in_use, "heap_free": free,
            "step_seconds": statistics.median(seconds[1:] or seconds)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=8, help="training steps per way")
    parser.add_argument("--files-per-step", type=int, default=4, help="files of 64 completions a step trains on")
    parser.add_argument("--threads", type=int, default=min(32, (os.cpu_count() or 1) + 4),
                        help="threads taking steps in turn (the default pool's size)")  # fmt: skip
    parser.add_argument("--file", type=Path, help="a rollout file to train on (default: generate one as scale.py)")
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # one way, in this process (the children)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.way is not None:
        result = run_way(args.way, args.file, args.model, args.steps, args.files_per_step, args.threads)
        print(json.dumps(result))
        return 0
    with tempfile.TemporaryDirectory(prefix="train-memory-") as folder:
        root = Path(folder)
        from engine.model.tiny import init_model

        model = init_model(root / "tiny", seed=0)
        file = args.file
        if file is None:
            from benchmarks.scale import FileMaker

            (root / "files").mkdir()  # a folder of its own: FileMaker makes its own tiny model in it
            FileMaker.generate(root / "files")  # the tiny model writes files/template.parquet
            file = root / "files" / "template.parquet"
        results = []
        for way in WAYS:
            command = [sys.executable, __file__, "--way", way, "--file", str(file), "--model", str(model),
                       "--steps", str(args.steps), "--files-per-step", str(args.files_per_step),
                       "--threads", str(args.threads)]  # fmt: skip
            env = os.environ | {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
            done = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"  {way}: done", flush=True)
    mib = 1 << 20
    base = results[0]["rss_after_step"][-1]
    print(f"\n{args.steps} steps of {args.files_per_step} files (64 completions each), tiny model on CPU:")
    print(
        f"  {'way':<28} {'RSS step 1':>10} {'RSS last':>9} {'peak':>7} {'in use':>7} {'free kept':>9} {'ratio':>6}"
        f" {'s/step':>7}"
    )
    for r in results:
        after = r["rss_after_step"]
        print(
            f"  {r['way']:<28} {after[0] / mib:>7.0f} MiB {after[-1] / mib:>5.0f} MiB {r['peak'] / mib:>4.0f} MiB "
            f"{r['heap_in_use'] / mib:>4.0f} MiB {r['heap_free'] / mib:>6.0f} MiB {after[-1] / base:>6.2f}"
            f" {r['step_seconds']:>7.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
