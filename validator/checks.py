"""The checks of DESIGN section 7, one function each: None when the file passes, a rejecting Verdict otherwise.

`validator.verify.verify_file` runs them cheapest first and stops at the first rejection, so each check may
assume the earlier ones passed (the assignment check has already pinned every prompt, the sanity check every
token id). They are pure functions of the parsed file and public inputs; the model check that recomputes the
completions lives in `validator.recompute`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from core.exhaustion import exhausted
from engine.inference.sampler import SamplingParams
from ledger.types import Reason
from protocol.plan import Job, PlannedPrompt, completion_text, plan_rollouts
from protocol.rollouts import (
    NO_TARGET_LENGTH,
    RolloutFile,
    RolloutFormatError,
    RolloutMeta,
    RolloutRow,
    read_rollouts,
    work_units,
)
from protocol.signing import Assignment, SignatureError, SigningDomain, UntimedAssignment, recover
from protocol.tasks.errors import AssignmentError
from protocol.tasks.rewards import score_completion
from protocol.tasks.sources import TaskSource
from protocol.tasks.spec import TaskSpec
from protocol.terms import AssignmentTiming, step_window
from validator.config import ValidatorConfig
from validator.errors import CouldNotJudge
from validator.verdict import Verdict, borderline, reject

SIZE, WORK_KEY, FORMAT, METADATA, STEP = "size", "work_key", "format", "metadata", "step"
ASSIGNMENT, SAMPLING_SANITY, REWARDS, MODEL = "assignment", "sampling_sanity", "rewards", "model"
CHECKS = (SIZE, WORK_KEY, FORMAT, METADATA, STEP, ASSIGNMENT, SAMPLING_SANITY, REWARDS, MODEL)
FOREIGN_NODE = "the file names another node than its submitter"  # a copy of another node's work key


def names_another_node(check: str | None, detail: str | None) -> bool:
    """A rejection of a record whose file is another node's: the record is invalid, the file is not judged by it."""
    return check == METADATA and detail is not None and detail.startswith(FOREIGN_NODE)


def check_size(data: bytes, max_bytes: int) -> Verdict | None:
    """Files over the pool's limit are refused before a byte is hashed or parsed (DESIGN section 6)."""
    if len(data) > max_bytes:
        return reject(Reason.BAD_FORMAT, SIZE, f"the file has more than {max_bytes} bytes", size=len(data))
    return None


def check_work_key(data: bytes, work_key: bytes | None) -> Verdict | None:
    """The bytes must be the ones submitted on chain: sha256(file) == workKey."""
    if work_key is None:
        return None
    actual = hashlib.sha256(data).digest()
    if actual != work_key:
        return reject(
            Reason.HASH_MISMATCH,
            WORK_KEY,
            "sha256 of the file differs from the submitted work key",
            expected="0x" + work_key.hex(),
            actual="0x" + actual.hex(),
        )
    return None


def parse_file(data: bytes, config: ValidatorConfig) -> RolloutFile | Verdict:
    """The parsed file, or a reason-2 verdict naming the format problem (truncated, corrupt, schema, ...).

    The reader calls everything pyarrow raises undecodable data, its own allocation failures included. It bounds
    what decoding may allocate from the footer and page headers first (protocol/rollouts/bounds.py), so an allocation
    that fails after that is this validator short of memory (or descriptors), never the file: CouldNotJudge.
    """
    try:
        return read_rollouts(
            data, max_bytes=config.max_file_bytes, max_rows=config.max_rows, max_tokens=config.max_tokens
        )
    except RolloutFormatError as exc:
        if exhausted(exc) is not None:  # named by what pyarrow raised, not by the reader's wrapping of it
            raise CouldNotJudge.during(FORMAT, exc.__cause__ or exc) from exc
        return reject(Reason.BAD_FORMAT, FORMAT, str(exc), problem=str(exc.problem), row=exc.row)


