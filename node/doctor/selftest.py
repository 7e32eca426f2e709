"""The doctor's self-test: a rollout file generated on the tiny model and judged by `prime-validate file` in a
child process (why a child process: `node.doctor`)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import one_line
from node.doctor.checks import DoctorConfig, Finding, fail, ok, skip

# --- the self-test -----------------------------------------------------------------------------------

# The default task (configs/tasks/default.toml) with a smaller problem set: the package does not ship configs/,
# and the self-test must run wherever prime-node is installed.
SELF_TEST_TASK = """\
name = "doctor-self-test"

[source]
type = "reasoning_gym"
dataset = "basic_arithmetic"
seed = 0
size = 1_000

[source.config]
min_terms = 2
max_terms = 2
min_digits = 1
max_digits = 2
operators = ["+", "-"]
allow_parentheses = false
allow_negation = false
format_style = "simple"
whitespace = "single"

[prompt]
system = ""
answer_format = "Reply with <answer>N</answer>."
thinking_budget = false

[reward]
length_mode = "none"

[sampling]
temperature = 1.0
top_p = 1.0
max_tokens = 64
"""
SELF_TEST_NODE = "0xa0Ee7A142d267C1f36714E4a8F75612F20a79720"  # anvil's dev account 9; the file is never submitted
SELF_TEST_POOL, SELF_TEST_STEP = 0, 0


@dataclass(frozen=True)
class SelfTestFile:
    """A rollout file the self-test generated, and what verifying it needs."""

    model_dir: Path
    task: Path
    rollouts: Path
    rows: int
    units: int
    generate_seconds: float


@dataclass(frozen=True)
class Verification:
    """The validator's verdict on a file, as `prime-validate file` printed it."""

    accepted: bool
    verdict: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0  # wall time of the child process, start-up included
    error: str | None = None  # set when the validator gave no verdict (exit 2, a crash)


def generate_self_test(work_dir: Path, *, prompts: int = 2, group: int = 4) -> SelfTestFile:
    """Build the tiny model (seed 0) and generate `prompts x group` completions with proofs into work_dir."""
    from engine.generate import generate_rollouts
    from engine.inference.torch_backend import TorchBackend
    from engine.model.loading import load_model
    from engine.model.tiny import init_model
    from protocol.plan import Job
    from protocol.tasks.sources import open_source
    from protocol.tasks.spec import load_task_spec

    task = work_dir / "task.toml"
    task.write_text(SELF_TEST_TASK, encoding="utf-8")
    model_dir = init_model(work_dir / "tiny-model", seed=0)
    spec = load_task_spec(task)
    loaded = load_model(model_dir)
    job = Job(SELF_TEST_POOL, SELF_TEST_NODE, SELF_TEST_STEP, counter=0, prompts=prompts, group_size=group)
    started = time.perf_counter()
    generated = generate_rollouts(job, spec, open_source(spec), loaded, TorchBackend.from_loaded(loaded))
    written = generated.write(work_dir / "rollouts.parquet")
    seconds = time.perf_counter() - started
    return SelfTestFile(model_dir, task, written.path, prompts * group, written.units, seconds)


def verify_rollouts(made: SelfTestFile, rollouts: Path | None = None, *, timeout: float = 600.0) -> Verification:
    """Run `python -m validator.cli file` on `rollouts` (default: the generated file) in a child process."""
    command = [
        sys.executable, "-m", "validator.cli", "file", str(rollouts or made.rollouts),
        "--checkpoint", str(made.model_dir), "--task", str(made.task), "--node", SELF_TEST_NODE,
        "--pool", str(SELF_TEST_POOL), "--step", str(SELF_TEST_STEP), "--units", str(made.units),
    ]  # fmt: skip
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Verification(False, seconds=timeout, error=f"the validator took more than {timeout:.0f} s")
    seconds = time.perf_counter() - started
    if done.returncode in (0, 1):  # accepted, rejected: the verdict is on stdout
        try:
            verdict = json.loads(done.stdout)
        except ValueError:
            verdict = None
        if isinstance(verdict, dict) and "accepted" in verdict:
            return Verification(bool(verdict["accepted"]), verdict, seconds)
    last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]
    return Verification(False, seconds=seconds, error=f"exit {done.returncode}: {last}")


def judge_self_test(made: SelfTestFile, verification: Verification) -> Finding:
    generated = f"{made.rows} rollouts ({made.units} tokens) generated in {made.generate_seconds:.1f} s"
    if verification.error is not None:
        return fail(
            f"{generated}; the validator gave no verdict ({verification.error})",
            "check that this environment has the validator package: pip install -e . (PRIME_DEBUG=1 for details)",
        )
    timings: dict[str, float] = verification.verdict.get("timings", {})
    if not verification.accepted:
        verdict = verification.verdict
        return fail(
            f"{generated}; the validator REJECTED them: {verdict.get('reason_name')} "
            f"at check {verdict.get('check')}: {verdict.get('detail')}",
            "this machine's files would be slashed: do not stake; report it with `prime-node doctor --json` output",
        )
    return ok(
        f"{generated}, proofs verified in {timings.get('model', 0.0):.1f} s "
        f"(all checks {sum(timings.values()):.1f} s, {verification.seconds:.1f} s with the validator's start-up)"
    )


def check_self_test(config: DoctorConfig) -> Finding:
    if not config.self_test:
        return skip("--skip-self-test")
    from core.errors import NodeError

    with tempfile.TemporaryDirectory(prefix="prime-doctor-") as tmp:
        try:
            made = generate_self_test(Path(tmp))
        except NodeError as exc:  # the model, the task or generation: this install cannot produce a file
            return fail(f"generating the self-test file failed: {one_line(exc)}", "reinstall: make install")
        return judge_self_test(made, verify_rollouts(made, timeout=config.self_test_timeout))
