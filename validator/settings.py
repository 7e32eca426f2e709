"""`ValidatorSettings`: what `prime-validate run` reads from validator.toml's `[validator]` table and its flags.

Every field is declared once here (core.config): its TOML key, type, default, bounds and flag; those every daemon
shares (state and where the pool's parts are) in protocol.pool_spec.DaemonSettings. The file overrides the defaults
and a flag overrides the file; relative paths in the file are resolved against its folder; unknown keys, wrong types
and values out of bounds are refused naming the file and the key, or the flag. The tuning it shares with
`ValidatorConfig` (the config every file is judged by) is declared once, in `validator.config.Tuning`, which both
types extend (`grace_seconds`, whose TOML key and flag are `grace`); a setting that is None unless set (a pool's term,
a tolerance) takes the bounds of its `ValidatorConfig` field (`setting_of`). configs/validator.toml documents every
key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from core.config import declared, port_setting, setting, setting_of
from protocol.pool_spec import DaemonSettings, state_setting
from validator.config import Tuning, ValidatorConfig

THRESHOLD_PRESETS = ("cpu-fp32", "bf16", "gpu-bf16")  # validator.cli.ThresholdPreset's values
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16")


@dataclass(frozen=True)
class ValidatorSettings(DaemonSettings, Tuning):
    """The validator daemon's settings: the tuning it shares with `ValidatorConfig` (declared once, in `Tuning`), and
    its own. The pool's terms and the precision's tolerances are None here unless set: `prime-validate run` checks a
    set one against the pool's and resolves the rest (`config_fields` hands the set ones over)."""

    TABLE: ClassVar[str] = "validator"

    state: Path | None = state_setting(
        "cursor, verdicts and checkpoints; None: ~/.local/share/prime-node/pool-N/validator-ADDRESS"
    )
    # the pool's terms and precision: checked against the pool's at start
    async_level: int | None = setting_of(
        ValidatorConfig, "async_level", "steps a file may lag the pool's step; None: the pool's", default=None
    )
    max_file_bytes: int | None = setting_of(
        ValidatorConfig, "max_file_bytes", "larger files are rejected unread (reason 2); None: the pool's", default=None
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
    # tolerances (docs/verification.md); None: the ones calibrated for the pool's precision
    sampling_margin: float | None = setting_of(
        ValidatorConfig, "sampling_margin", "Gumbel-score slack; None: the precision's calibration", default=None
    )
    logprob_atol: float | None = setting_of(
        ValidatorConfig, "logprob_atol", "largest log-prob difference; None: the precision's calibration", default=None
    )
    # serving
    metrics_port: int | None = port_setting("serve /metrics on 127.0.0.1 (0: any port)", flag="--metrics-port")
    dashboard_port: int | None = port_setting("serve the dashboard on 127.0.0.1 (0: any port)", flag="--dashboard-port")
    p2p_port: int | None = port_setting(
        "gossip attestations and heartbeats on this port (0: any); validators sharing a pool need it", flag="--p2p-port"
    )
    threads: int = setting(
        "torch threads for recomputation (0: torch's default)", default=0, flag="--threads", minimum=0, maximum=1024
    )

    def config_fields(self) -> dict[str, Any]:
        """The `ValidatorConfig` keyword arguments these settings give: every tuning field, and the tolerances when
        set (one left None keeps the precision's calibration)."""
        names = [d.name for d in declared(Tuning)] + ["sampling_margin", "logprob_atol"]
        values = {name: getattr(self, name) for name in names}
        return {name: value for name, value in values.items() if value is not None}
