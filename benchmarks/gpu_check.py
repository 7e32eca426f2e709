"""The GPU checks of issue 20 that run without vLLM (scripts/gpu-check.sh runs this on a lent GPU machine).

    python benchmarks/gpu_check.py [--device cuda] [--files 12] [--out DIR]

On a GPU machine (vLLM is not installed there, and its wheel is too large to carry), for the tiny model and a
~25M-parameter model of the same family:

1. precision pairs, honest files: workers generating with the torch engine on one device and a validator
   prefilling on another, each pair in one pool precision (the task's sampling.dtype):
   bfloat16 on CUDA against bfloat16 on CUDA (the GPU pool), float32 on CUDA against float32 on the CPU and the
   other way round (a GPU worker in a float32 pool with a CPU validator), float32 on CUDA against CUDA.
   Each file goes through `verify_file` with the precision's calibrated tolerances: the accepted count (the goal is
   every one) and the largest TOPLOC statistics any chunk showed;
2. cheating files at the same tolerances: a one-step-stale model (1e-3 noise on the weights) and another model
   (another init), per pair: how many files the validator rejects (the goal is every one);
3. decode tokens/s of the torch engine on CUDA in bfloat16 against the CPU in float32, at batch 1, 16, 64, 256.

`--device cpu` runs the same program with the CPU standing in for CUDA: the dry run scripts/gpu-check.sh is
tested with here. Prints a table per part and writes every figure to OUT/gpu-check.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from engine.generate import generate_rollouts
from engine.inference.torch_backend import TorchBackend
from engine.model.loading import LoadedModel, load_model
from engine.model.shapes import ModelShape
from engine.model.tiny import init_model
from protocol.plan import Job
from protocol.rollouts import encode_rollouts
from protocol.tasks.sources import open_source
from protocol.tasks.spec import TaskSpec, load_task_spec
from validator.config import ValidatorConfig
from validator.verify import verify_file

REPO = Path(__file__).resolve().parent.parent
TASK = REPO / "configs" / "tasks" / "default.toml"
NODE = "0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc"
SIZES = {
    "tiny": ModelShape(),
    "25m": ModelShape(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                           intermediate_size=1536),
}  # fmt: skip
BATCHES = (1, 16, 64, 256)
WORST = ("exp_mismatches", "mant_err_mean", "mant_err_median")


def task_in(dtype: str, root: Path) -> TaskSpec:
    """The default task in a pool of precision `dtype`."""
    text = TASK.read_text()
    path = root / f"default-{dtype}.toml"
    path.write_text(text.replace("max_tokens = 64\n", f'max_tokens = 64\ndtype = "{dtype}"\n', 1))
    return load_task_spec(path)


def perturbed(loaded: LoadedModel, scale: float, seed: int) -> LoadedModel:
    """A copy whose weights carry Gaussian noise of `scale`: the policy of a step before or after."""
    model = type(loaded.model)(loaded.model.config)
    model.load_state_dict(loaded.model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            noise = torch.randn(param.shape, generator=generator) * scale
            param.add_(noise.to(param.device, param.dtype))
    return dataclasses.replace(loaded, model=model.to(loaded.model.device, loaded.model.dtype).eval())


def foreign(loaded: LoadedModel, seed: int) -> LoadedModel:
    """Another model of the same shape: what a worker without the pool's weights would run."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = type(loaded.model)(loaded.model.config)
    return dataclasses.replace(loaded, model=model.to(loaded.model.device, loaded.model.dtype).eval())


def files_of(
    worker: LoadedModel, spec: TaskSpec, source: Any, counters: Any, count: int, batch: int = 64
) -> list[bytes]:
    backend = TorchBackend.from_loaded(worker, max_batch_size=batch)
    out = []
    for _ in range(count):
        job = Job(pool_id=1, node=NODE, step=0, counter=next(counters), prompts=8, group_size=8)
        generated = generate_rollouts(job, spec, source, worker, backend)
        out.append(encode_rollouts(generated.meta, generated.rows))
    return out


def judge(files: list[bytes], spec: TaskSpec, source: Any, checkpoint: LoadedModel, device: str) -> dict[str, Any]:
    config = ValidatorConfig.for_precision(spec.sampling.dtype, device=device)
    accepted, borderline, worst, reasons = 0, 0, dict.fromkeys(WORST, 0.0), []
    started = time.perf_counter()
    for data in files:
        verdict = verify_file(data, spec=spec, checkpoint=checkpoint, config=config, source=source)
        accepted += verdict.accepted
        borderline += verdict.borderline
        if verdict.accepted:
            seen = verdict.evidence["proof_worst"]
            worst = {k: max(worst[k], float(seen[k])) for k in WORST}
        else:
            reasons.append(f"{verdict.reason!r}: {verdict.detail}"[:200])
    return {
        "files": len(files),
        "accepted": accepted,
        "borderline": borderline,
        "worst": worst,
        "reasons": reasons[:3],
        "verify_seconds": round(time.perf_counter() - started, 2),
    }


