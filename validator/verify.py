"""`verify_file`: one rollout file in, one verdict out. The function the validator daemon calls per submission.

Checks run cheapest first and stop at the first rejection (DESIGN section 7):

    size, work_key -> format, metadata -> assignment (signature) -> step -> assignment (plan) -> sampling_sanity
    -> rewards -> model

The signature comes before the step: a file is stale, and slashed, only by the step and the issue time the trainer
signed, against the chain's block time of its submission (`checks.check_deadline`); the coordinator's step history
can only refuse it unpaid (`checks.check_step`, a borderline rejection).

Everything before `model` costs milliseconds; `model` prefills every row once with the checkpoint and
compares the TOPLOC proofs (reason 7), the sampled tokens and the log-probs (reason 5).

A check returns a rejecting verdict for every fault of the file. What a check raises instead, and a checkpoint
that cannot be had, is the validator's own failure (out of memory, disk or descriptors, a fault in its code): it
leaves as `CouldNotJudge`, never as a verdict (validator.errors).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TypeVar

from engine.generate import sampling_params
from engine.memory import MemoryShortfall
from engine.model.loading import LoadedModel
from protocol.rollouts import work_units
from protocol.signing import SigningDomain
from protocol.tasks.sources import TaskSource, open_source
from protocol.tasks.spec import TaskSpec, spec_hash
from protocol.terms import AssignmentTiming
from validator import checks, recompute
from validator.config import ValidatorConfig, ValidatorConfigError
from validator.errors import CouldNotJudge, Unjudged
from validator.verdict import Verdict, accept

T = TypeVar("T")
# The checkpoint of the file's policy step: the model itself, or a function of the step that returns it, called
# only once the file passed every check that does not need the model (a daemon fetches it on demand).
CheckpointFor = LoadedModel | Callable[[int], LoadedModel]


@dataclass(frozen=True)
class Expected:
    """What the chain and the pool say about a submission; None skips the comparison (offline checks)."""

    work_key: bytes | None = None  # the submitted workKey: sha256 of the file
    node: str | None = None  # the on-chain submitter
    pool_id: int | None = None
    units: int | None = None  # the submitted work units
    # the pool's current policy step by the coordinator's word (unsigned: a file outside the window is refused, never
    # slashed), and the oldest step that may have been current (clock slack); default current
    current_step: int | None = None
    earliest_step: int | None = None
    # the pool's trainer and the EIP-712 domain: the file must carry the trainer's signature of exactly its assignment
    trainer: str | None = None
    domain: SigningDomain | None = None
    # the chain's block time of the submission and the pool's assignment lifetime and clock slack: with a trainer,
    # a file submitted past its signed assignment's deadline is stale (reason 4)
    submitted_at: int | None = None
    timing: AssignmentTiming | None = None

    def __post_init__(self) -> None:
        if self.work_key is not None and len(self.work_key) != 32:
            raise ValueError(f"Expected.work_key must be 32 bytes, got {len(self.work_key)}")
        if (self.trainer is None) != (self.domain is None):
            raise ValueError("Expected.trainer and Expected.domain go together")
        if (self.submitted_at is None) != (self.timing is None):
            raise ValueError("Expected.submitted_at and Expected.timing go together")
        for name in ("pool_id", "units", "current_step", "earliest_step", "submitted_at"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"Expected.{name} must be >= 0, got {value}")


class _Timer:
    """Seconds spent per check, in the order the checks ran."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    def run(self, name: str, check: Callable[[], T]) -> T:
        started = time.perf_counter()
        try:
            with _judging(name):
                return check()
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - started


