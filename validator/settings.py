"""`ValidatorSettings`: what `prime-validate run` reads from validator.toml's `[validator]` table and its flags.

Every field is declared once here (core.config): its TOML key, type, default, bounds and flag; those every daemon
shares (state and where the pool's parts are) in protocol.pool_spec.DaemonSettings. The file overrides the defaults
and a flag overrides the file; relative paths in the file are resolved against its folder; unknown keys, wrong types
and values out of bounds are refused naming the file and the key, or the flag. A field that is also a
`ValidatorConfig` field has that field's name (`grace_seconds`, whose TOML key and flag are `grace`) and its default;
`config_fields()` hands them over. configs/validator.toml documents every key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from core.config import setting
from protocol.pool_spec import DaemonSettings, state_setting
from protocol.terms import MAX_ASYNC_LEVEL, MAX_FILE_BYTES, MIN_FILE_BYTES
from validator.config import MAX_GRACE_SECONDS, MAX_JUDGE_ATTEMPTS, MAX_PREFILL_BATCH, ValidatorConfig

THRESHOLD_PRESETS = ("cpu-fp32", "bf16", "gpu-bf16")  # validator.cli.ThresholdPreset's values
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16")
MAX_PORT = 65535
_DEFAULTS = ValidatorConfig()  # the defaults of the fields below that are ValidatorConfig's


@dataclass(frozen=True)
class ValidatorSettings(DaemonSettings):
    """The validator daemon's settings; those named in TUNING and the daemon's timings become `ValidatorConfig`."""

    TABLE: ClassVar[str] = "validator"
    # ValidatorConfig fields set from here as they are; async_level, max_file_bytes, device, dtype and thresholds are
    # the pool's terms or its precision's, which `prime-validate run` checks and resolves first
    TUNING: ClassVar[tuple[str, ...]] = (
        "grace_seconds",
        "poll_seconds",
        "confirmations",
        "sampling_margin",
        "logprob_atol",
        "prefill_batch_size",
        "clear_factor",
        "max_rechecked_rows",
        "checkpoints_kept",
        "clock_slack",
        "takeover_seconds",
        "heartbeat_seconds",
        "judge_attempts",
    )

    state: Path | None = state_setting(
        "cursor, verdicts and checkpoints; None: ~/.local/share/prime-node/pool-N/validator-ADDRESS"
    )
    # the pool's terms and precision: checked against the pool's at start
    async_level: int | None = setting(
        "steps a file may lag the pool's step; None: the pool's",
        default=None,
        flag="--async-level",
        minimum=0,
        maximum=MAX_ASYNC_LEVEL,
    )
    max_file_bytes: int | None = setting(
        "larger files are rejected unread (reason 2); None: the pool's",
        default=None,
        minimum=MIN_FILE_BYTES,
        maximum=MAX_FILE_BYTES,
    )
    device: str = setting(
        "where checkpoints recompute (auto: CUDA when torch sees a GPU)",
        default="auto",
        flag="--device",
        choices=DEVICES,
    )
    dtype: str = setting(
        "the precision to recompute in: the task's sampling.dtype", default="auto", flag="--dtype", choices=DTYPES
    )
    thresholds: str | None = setting(
        "TOPLOC limits; None: those calibrated for the precision",
        default=None,
        flag="--thresholds",
        choices=THRESHOLD_PRESETS,
    )
    # the daemon
    grace_seconds: float = setting(
        "seconds a submitted file may be missing from the coordinator before reason 8",
        default=_DEFAULTS.grace_seconds,
        key="grace",
        flag="--grace",
        above=0,
        maximum=MAX_GRACE_SECONDS,
    )
    poll_seconds: float = setting(
        "seconds between looks at the chain",
        default=_DEFAULTS.poll_seconds,
        key="poll",
        flag="--poll",
        above=0,
        maximum=3600,
    )
    confirmations: int | None = setting(
        "blocks to stay behind the head; None: 0 on a local chain, else 12",
        default=None,
        flag="--confirmations",
        minimum=0,
        maximum=10_000,
    )
    metrics_port: int | None = setting(
        "serve /metrics on 127.0.0.1 (0: any port)", default=None, flag="--metrics-port", minimum=0, maximum=MAX_PORT
    )
    dashboard_port: int | None = setting(
        "serve the dashboard on 127.0.0.1 (0: any port)",
        default=None,
        flag="--dashboard-port",
        minimum=0,
        maximum=MAX_PORT,
    )
    p2p_port: int | None = setting(
        "gossip attestations and heartbeats on this port (0: any); validators sharing a pool need it",
        default=None,
        flag="--p2p-port",
        minimum=0,
        maximum=MAX_PORT,
    )
    threads: int = setting(
        "torch threads for recomputation (0: torch's default)", default=0, flag="--threads", minimum=0, maximum=1024
    )
    # tolerances and limits (docs/verification.md); None: the ones calibrated for the pool's precision
    sampling_margin: float | None = setting(
        "Gumbel-score slack when re-checking sampled tokens", default=None, minimum=0, maximum=1
    )
    logprob_atol: float | None = setting("largest |recorded - recomputed| log-prob", default=None, above=0, maximum=1)
    prefill_batch_size: int = setting(
        "rows recomputed per forward pass", default=_DEFAULTS.prefill_batch_size, minimum=1, maximum=MAX_PREFILL_BATCH
    )
    clear_factor: float = setting(
        "a float64 recheck must fail by this many times a threshold to slash",
        default=_DEFAULTS.clear_factor,
        above=1,
        maximum=1000,
    )
    max_rechecked_rows: int = setting(
        "failing rows of one file rechecked in float64", default=_DEFAULTS.max_rechecked_rows, minimum=1, maximum=1024
    )
    checkpoints_kept: int = setting(
        "checkpoints held loaded, least recently used dropped first",
        default=_DEFAULTS.checkpoints_kept,
        minimum=1,
        maximum=64,
    )
    clock_slack: float = setting(
        "seconds the trainer's clock and block timestamps may disagree",
        default=_DEFAULTS.clock_slack,
        minimum=0,
        maximum=3600,
    )

    takeover_seconds: float = setting(
        "seconds without a heartbeat before another validator's share is taken over",
        default=_DEFAULTS.takeover_seconds,
        key="takeover",
        flag="--takeover",
        minimum=1,
        maximum=3600,
    )
    heartbeat_seconds: float = setting(
        "seconds between this validator's heartbeats (at most half of takeover)",
        default=_DEFAULTS.heartbeat_seconds,
        key="heartbeat",
        flag="--heartbeat",
        above=0,
        maximum=600,
    )
    judge_attempts: int = setting(
        "verifications of a file that may fail on this validator's side before it is recorded unverifiable",
        default=_DEFAULTS.judge_attempts,
        minimum=1,
        maximum=MAX_JUDGE_ATTEMPTS,
    )

    def config_fields(self) -> dict[str, Any]:
        """The TUNING fields as `ValidatorConfig` keyword arguments; one left None keeps ValidatorConfig's (or the
        precision's) default."""
        values = {name: getattr(self, name) for name in self.TUNING}
        return {name: value for name, value in values.items() if value is not None}
