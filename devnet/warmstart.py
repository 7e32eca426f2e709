"""The SFT warm-started tiny model that RL starts from, built once per task and cached.

RL from a random tiny model never samples a correct answer, so it has nothing to learn from: `prime-train sft`
first teaches the answer format on the task's worked answers (the last problems held out). Building it takes
about 3 minutes on 2 cores, so the result is cached under `~/.cache/prime-node/warm-start/`, keyed by the task's
spec hash, the seed and the number of SFT steps; `prime-devnet up` and `benchmarks/learning.py` share it.

The model is made by the trainer's own commands (`python -m trainer.cli init-model` and `sft`) in child processes:
`node` does not import `trainer` (DESIGN section 2). The folder appears by rename, whole, so a run killed midway
leaves no half-built model in the cache.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from core.errors import NodeError
from protocol.tasks.spec import load_task_spec, spec_hash

DEFAULT_CACHE = Path.home() / ".cache" / "prime-node" / "warm-start"


class WarmStartError(NodeError):
    """Making the warm-start model failed; the message names the command and the log with its output."""


def cache_key(task: Path, *, sft_steps: int, seed: int) -> str:
    return f"{spec_hash(load_task_spec(task)).hex()[:16]}-seed{seed}-sft{sft_steps}"


def warm_start_model(
    task: Path, *, sft_steps: int, seed: int = 0, cache: Path = DEFAULT_CACHE, log: Path | None = None
) -> tuple[Path, bool]:
    """The model folder and whether it came from the cache. `sft_steps=0` gives the random initial model.

    The commands' output is appended to `log` (default: a file next to the cached model)."""
    target = cache / cache_key(task, sft_steps=sft_steps, seed=seed)
    model = target / "model"
    if (model / "config.json").is_file():
        return model, True
    cache.mkdir(parents=True, exist_ok=True)
    log = log or cache / f"{target.name}.log"
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache))
    try:
        initial = work / "model" if sft_steps == 0 else work / "initial"
        _trainer(log, "init-model", "--out", str(initial), "--seed", str(seed))
        if sft_steps:
            sft = ("sft", "--model", str(initial), "--task", str(task), "--out", str(work / "model"))
            # --eval also sets how many of the last problems SFT holds out: keep the default 256
            _trainer(log, *sft, "--steps", str(sft_steps), "--seed", str(seed))
            shutil.rmtree(initial)
        try:
            work.rename(target)
        except OSError:  # another process finished the same model first: use theirs
            if not (model / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return model, False


DEFAULT_BAND = (0.1, 0.9)  # the SFT pass rates of the problems RL learns most from (docs/trainer.md)


def rl_task(
    model: Path,
    task: Path,
    *,
    held_out: int,
    band: tuple[float, float] = DEFAULT_BAND,
    seed: int = 0,
    cache: Path = DEFAULT_CACHE,
    log: Path | None = None,
) -> tuple[Path, bool]:
    """The task RL draws from, and whether it came from the cache: `task` without its last `held_out` problems,
    which only the held-out evaluations see, and of the others only those whose pass rate under `model` lies in
    `band` (`prime-train filter`, 8 samples each; about 70 s on 2 cores the first time, then cached with the model,
    keyed by the model's hash, the held-out count, the band and the seed). `benchmarks/learning.py` and
    `prime-devnet up` share it, so both learn from the same problems."""
    from engine.model.loading import model_hash_of
    from protocol.tasks.sources import open_source

    low, high = band
    if not 0.0 <= low <= high <= 1.0:
        raise WarmStartError(f"the band must satisfy 0 <= min <= max <= 1, not {low}, {high}")
    name = f"rl-task-{model_hash_of(model).hex()[:16]}-holdout{held_out}-band{low}-{high}-seed{seed}"
    target = cache / name / "task.toml"
    if target.is_file():
        return target, True
    problems = sum(1 for _ in open_source(load_task_spec(task)).problem_ids())
    if not 0 < held_out < problems:
        raise WarmStartError(f"cannot hold out {held_out} of the task's {problems} problems")
    target.parent.mkdir(parents=True, exist_ok=True)
    _trainer(
        log or target.parent / "filter.log", "filter", "--model", str(model), "--task", str(task), "--out", str(target),
        "--limit", str(problems - held_out), "--min", str(low), "--max", str(high), "--seed", str(seed), "--overwrite",
    )  # fmt: skip
    return target, False


def _trainer(log: Path, *args: str) -> None:
    command = [sys.executable, "-m", "trainer.cli", *args]
    with log.open("ab") as out:
        out.write(f"$ prime-train {' '.join(args)}\n".encode())
        out.flush()
        finished = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if finished.returncode != 0:
        raise WarmStartError(f"`prime-train {args[0]}` exited with code {finished.returncode}; its output is in {log}")
