"""A validator's own failure is never the worker's fault (issue 32, attack 1): out of memory, disk or descriptors, a
checkpoint it cannot have, a fault in its own code are `CouldNotJudge`, never a verdict; `prime-validate file` exits 3.

The attack for real: an honest file verified in a child process whose address space is capped just above what it
holds once the model is loaded (tests/validator/capped_verify.py). Before issue 32 the small caps made pyarrow's
allocation fail inside the reader, which called it undecodable data: reason 2, `corrupt`, a slash. Then each cause
injected where it is raised, by wrapping the real code from outside (pyarrow's decoder, the checkpoint fetch, the
model's forward pass, the task's scorer).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from engine.generate import Generated
from engine.model.loading import LoadedModel
from ledger.accounts import dev_account
from ledger.chain import free_port
from ledger.types import Reason
from protocol.rollouts import encode_rollouts
from protocol.signing import SigningDomain
from protocol.tasks.sources import TaskSource
from protocol.tasks.spec import TaskSpec
from shardcast.trust import TrustPolicy
from validator.checkpoints import Checkpoints
from validator.cli import EXIT_COULD_NOT_JUDGE, app
from validator.errors import CouldNotJudge, Unjudged
from validator.verdict import Verdict
from validator.verify import verify_file

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "configs" / "tasks" / "default.toml"
# TOKENIZERS_PARALLELISM: the tokenizer's thread pool, when it cannot start under a cap, panics (a CouldNotJudge) and
# then fails every later call of the process, so the scan could not show the same process accepting with memory enough
ENV = os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PRIME_DEBUG": ""}
runner = CliRunner()


@pytest.fixture(scope="module")
def honest(generate: Callable[..., Generated]) -> bytes:
    generated = generate(counter=32, prompts=2, group=2)
    return encode_rollouts(generated.meta, generated.rows)


@pytest.fixture
def honest_file(tmp_path: Path, honest: bytes) -> Path:
    path = tmp_path / "honest.parquet"
    path.write_bytes(honest)
    return path


def raising(exc: BaseException) -> Callable[..., NoReturn]:
    def fail(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise exc

    return fail


def capped(mode: str, file: Path, model: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.validator.capped_verify", mode, str(file), str(model), str(TASK)],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip


# --- the attack, for real -----------------------------------------------------------------------------


@pytest.mark.slow
def test_an_honest_file_verified_with_the_address_space_capped_just_above_the_loaded_model_is_never_rejected(
    honest_file: Path, model_dirs: dict[str, Path]
) -> None:
    done = capped("scan", honest_file, model_dirs["m0"])
    assert done.returncode == 0, done.stderr[-3000:]
    outcomes = json.loads(done.stdout.splitlines()[-1])
    rejected = [o for o in outcomes if o.get("accepted") is False]
    assert not rejected, rejected  # before issue 32: reason 2, "undecodable Parquet data: malloc of size ... failed"
    unjudged = [o for o in outcomes if "raised" in o]
    assert {o["raised"] for o in unjudged} == {"CouldNotJudge"}, unjudged
    # the attack's own path was reached: pyarrow's allocation failed while the reader decoded
    assert any(o["check"] == "format" and o["cause"] == "memory" and "ArrowMemoryError" in o["message"]
               for o in unjudged), unjudged  # fmt: skip
    assert outcomes[-1]["accepted"] is True  # with memory enough, the same process accepts the same file


@pytest.mark.slow
def test_prime_validate_file_capped_just_above_the_loaded_model_exits_3_with_one_line_and_no_traceback(
    honest_file: Path, model_dirs: dict[str, Path]
) -> None:
    done = capped("cli", honest_file, model_dirs["m0"])
    assert done.returncode == EXIT_COULD_NOT_JUDGE, (done.returncode, done.stdout, done.stderr[-3000:])
    assert done.stdout == ""  # no verdict
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("could not judge: "), done.stderr[-3000:]


# --- each cause where it is raised ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raised", "cause"),
    [
        (pa.ArrowMemoryError("malloc of size 26944 failed"), Unjudged.MEMORY),  # the attack's message
        (MemoryError(), Unjudged.MEMORY),
        (OSError(errno.EMFILE, "Too many open files"), Unjudged.DESCRIPTORS),
        (OSError(errno.ENOSPC, "No space left on device"), Unjudged.DISK),
    ],
    ids=["ArrowMemoryError", "MemoryError", "EMFILE", "ENOSPC"],
)
def test_a_resource_that_runs_out_while_pyarrow_decodes_is_could_not_judge_never_reason_2(
    monkeypatch: pytest.MonkeyPatch,
    honest: bytes,
    verify: Callable[..., Verdict],
    raised: BaseException,
    cause: Unjudged,
) -> None:
    monkeypatch.setattr(pq.ParquetFile, "read", raising(raised))
    with pytest.raises(CouldNotJudge) as caught:
        verify(honest)
    assert (caught.value.check, caught.value.cause) == ("format", cause)
    assert type(raised).__name__ in str(caught.value)


def test_what_pyarrow_raises_on_bad_bytes_is_still_reason_2(
    monkeypatch: pytest.MonkeyPatch, honest: bytes, verify: Callable[..., Verdict]
) -> None:
    # pyarrow answers garbage with an OSError that carries no errno: the file's fault, whatever the type says
    monkeypatch.setattr(pq.ParquetFile, "read", raising(OSError("Couldn't deserialize thrift: TProtocolException")))
    verdict = verify(honest)
    assert (verdict.accepted, verdict.reason, verdict.check) == (False, Reason.BAD_FORMAT, "format")
    assert verdict.evidence["problem"] == "corrupt"


def test_a_checkpoint_that_cannot_be_fetched_or_stored_is_could_not_judge(
    tmp_path: Path, honest: bytes, task_spec: TaskSpec, task_source: TaskSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # no source answers
    domain = SigningDomain(31337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0")
    policy = TrustPolicy(domain, dev_account(0).address, 0)
    checkpoints = Checkpoints(tmp_path / "checkpoints", [closed], policy, keep=1)

    def fetch(step: int) -> LoadedModel:  # as the daemon's checkpoint_of, in the verification thread
        import asyncio

        return asyncio.run(checkpoints.get(step))

    with pytest.raises(CouldNotJudge) as caught:
        verify_file(honest, spec=task_spec, checkpoint=fetch, source=task_source)
    assert (caught.value.check, caught.value.cause) == ("model", Unjudged.CHECKPOINT)

    monkeypatch.setattr(Checkpoints, "get", raising(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(CouldNotJudge) as caught:
        verify_file(honest, spec=task_spec, checkpoint=fetch, source=task_source)
    assert (caught.value.check, caught.value.cause) == ("model", Unjudged.DISK)


def test_out_of_memory_in_the_model_check_is_could_not_judge(
    monkeypatch: pytest.MonkeyPatch, honest: bytes, checkpoint: LoadedModel, verify: Callable[..., Verdict]
) -> None:
    body = checkpoint.model.get_decoder()  # what the prefill runs (engine.model.forward.forward_hidden)
    cuda_oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
    monkeypatch.setattr(body, "forward", raising(cuda_oom))
    with pytest.raises(CouldNotJudge) as caught:
        verify(honest)
    assert (caught.value.check, caught.value.cause) == ("model", Unjudged.MEMORY)
    # torch's CPU allocator raises a plain RuntimeError: no type says memory, but it escaped a check all the same
    cpu_oom = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1073741824 bytes.")
    monkeypatch.setattr(body, "forward", raising(cpu_oom))
    with pytest.raises(CouldNotJudge) as caught:
        verify(honest)
    assert (caught.value.check, caught.value.cause) == ("model", Unjudged.INTERNAL)


def test_a_fault_in_a_check_of_its_own_is_could_not_judge(
    monkeypatch: pytest.MonkeyPatch, honest: bytes, verify: Callable[..., Verdict]
) -> None:
    monkeypatch.setattr("validator.checks.score_completion", raising(KeyError("answer")))
    with pytest.raises(CouldNotJudge) as caught:
        verify(honest)
    assert (caught.value.check, caught.value.cause) == ("rewards", Unjudged.INTERNAL)
    assert verify(honest, work_key=b"\x00" * 32).reason == Reason.HASH_MISMATCH  # checks before it still judge


# --- prime-validate file ------------------------------------------------------------------------------


def _validate(file: Path, model: Path) -> Any:
    args = ["file", str(file), "--checkpoint", str(model), "--task", str(TASK)]
    return runner.invoke(app, args, env={"PRIME_DEBUG": None})


@pytest.mark.parametrize(
    ("raised", "hint"),
    [
        (pa.ArrowMemoryError("malloc of size 26944 failed"), "give the validator more memory"),
        (OSError(errno.EMFILE, "Too many open files"), "ulimit -n"),
        (ZeroDivisionError("division by zero"), "PRIME_DEBUG=1"),
    ],
    ids=["memory", "descriptors", "internal"],
)
def test_prime_validate_file_that_cannot_judge_exits_3_with_one_line_saying_what_to_do(
    monkeypatch: pytest.MonkeyPatch, honest_file: Path, model_dirs: dict[str, Path], raised: BaseException, hint: str
) -> None:
    monkeypatch.setattr(pq.ParquetFile, "read", raising(raised))
    result = _validate(honest_file, model_dirs["m0"])
    assert result.exit_code == EXIT_COULD_NOT_JUDGE, result.output
    assert result.stdout == "" and "Traceback" not in result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("could not judge: the format check failed on this validator's side") and hint in line


def test_prime_validate_file_help_lists_its_four_exit_codes() -> None:
    result = runner.invoke(app, ["file", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for code in ("0 accepted", "1 rejected", "2 refused usage", "3 could not judge"):
        assert code in text, text
