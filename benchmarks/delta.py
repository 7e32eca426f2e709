"""Delta checkpoints, measured: the bytes of one step's delta against the full checkpoint (shardcast/delta.py).

    .venv/bin/python benchmarks/delta.py [--layers 2] [--steps 3] [--lrs 1e-6 1e-5 1e-4] [--skip-real]

For each model (the tiny one; Qwen2.5-0.5B's shape with `--layers` of its 24 layers) and each learning rate, the
trainer's own loop (`trainer.sharded.open_loop`: float32 master weights, AdamW without warm-up, so every step is at
the stated rate) takes `--steps` consecutive GRPO steps on one rollout file of that model (4 prompts x 4 completions
of the default task, rewards 1, 0, 1, 0 within each group so that every group has a gradient). Before the first step
and after each one the policy is written as a pool of each precision would publish it: every tensor in the pool's
precision (bfloat16, float32), one safetensors file, the tied LM head once. Each step's delta against the step before
is encoded, applied to the step before and compared byte for byte with the step, and the last step's delta against
the first is encoded too (a client that many steps behind: one delta, against the chain of single-step ones).

Per model, precision and rate it prints: the full file's bytes, the mean delta's bytes and its share of the full,
the share of words changed, the seconds to encode and to apply one delta, and the direct and chained deltas from the
first step to the last.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TASK = REPO / "configs" / "tasks" / "default.toml"
NODE = "0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc"
DTYPES = ["bfloat16", "float32"]  # the pools' precisions measured (--dtypes)


@dataclasses.dataclass
class Row:
    model: str
    dtype: str
    lr: float
    full: int = 0
    deltas: list[int] = dataclasses.field(default_factory=list)
    changed: list[float] = dataclasses.field(default_factory=list)
    encode: list[float] = dataclasses.field(default_factory=list)
    apply: list[float] = dataclasses.field(default_factory=list)
    direct: int = 0  # first step -> last step, one delta
    direct_changed: float = 0.0


def published(model: Any, dtype: str, out: Path) -> Path:
    """The policy as a pool of `dtype` publishes it: every tensor in `dtype`, a tied head once."""
    import torch
    from safetensors.torch import save_file

    seen: set[int] = set()
    tensors = {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        tensors[name] = tensor.detach().to(getattr(torch, dtype)).contiguous()
    save_file(tensors, str(out))
    return out


def rollout_file(model_dir: Path, work: Path) -> Any:
    """One file of the model's own completions, rewards 1, 0, 1, 0 within each group."""
    from benchmarks.real_shape import mixed_rewards
    from engine.generate import generate_rollouts
    from engine.inference.torch_backend import TorchBackend
    from engine.model.loading import load_model
    from protocol.plan import Job
    from protocol.rollouts import read_rollouts
    from protocol.tasks.sources import open_source
    from protocol.tasks.spec import load_task_spec
    from protocol.terms import MAX_FILE_BYTES

    spec = load_task_spec(TASK)
    source = open_source(spec)
    loaded = load_model(model_dir)
    job = Job(pool_id=0, node=NODE, step=0, counter=0, prompts=4, group_size=4)
    written = generate_rollouts(job, spec, source, loaded, TorchBackend.from_loaded(loaded)).write(
        work / "file.parquet"
    )
    return mixed_rewards(read_rollouts(written.path, max_bytes=MAX_FILE_BYTES))