@contextmanager
def _judging(check: str, otherwise: Unjudged = Unjudged.INTERNAL) -> Iterator[None]:
    """Whatever escapes `check` is the validator's failure, not the file's: a CouldNotJudge naming the check.

    Only a request to stop passes as it is, and a checkpoint too large for this validator's memory
    (`MemoryShortfall`, raised before it loads): no file of the pool could be judged here, so the daemon stops. A
    Rust extension's panic is a BaseException (pyo3's PanicException): the tokenizer panics so when it cannot start
    its thread pool under a memory limit, and must not end a daemon.
    """
    try:
        yield
    except (CouldNotJudge, MemoryShortfall, KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:
        raise CouldNotJudge.during(check, exc, otherwise) from exc


def verify_file(
    data: bytes,
    *,
    spec: TaskSpec,
    checkpoint: CheckpointFor,
    config: ValidatorConfig | None = None,
    expected: Expected | None = None,
    source: TaskSource | None = None,
) -> Verdict:
    """The verdict on one file's bytes. `checkpoint` holds the weights of the file's policy step, or gives them.

    `source` is the task's opened problem source (opened from `spec` when None; a daemon opens it once).
    A bad file never raises: it gets a rejecting verdict. Only validator-side failures raise: `CouldNotJudge`
    (out of memory, disk or descriptors; a task source whose scorer cannot run, say the code sandbox without
    Docker; a checkpoint that cannot be had, `CheckpointGone` when no source offers it any more; a fault in a
    check), and `ValidatorConfigError` for a config or checkpoint of another precision than the task's.
    """
    config = config or ValidatorConfig.for_precision(spec.sampling.dtype)
    if config.dtype != spec.sampling.dtype:  # every tolerance would be the wrong one: refuse, never judge
        raise ValidatorConfigError(
            "dtype",
            config.dtype,
            f"the task's precision, sampling.dtype = {spec.sampling.dtype!r}: its workers generate in it and the "
            "thresholds are calibrated for recomputing in it",
        )
    expected = expected or Expected()
    timer = _Timer()
    verdict = _run_checks(data, spec, checkpoint, config, expected, source, timer)
    return verdict.with_timings(timer.timings)


def _run_checks(
    data: bytes,
    spec: TaskSpec,
    checkpoint_for: CheckpointFor,
    config: ValidatorConfig,
    expected: Expected,
    source: TaskSource | None,
    timer: _Timer,
) -> Verdict:
    if verdict := timer.run(checks.SIZE, lambda: checks.check_size(data, config.max_file_bytes)):
        return verdict
    if verdict := timer.run(checks.WORK_KEY, lambda: checks.check_work_key(data, expected.work_key)):
        return verdict
    parsed = timer.run(checks.FORMAT, lambda: checks.parse_file(data, config))
    if isinstance(parsed, Verdict):
        return parsed
    meta, rows = parsed.meta, parsed.rows
    if verdict := timer.run(
        checks.METADATA,
        lambda: checks.check_metadata(
            parsed,
            task_spec_hash=spec_hash(spec),
            sampling=sampling_params(spec),
            pool_id=expected.pool_id,
            node=expected.node,
            units=expected.units,
        ),
    ):
        return verdict
    step = rows[0].step  # the metadata check made every row's step equal
    shape = timer.run(checks.ASSIGNMENT, lambda: checks.group_shape(rows))
    if isinstance(shape, Verdict):
        return shape
    if expected.trainer is not None and expected.domain is not None:
        trainer, domain = expected.trainer, expected.domain
        if verdict := timer.run(
            checks.ASSIGNMENT, lambda: checks.check_signed_assignment(meta, step, shape, trainer, domain)
        ):
            return verdict
        # the step and the issue time are the trainer's word now: the only staleness that may be slashed
        if expected.submitted_at is not None and expected.timing is not None:
            submitted_at, timing = expected.submitted_at, expected.timing
            if verdict := timer.run(checks.STEP, lambda: checks.check_deadline(meta, step, submitted_at, timing)):
                return verdict
    if verdict := timer.run(
        checks.STEP,
        lambda: checks.check_step(
            step, expected.current_step, config.async_level, earliest_step=expected.earliest_step
        ),
    ):
        return verdict
    if isinstance(checkpoint_for, LoadedModel):
        checkpoint = checkpoint_for
    else:
        with _judging(checks.MODEL, Unjudged.CHECKPOINT):
            checkpoint = checkpoint_for(step)
    if (held := str(checkpoint.model.dtype).removeprefix("torch.")) != config.dtype:
        raise ValidatorConfigError("dtype", config.dtype, f"the checkpoint's precision too, which is {held}")
    task = timer.run(checks.ASSIGNMENT, lambda: source if source is not None else open_source(spec))
    plan = timer.run(
        checks.ASSIGNMENT,
        lambda: checks.assigned_plan(rows, meta, step, shape, spec, task, checkpoint.tokenizer),
    )
    if isinstance(plan, Verdict):
        return plan
    if verdict := timer.run(
        checks.SAMPLING_SANITY,
        lambda: checks.check_sampling_sanity(
            rows,
            max_tokens=meta.sampling.max_tokens,
            vocab_size=checkpoint.sampled_vocab_size,  # the tokenizer's ids: a padded LM-head row is no token
            eos_token_ids=checkpoint.eos_token_ids,
        ),
    ):
        return verdict
    if verdict := timer.run(checks.REWARDS, lambda: checks.check_rewards(rows, plan, spec, task, checkpoint.tokenizer)):
        return verdict
    headroom = timer.run(checks.MODEL, lambda: recompute.check_model(rows, meta, checkpoint, config))
    if isinstance(headroom, Verdict):
        return headroom
    return accept(
        f"{len(rows)} rows in {len(plan)} groups passed every check",
        work_key="0x" + parsed.work_key.hex(),
        pool_id=meta.pool_id,
        node=meta.node,
        step=step,
        counter=meta.counter,
        rows=len(rows),
        groups=len(plan),
        units=work_units(rows),
        proof_worst=asdict(headroom),  # the largest TOPLOC statistics of any chunk: the margin to the thresholds
    )