def check_metadata(
    file: RolloutFile,
    *,
    task_spec_hash: bytes,
    sampling: SamplingParams,
    pool_id: int | None,
    node: str | None,
    units: int | None,
) -> Verdict | None:
    """The file is for this pool and task, by this node, claims the task's sampling and the units paid for.

    `pool_id`, `node` (the on-chain submitter) and `units` (as submitted) are skipped when None. Inflated units
    are a format error (reason 2, DESIGN section 6), as is a file whose rows claim different policy steps.
    """
    meta = file.meta
    if pool_id is not None and meta.pool_id != pool_id:
        return _bad_meta("the file is for another pool", "pool_id", pool_id, meta.pool_id)
    if node is not None and meta.node.lower() != node.lower():
        return _bad_meta(FOREIGN_NODE, "node", node, meta.node)
    if meta.task_spec_hash != task_spec_hash:
        return _bad_meta(
            "the file was scored with another task spec",
            "task_spec_hash",
            "0x" + task_spec_hash.hex(),
            "0x" + meta.task_spec_hash.hex(),
        )
    claimed = (meta.sampling.temperature, meta.sampling.top_p, meta.sampling.max_tokens)
    required = (sampling.temperature, sampling.top_p, sampling.max_tokens)
    if claimed != required:
        return _bad_meta("the file claims other sampling parameters than the task's", "sampling", required, claimed)
    steps = sorted({row.step for row in file.rows})
    if len(steps) != 1:
        return reject(Reason.BAD_FORMAT, METADATA, "the rows claim different policy steps", steps=steps[:16])
    if units is not None and work_units(file.rows) != units:
        return _bad_meta(
            "the submitted units differ from the file's output tokens", "units", units, work_units(file.rows)
        )
    return None


def _bad_meta(detail: str, name: str, expected: Any, found: Any) -> Verdict:
    return reject(
        Reason.BAD_FORMAT,
        METADATA,
        f"{detail}: {name} {found}, expected {expected}",
        field=name,
        expected=expected,
        found=found,
    )


def check_deadline(meta: RolloutMeta, step: int, submitted_at: int, timing: AssignmentTiming) -> Verdict | None:
    """Stale on signed facts alone (reason 4, slashable): the submission's block is stamped later than the issue time
    the trainer signed plus the pool's assignment lifetime and clock slack (`protocol.terms.AssignmentTiming`).

    Call it only once the file's assignment signature has checked out: that makes `step` and the issue time the
    trainer's word. A file without a signed issue time (rollout format 2) is never stale by this rule."""
    issued_at = meta.assignment_issued_at
    if issued_at is None:
        return None
    deadline = timing.stale_after(issued_at)
    if submitted_at <= deadline:
        return None
    return reject(
        Reason.STALE_STEP,
        STEP,
        f"the file of step {step} was submitted at chain time {submitted_at}, {submitted_at - issued_at} s after the "
        f"trainer signed its assignment (at {issued_at}): past the pool's {timing.lifetime} s assignment lifetime "
        f"and {timing.clock_slack} s clock slack (deadline {deadline})",
        step=step,
        issued_at=issued_at,
        submitted_at=submitted_at,
        deadline=deadline,
        lifetime=timing.lifetime,
        clock_slack=timing.clock_slack,
    )


def check_step(
    step: int, current_step: int | None, async_level: int, *, earliest_step: int | None = None
) -> Verdict | None:
    """Rollouts count only while their policy is at most `async_level` steps behind (DESIGN section 8).

    `earliest_step` (default: `current_step`) is the oldest step that may have been current at submission, when
    clocks leave that uncertain: the window is then [earliest_step - async_level, current_step].

    The current step is the coordinator's word (`GET /v1/steps`, or a flag), which nobody signs: a file outside the
    window is refused for training and not paid, never slashed (a borderline rejection). Slashable staleness rests
    on the signed assignment alone (`check_deadline`)."""
    if current_step is None:
        return None
    window = step_window(current_step, async_level, earliest=earliest_step)
    if step in window:
        return None
    return borderline(
        Reason.STALE_STEP,
        STEP,
        f"the file is from step {step}, outside {window} by the coordinator's step history, which is not signed: "
        "refused, not slashed",
        step=step,
        current_step=current_step,
        earliest_step=current_step if earliest_step is None else earliest_step,
        async_level=async_level,
    )