def measure(label: str, model_dir: Path, lrs: list[float], steps: int, work: Path) -> list[Row]:
    from protocol.tasks.sources import open_source
    from protocol.tasks.spec import load_task_spec
    from shardcast.delta import apply_delta, encode_delta
    from trainer.learner import LearnerConfig, World
    from trainer.loop import RunPaths
    from trainer.precision import resolve_precision
    from trainer.sharded import open_loop

    spec = load_task_spec(TASK)
    source = open_source(spec)
    file = rollout_file(model_dir, work)
    rows = []
    for lr in lrs:
        config = LearnerConfig(lr=lr, warmup_steps=0, temperature=spec.sampling.temperature or 1.0)
        paths, precision = RunPaths(work / f"run-{lr:g}"), resolve_precision("cpu", "float32")
        loop = open_loop(model_dir, config, precision, spec, source, paths, World(),
                         rollouts_per_step=len(file.rows), max_files_per_step=1)  # fmt: skip
        results = {dtype: Row(label, dtype, lr) for dtype in DTYPES}
        snapshots: dict[str, list[Path]] = {dtype: [] for dtype in DTYPES}
        for step in range(steps + 1):
            if step:
                stats = loop.learner.train_step([file])
                if not stats.trained_tokens:
                    raise SystemExit(f"{label} lr {lr:g}: step {step} trained on no token")
            for dtype in DTYPES:
                path = published(loop.learner.model, dtype, work / f"{dtype}-{lr:g}-{step}.safetensors")
                snapshots[dtype].append(path)
                row = results[dtype]
                row.full = path.stat().st_size
                if not step:
                    continue
                before, delta, rebuilt = snapshots[dtype][-2], work / "delta", work / "rebuilt"
                started = time.perf_counter()
                encoded = encode_delta(before, path, delta)
                row.encode.append(time.perf_counter() - started)
                assert encoded is not None
                started = time.perf_counter()
                apply_delta(before, delta, rebuilt, size=path.stat().st_size)
                row.apply.append(time.perf_counter() - started)
                if rebuilt.read_bytes() != path.read_bytes():
                    raise SystemExit(f"{label} {dtype} lr {lr:g} step {step}: the rebuilt file differs")
                row.deltas.append(encoded.bytes)
                row.changed.append(encoded.changed_fraction)
                before.unlink() if step > 1 else None  # keep the first for the direct delta
        for dtype in DTYPES:
            direct = encode_delta(snapshots[dtype][0], snapshots[dtype][-1], work / "delta")
            assert direct is not None
            results[dtype].direct, results[dtype].direct_changed = direct.bytes, direct.changed_fraction
            for path in (snapshots[dtype][0], snapshots[dtype][-1]):
                path.unlink(missing_ok=True)
        rows += results.values()
        print(f"measured {label} at lr {lr:g}", file=sys.stderr, flush=True)
    return rows


def table(rows: list[Row], steps: int) -> None:
    print(
        f"| model | pool | lr | full MB | delta MB (mean of {steps}) | delta / full | words changed | encode s "
        f"| apply s | step 0 -> {steps}: one delta | chained |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mean = statistics.fmean(r.deltas)
        print(
            f"| {r.model} | {r.dtype} | {r.lr:g} | {r.full / 1e6:,.1f} | {mean / 1e6:,.2f} | {mean / r.full:.1%} | "
            f"{statistics.fmean(r.changed):.1%} | {statistics.fmean(r.encode):.2f} | {statistics.fmean(r.apply):.2f} | "
            f"{r.direct / r.full:.1%} ({r.direct_changed:.1%} changed) | {sum(r.deltas) / r.full:.1%} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help="of the real shape's 24 (all: 24)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 1e-5, 1e-4])
    parser.add_argument("--skip-real", action="store_true", help="the tiny model only")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=DTYPES, help="the pools' precisions")
    args = parser.parse_args()
    DTYPES[:] = args.dtypes
    import torch

    from engine.model.shapes import QWEN25_05B
    from engine.model.tiny import init_model
    from protocol.tasks.spec import load_task_spec

    if args.threads:
        torch.set_num_threads(args.threads)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="delta-bench-") as tmp:
        work = Path(tmp)
        tiny = init_model(work / "tiny", seed=0)
        rows += measure("tiny", tiny, args.lrs, args.steps, work)
        if not args.skip_real:
            shape = dataclasses.replace(QWEN25_05B.with_layers(args.layers), dtype="float32")
            real = init_model(work / "real", seed=0, shape=shape, specs=[load_task_spec(TASK)])
            rows += measure(f"0.5b-{args.layers}l", real, args.lrs, args.steps, work)
    table(rows, args.steps)


if __name__ == "__main__":
    main()