def precision_pairs(size: str, model_dir: Path, gpu: str, files: int, root: Path) -> list[dict[str, Any]]:
    pairs = [(gpu, gpu, "bfloat16"), (gpu, "cpu", "float32"), ("cpu", gpu, "float32"), (gpu, gpu, "float32")]
    results = []
    counters = itertools.count()
    for worker_device, validator_device, dtype in pairs:
        spec = task_in(dtype, root)
        source = open_source(spec)
        worker = load_model(model_dir, device=worker_device, dtype=getattr(torch, dtype))
        checkpoint = load_model(model_dir, device=validator_device, dtype=getattr(torch, dtype))
        started = time.perf_counter()
        honest = files_of(worker, spec, source, counters, files)
        generate_seconds = time.perf_counter() - started
        row: dict[str, Any] = {
            "model": size,
            "worker": f"torch on {worker_device}",
            "validator": f"torch on {validator_device}",
            "dtype": dtype,
            "generate_seconds": round(generate_seconds, 2),
            "honest": judge(honest, spec, source, checkpoint, validator_device),
        }
        for kind, liar in (("stale", perturbed(worker, 1e-3, 7)), ("foreign", foreign(worker, 11))):
            cheats = files_of(liar, spec, source, counters, max(2, files // 4))
            verdicts = judge(cheats, spec, source, checkpoint, validator_device)
            row[kind] = {"files": verdicts["files"], "rejected": verdicts["files"] - verdicts["accepted"]}
        results.append(row)
        h = row["honest"]
        print(
            f"{size:<5} {row['worker']:<14} {row['validator']:<14} {dtype:<9} honest {h['accepted']:>3}/{h['files']:<3}"
            f" (borderline {h['borderline']})  worst exp {h['worst']['exp_mismatches']:>3.0f} "
            f"mean {h['worst']['mant_err_mean']:>7.4f} median {h['worst']['mant_err_median']:>5.1f}  "
            f"stale caught {row['stale']['rejected']}/{row['stale']['files']}  "
            f"foreign caught {row['foreign']['rejected']}/{row['foreign']['files']}",
            flush=True,
        )
        for reason in h["reasons"]:
            print(f"      honest file refused: {reason}")
    return results


def tokens_per_second(model_dir: Path, device: str, dtype: str, batch: int, spec: TaskSpec) -> float:
    loaded = load_model(model_dir, device=device, dtype=getattr(torch, dtype))
    backend = TorchBackend.from_loaded(loaded, max_batch_size=batch)
    source = open_source(spec)
    prompts, group = (batch, 1) if batch < 8 else (batch // 8, 8)
    job = Job(pool_id=1, node=NODE, step=0, counter=10**6 + batch, prompts=prompts, group_size=group)
    generate_rollouts(job, spec, source, loaded, backend)  # warm-up: kernels, allocator
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    started = time.perf_counter()
    generated = generate_rollouts(dataclasses.replace(job, counter=job.counter + 1), spec, source, loaded, backend)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return sum(len(r.output_tokens) for r in generated.rows) / (time.perf_counter() - started)


def throughput(size: str, model_dir: Path, gpu: str, root: Path, batches: tuple[int, ...]) -> list[dict[str, Any]]:
    results = []
    for batch in batches:
        on_gpu = tokens_per_second(model_dir, gpu, "bfloat16", batch, task_in("bfloat16", root))
        on_cpu = tokens_per_second(model_dir, "cpu", "float32", batch, task_in("float32", root))
        results.append({"model": size, "batch": batch, "gpu_bf16": on_gpu, "cpu_fp32": on_cpu})
        print(
            f"{size:<5} batch {batch:>4}: torch on {gpu} bf16 {on_gpu:>9.0f} tok/s, on cpu fp32 {on_cpu:>8.0f} tok/s,"
            f" ratio {on_gpu / on_cpu:6.2f}x",
            flush=True,
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="the GPU (cpu: a dry run of the same program)")
    parser.add_argument("--files", type=int, default=12, help="honest files (8 x 8 rows) per precision pair")
    parser.add_argument("--sizes", default="tiny,25m")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_check: torch sees no CUDA GPU here (pass --device cpu for a dry run)")
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 on CUDA means float32 (torch's default, said aloud)
    facts: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "device": args.device,
    }
    try:
        import vllm

        facts["vllm"] = vllm.__version__
    except ImportError:
        facts["vllm"] = None
        print("vLLM is not installed here: vLLM on CUDA (generation, tokens/s) could not run; the torch engine did")
    print(json.dumps(facts))
    root = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    report: dict[str, Any] = {"machine": facts, "pairs": [], "throughput": []}
    batches = tuple(int(b) for b in args.batches.split(","))
    for size in args.sizes.split(","):
        model_dir = init_model(root / size, seed=0, shape=SIZES[size])
        report["pairs"] += precision_pairs(size, model_dir, args.device, args.files, root)
        report["throughput"] += throughput(size, model_dir, args.device, root, batches)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu-check.json").write_text(json.dumps(report, indent=1))  # after each model: a cut run keeps it


if __name__ == "__main__":
    main()