def group_shape(rows: Sequence[RolloutRow]) -> tuple[int, int] | Verdict:
    """(groups, samples per group) of a file laid out as the plan is: group g's rows are rows g*G .. g*G+G-1.

    Every group has the same size, because a job draws the same number of samples for every prompt; so a
    worker cannot pad the easy prompts with extra samples or drop the hard ones.
    """
    groups = sorted({row.group for row in rows})
    if groups != list(range(len(groups))) or len(rows) % len(groups):
        return reject(
            Reason.WRONG_ASSIGNMENT,
            ASSIGNMENT,
            "groups must be numbered 0.. and all hold the same number of rows",
            groups=len(groups),
            rows=len(rows),
        )
    size = len(rows) // len(groups)
    for index, row in enumerate(rows):
        if row.group != index // size:
            return reject(
                Reason.WRONG_ASSIGNMENT,
                ASSIGNMENT,
                f"row {index} belongs to group {index // size} of {size} rows, not to group {row.group}",
                row=index,
                expected=index // size,
                found=row.group,
            )
    return len(groups), size


def plan_for(
    meta: RolloutMeta, step: int, shape: tuple[int, int], spec: TaskSpec, source: TaskSource, tokenizer: Any
) -> list[PlannedPrompt] | Verdict:
    """The deterministic plan of the file's job, or reason 3 when no assignment of that size exists."""
    job = Job(meta.pool_id, meta.node, step, meta.counter, prompts=shape[0], group_size=shape[1])
    try:
        return plan_rollouts(job, spec, source, tokenizer)
    except AssignmentError as exc:
        return reject(Reason.WRONG_ASSIGNMENT, ASSIGNMENT, str(exc), groups=shape[0])


def signed_grant(meta: RolloutMeta, step: int, shape: tuple[int, int]) -> Assignment | UntimedAssignment:
    """The assignment message a file claims the trainer signed, rebuilt from the file: with its issue time from
    format 3 on, without one in format 2 (`protocol.signing.UntimedAssignment`)."""
    fields = (meta.pool_id, meta.node, step, meta.counter, shape[0], shape[1], meta.task_spec_hash)
    if meta.assignment_issued_at is None:
        return UntimedAssignment(*fields)
    return Assignment(*fields, meta.assignment_issued_at)


def check_signed_assignment(
    meta: RolloutMeta, step: int, shape: tuple[int, int], trainer: str, domain: SigningDomain
) -> Verdict | None:
    """The file carries the trainer's `Assignment` signature over exactly its pool, node, step, counter, shape, task
    and issue time. The message is rebuilt from the file, so a file cut from a larger generation, made for a counter
    the coordinator never handed out, or claiming another issue time, recovers another address: reason 3."""
    if meta.assignment_signature is None:
        return reject(
            Reason.WRONG_ASSIGNMENT, ASSIGNMENT, "the file carries no assignment signature", counter=meta.counter
        )
    grant = signed_grant(meta, step, shape)
    try:
        signer = recover(grant, meta.assignment_signature, domain)
    except SignatureError as exc:
        return reject(Reason.WRONG_ASSIGNMENT, ASSIGNMENT, f"the assignment signature is malformed: {exc}")
    if signer != trainer:
        issued = "" if meta.assignment_issued_at is None else f", issued at {meta.assignment_issued_at},"
        return reject(
            Reason.WRONG_ASSIGNMENT,
            ASSIGNMENT,
            f"no such assignment was handed out: step {step}, counter {meta.counter}, {shape[0]} x {shape[1]}{issued} "
            f"is not what the trainer signed (the signature recovers {signer}, not {trainer})",
            counter=meta.counter,
            groups=shape[0],
            group_size=shape[1],
        )
    return None


def assigned_plan(
    rows: Sequence[RolloutRow],
    meta: RolloutMeta,
    step: int,
    shape: tuple[int, int],
    spec: TaskSpec,
    source: TaskSource,
    tokenizer: Any,
) -> list[PlannedPrompt] | Verdict:
    """The file's plan when its rows follow it exactly (layout, problems, prompts, seeds, targets); else reason 3.

    `shape` is the file's `group_shape`; whether the trainer signed the assignment is `check_signed_assignment`'s."""
    plan = plan_for(meta, step, shape, spec, source, tokenizer)
    if isinstance(plan, Verdict):
        return plan
    return check_assignment(rows, plan) or plan


