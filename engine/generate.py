"""Generating one rollout file: plan -> sample -> score -> prove -> write."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core import trace
from engine.inference.base import Completion, GenerationRequest, InferenceBackend
from engine.inference.sampler import SamplingParams
from engine.model.loading import LoadedModel
from engine.proofs import build_proof
from protocol.plan import Job, PlannedPrompt, completion_text, plan_rollouts
from protocol.rollouts import NO_TARGET_LENGTH, RolloutMeta, RolloutRow, SamplingMeta, WrittenFile, write_rollouts
from protocol.tasks.rewards import score_completion
from protocol.tasks.sources import TaskSource
from protocol.tasks.spec import TaskSpec, spec_hash

ZERO_HASH = b"\x00" * 32  # manifest hash of weights that came from no signed checkpoint (offline runs)


@dataclass(frozen=True)
class Generated:
    meta: RolloutMeta
    rows: list[RolloutRow]

    def write(self, out: Path) -> WrittenFile:
        """The file of these rows, written atomically to `out`."""
        return write_rollouts(out, self.meta, self.rows)


def sampling_params(spec: TaskSpec) -> SamplingParams:
    s = spec.sampling
    return SamplingParams(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens)


def generate_rollouts(
    job: Job,
    spec: TaskSpec,
    source: TaskSource,
    loaded: LoadedModel,
    backend: InferenceBackend,
    *,
    manifest_hash: bytes = ZERO_HASH,
    progress: Callable[[int], None] | None = None,
) -> Generated:
    """All `job.prompts x job.group_size` completions of the job's assignment, scored and proven."""
    plan = plan_rollouts(job, spec, source, loaded.tokenizer)
    params = sampling_params(spec)
    requests = [GenerationRequest(list(p.prompt_tokens), seed) for p in plan for seed in p.seeds]
    with trace.span("generate", step=job.step, rows=len(requests)):
        completions = backend.generate(requests, params, progress=progress)
    owners = [p for p in plan for _ in p.seeds]
    with trace.span("prove", step=job.step, rows=len(requests)):  # scoring, and each row's TOPLOC proof
        rows = [
            _row(job, spec, source, loaded, prompt, req.seed, c)
            for prompt, req, c in zip(owners, requests, completions, strict=True)
        ]
    meta = RolloutMeta(
        pool_id=job.pool_id,
        node=job.node,
        manifest_hash=manifest_hash,
        sampling=SamplingMeta(temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_tokens),
        task_spec_hash=spec_hash(spec),
        model_hash=loaded.model_hash,
        counter=job.counter,
        assignment_signature=job.signature,
        assignment_issued_at=job.issued_at,
    )
    return Generated(meta, rows)


def _row(
    job: Job,
    spec: TaskSpec,
    source: TaskSource,
    loaded: LoadedModel,
    prompt: PlannedPrompt,
    seed: int,
    completion: Completion,
) -> RolloutRow:
    text = completion_text(loaded.tokenizer, completion.output_tokens)
    reward = score_completion(source, spec, prompt.problem, text, len(completion.output_tokens), prompt.target_length)
    return RolloutRow(
        problem_id=prompt.problem.id,
        group=prompt.group,
        input_tokens=list(prompt.prompt_tokens),
        output_tokens=list(completion.output_tokens),
        output_logprobs=list(completion.logprobs),
        finish_reason=completion.finish_reason,
        reward=reward.reward,
        task_reward=reward.task_reward,
        length_penalty=reward.length_penalty,
        target_length=NO_TARGET_LENGTH if prompt.target_length is None else prompt.target_length,
        seed=seed,
        step=job.step,
        proofs=build_proof(completion.hidden),
    )
