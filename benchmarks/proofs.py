"""What proofs cost, from one run: proof building against generation, validation against generation, and
proof size. Run: `.venv/bin/python benchmarks/proofs.py [--model DIR] [--prompts 16] [--group 4]`.

Generation here is the worker's whole sampling loop (TorchBackend, KV cache); proof building is
`engine.proofs.build_proof` over every row's hidden states; validation is `validator.verify.verify_file`
on the written file, every check included (format, assignment, rewards, prefill, TOPLOC, sampling).
Each phase runs `--repeats` times and the median is reported.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import toploc
import torch

from engine.generate import Generated, generate_rollouts, sampling_params
from engine.inference.base import GenerationRequest
from engine.inference.torch_backend import TorchBackend
from engine.model.loading import load_model
from engine.model.shapes import ModelShape
from engine.model.tiny import init_model
from engine.proofs import PROOF_CHUNK, build_proof, proof_topk, split_proof, verify_proof
from protocol.plan import Job, plan_rollouts
from protocol.rollouts import encode_rollouts
from protocol.tasks.sources import open_source
from protocol.tasks.spec import load_task_spec
from validator.config import ValidatorConfig
from validator.recompute import prefill_outputs
from validator.verify import Expected, verify_file

REPO = Path(__file__).resolve().parent.parent
# A proof's cost is per 32-token chunk and independent of the model, while generation grows with it: the
# embedded 1.2M-parameter model is the worst case, `--size 25m` shows a model where a token costs something.
SIZES = {
    "tiny": ModelShape(),
    "25m": ModelShape(
        hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, intermediate_size=1536
    ),
}
NODE = "0x15d34AAf54267DB7D7c367839AAf71A00a2C6A65"


def toploc_verify(hidden: torch.Tensor, proof: bytes) -> object:
    """toploc's own comparison of one row (what engine.proofs used before issue 17)."""
    n_out, size = hidden.shape
    chunks = split_proof(proof, n_out, size)
    rows = hidden.detach().to(torch.bfloat16).contiguous()
    return toploc.verify_proofs_bytes(rows, chunks, PROOF_CHUNK, proof_topk(size), skip_prefill=True)


def median_seconds(action, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = action()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model directory (default: a fresh model of --size)")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny", help="shape of the fresh model")
    parser.add_argument("--task", type=Path, default=REPO / "configs" / "tasks" / "default.toml")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steady numbers on a busy machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model or init_model(Path(scratch) / "model", seed=0, shape=SIZES[args.size])
        loaded = load_model(model_dir)
        spec = load_task_spec(args.task)
        source = open_source(spec)
        backend = TorchBackend.from_loaded(loaded, max_batch_size=16)
        job = Job(pool_id=1, node=NODE, step=0, counter=0, prompts=args.prompts, group_size=args.group)
        plan = plan_rollouts(job, spec, source, loaded.tokenizer)
        requests = [GenerationRequest(list(p.prompt_tokens), seed) for p in plan for seed in p.seeds]

        generation_s, completions = median_seconds(
            lambda: backend.generate(requests, sampling_params(spec)), args.repeats
        )
        proof_s, proofs = median_seconds(lambda: [build_proof(c.hidden) for c in completions], args.repeats)  # type: ignore[union-attr]
        generated: Generated = generate_rollouts(job, spec, source, loaded, backend)
        data = encode_rollouts(generated.meta, generated.rows)
        config = ValidatorConfig()
        expected = Expected(node=NODE, pool_id=1, current_step=0)
        validation_s, verdict = median_seconds(
            lambda: verify_file(data, spec=spec, checkpoint=loaded, config=config, expected=expected, source=source),
            args.repeats,
        )
        # the proof comparison alone: ours (engine.proofs, boundary-aware) against toploc's C++ verify_proofs
        recomputed = [hidden for _, hidden, _ in prefill_outputs(loaded.model, generated.rows, 8)]
        pairs = list(zip(recomputed, generated.rows, strict=True))
        ours_s, _ = median_seconds(
            lambda: [verify_proof(h, r.proofs, config.thresholds) for h, r in pairs], args.repeats
        )
        toploc_s, _ = median_seconds(lambda: [toploc_verify(h, r.proofs) for h, r in pairs], args.repeats)

    tokens = sum(len(row.output_tokens) for row in generated.rows)
    chunks = sum(-(-len(row.output_tokens) // PROOF_CHUNK) for row in generated.rows)
    proof_bytes = sum(len(p) for p in proofs)  # type: ignore[union-attr]
    print(
        f"file: {len(generated.rows)} completions ({args.prompts} prompts x {args.group}), {tokens} output tokens, "
        f"{len(data):,} bytes; model {loaded.hidden_size} hidden, {args.threads} thread(s); verdict "
        f"{'accepted' if verdict.accepted else 'REJECTED ' + str(verdict.reason)}"
    )  # type: ignore[union-attr]
    print(f"{'phase':<28}{'seconds':>10}{'/ generation':>15}")
    print(f"{'generation':<28}{generation_s:>10.3f}{1.0:>15.3f}")
    print(f"{'proof building':<28}{proof_s:>10.4f}{proof_s / generation_s:>15.4f}   goal < 0.02")
    print(f"{'validation (all checks)':<28}{validation_s:>10.3f}{validation_s / generation_s:>15.3f}")
    print(f"{'  proof check, ours':<28}{ours_s:>10.4f}{ours_s / generation_s:>15.4f}")
    print(
        f"{'  proof check, toploc':<28}{toploc_s:>10.4f}{toploc_s / generation_s:>15.4f}   "
        f"ours / toploc {ours_s / toploc_s:.2f}x"
    )
    print(
        f"proof bytes per {PROOF_CHUNK} tokens: {proof_bytes / chunks:.0f} ({proof_bytes:,} bytes over {chunks} chunks)"
    )


if __name__ == "__main__":
    main()