def check_assignment(rows: Sequence[RolloutRow], plan: Sequence[PlannedPrompt]) -> Verdict | None:
    """Every row answers its planned problem with the planned prompt tokens, seed and target length."""
    size = len(rows) // len(plan)
    for index, row in enumerate(rows):
        planned = plan[index // size]
        target = NO_TARGET_LENGTH if planned.target_length is None else planned.target_length
        for name, expected, found in (
            ("problem_id", planned.problem.id, row.problem_id),
            ("seed", planned.seeds[index % size], row.seed),
            ("target_length", target, row.target_length),
        ):
            if expected != found:
                return _wrong(index, name, expected, found)
        if row.input_tokens != list(planned.prompt_tokens):
            first = next(
                (i for i, (a, b) in enumerate(zip(planned.prompt_tokens, row.input_tokens, strict=False)) if a != b),
                min(len(planned.prompt_tokens), len(row.input_tokens)),
            )
            return reject(
                Reason.WRONG_ASSIGNMENT,
                ASSIGNMENT,
                f"row {index}: input_tokens differ from the planned prompt at token {first}",
                row=index,
                field="input_tokens",
                position=first,
                expected_length=len(planned.prompt_tokens),
                found_length=len(row.input_tokens),
            )
    return None


def _wrong(row: int, name: str, expected: Any, found: Any) -> Verdict:
    return reject(
        Reason.WRONG_ASSIGNMENT,
        ASSIGNMENT,
        f"row {row}: {name} is not the assigned one",
        row=row,
        field=name,
        expected=expected,
        found=found,
    )


def check_sampling_sanity(
    rows: Sequence[RolloutRow], *, max_tokens: int, vocab_size: int, eos_token_ids: Sequence[int]
) -> Verdict | None:
    """Token ids in the vocabulary, lengths within max_tokens, and EOS where finish_reason says.

    The vocabulary is the `vocab_size` ids the tokenizer has (`LoadedModel.sampled_vocab_size`), which workers
    sample from: an id past them is outside it even where the LM head has a (padded) row for it.

    "stop": the last token is an EOS and no EOS precedes it; "length": exactly max_tokens tokens and no EOS.
    (Prompt ids need no check here: the assignment check made them equal to the planned prompt.)
    """
    eos = frozenset(eos_token_ids)
    for index, row in enumerate(rows):
        tokens = row.output_tokens
        outside = next((i for i, t in enumerate(tokens) if t >= vocab_size), None)
        if outside is not None:
            return _insane(index, f"output token {tokens[outside]} is outside the vocabulary", outside, vocab_size)
        if len(tokens) > max_tokens:
            return _insane(index, f"{len(tokens)} output tokens, more than max_tokens {max_tokens}", None, None)
        first_eos = next((i for i, t in enumerate(tokens) if t in eos), None)
        if row.finish_reason == "stop" and first_eos != len(tokens) - 1:
            detail = "finish_reason is stop but " + (
                "no output token is an EOS" if first_eos is None else f"the first EOS is at position {first_eos}"
            )
            return _insane(index, detail, first_eos, len(tokens))
        if row.finish_reason == "length" and (first_eos is not None or len(tokens) != max_tokens):
            detail = "finish_reason is length but " + (
                f"position {first_eos} is an EOS" if first_eos is not None else f"only {len(tokens)} tokens"
            )
            return _insane(index, detail, first_eos, len(tokens))
    return None


def _insane(row: int, detail: str, position: int | None, limit: int | None) -> Verdict:
    return reject(
        Reason.INVALID_SAMPLING, SAMPLING_SANITY, f"row {row}: {detail}", row=row, position=position, limit=limit
    )


def check_rewards(
    rows: Sequence[RolloutRow], plan: Sequence[PlannedPrompt], spec: TaskSpec, source: TaskSource, tokenizer: Any
) -> Verdict | None:
    """reward, task_reward and length_penalty recomputed with the task's verifier equal the row's, as float32."""
    size = len(rows) // len(plan)
    for index, row in enumerate(rows):
        planned = plan[index // size]
        text = completion_text(tokenizer, row.output_tokens)
        score = score_completion(source, spec, planned.problem, text, len(row.output_tokens), planned.target_length)
        for name, recomputed in (
            ("reward", score.reward),
            ("task_reward", score.task_reward),
            ("length_penalty", score.length_penalty),
        ):
            claimed = getattr(row, name)
            if np.float32(claimed) != np.float32(recomputed):
                return reject(
                    Reason.REWARD_MISMATCH,
                    REWARDS,
                    f"row {index}: {name} {claimed} recorded, {recomputed} recomputed",
                    row=index,
                    field=name,
                    claimed=claimed,
                    recomputed=recomputed,
                )
    return None
