"""Real rollout files from the tiny model on the default task, with rewards a test can control.

The tiny model is random, so every task reward would be 0 and every group would be dropped by the online
filter. `make_file` generates real completions (tokens, log-probs, proofs), then rewrites each row's reward with
`reward_of(row)`, which by default gives 1 to completions of even length: mixed within most groups.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from eth_account.signers.local import LocalAccount

from engine.generate import generate_rollouts
from engine.inference.torch_backend import TorchBackend
from engine.model.loading import LoadedModel
from protocol.plan import Job
from protocol.rollouts import RolloutRow, write_rollouts
from protocol.signing import Assignment, SigningDomain, sign
from protocol.tasks.sources import TaskSource
from protocol.tasks.spec import TaskSpec, spec_hash

NODE = "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1"


def even_length(row: RolloutRow) -> float:
    return 1.0 if len(row.output_tokens) % 2 == 0 else 0.0


def make_file(
    path: Path,
    loaded: LoadedModel,
    spec: TaskSpec,
    source: TaskSource,
    *,
    step: int,
    counter: int,
    prompts: int = 4,
    group_size: int = 4,
    pool_id: int = 0,
    node: str = NODE,
    reward_of: Callable[[RolloutRow], float] = even_length,
    signed_by: tuple[LocalAccount, SigningDomain] | None = None,
    issued_at: int | None = None,
) -> Path:
    """`signed_by` (the pool's trainer and the domain) signs the assignment, as the coordinator does when it hands
    the work out, issued at `issued_at` (default: now); without it the file carries no assignment signature (a
    pool's validators refuse it)."""
    job = Job(pool_id=pool_id, node=node, step=step, counter=counter, prompts=prompts, group_size=group_size)
    if signed_by is not None:
        trainer, domain = signed_by
        issued = int(time.time()) if issued_at is None else issued_at
        grant = Assignment(pool_id, node, step, counter, prompts, group_size, spec_hash(spec), issued)
        job = dataclasses.replace(job, signature=sign(grant, trainer, domain), issued_at=issued)
    backend = TorchBackend.from_loaded(loaded, max_batch_size=16)
    generated = generate_rollouts(job, spec, source, loaded, backend)
    rows = [dataclasses.replace(r, reward=reward_of(r), task_reward=reward_of(r)) for r in generated.rows]
    write_rollouts(path, generated.meta, rows)
    return path
