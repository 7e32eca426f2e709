"""`validator.toml`: the `[validator]` table `prime-validate run --config FILE` reads (configs/validator.toml).

Every key is optional. A flag overrides the file and the file overrides the default; relative paths are resolved
against the file's folder. Unknown keys and wrong types are refused with the file and the key named.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from validator.errors import ValidatorError

# key -> (type, meaning); the ValidatorConfig fields are checked again, for their ranges, when the config is built
KEYS: dict[str, type | tuple[type, ...]] = {
    "state": str,
    "coordinator": str,
    "checkpoints": list,
    "task": str,
    "async_level": int,
    "thresholds": str,
    "device": str,
    "dtype": str,
    "grace": (int, float),
    "poll": (int, float),
    "metrics_port": int,
    "dashboard_port": int,
    "p2p_port": int,
    "threads": int,
    "sampling_margin": (int, float),
    "logprob_atol": (int, float),
    "max_file_bytes": int,
    "prefill_batch_size": int,
    "clear_factor": (int, float),
    "max_rechecked_rows": int,
    "checkpoints_kept": int,
    "clock_slack": (int, float),
    "confirmations": int,
}
PATH_KEYS = ("state", "task")


class ValidatorSettingsError(ValidatorError, ValueError):
    """validator.toml cannot be read or holds a bad key; the message names the file and the key."""


def read_settings(path: Path | None) -> dict[str, Any]:
    """The `[validator]` table of `path`, type-checked, relative paths made absolute; {} without a file."""
    if path is None:
        return {}
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ValidatorSettingsError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValidatorSettingsError(f"{path}: not readable TOML: {exc}") from None
    extra = set(raw) - {"validator"}
    if extra:
        raise ValidatorSettingsError(f"{path}: unknown table or key {sorted(extra)[0]!r}; expected [validator]")
    table = raw.get("validator", {})
    if not isinstance(table, dict):
        raise ValidatorSettingsError(f"{path}: validator must be a table")
    settings: dict[str, Any] = {}
    for key, value in table.items():
        kind = KEYS.get(key)
        if kind is None:
            raise ValidatorSettingsError(f"{path}: unknown key validator.{key}; known: {', '.join(KEYS)}")
        if isinstance(value, bool) or not isinstance(value, kind):
            wanted = " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
            raise ValidatorSettingsError(f"{path}: validator.{key} must be {wanted}, got {value!r}")
        settings[key] = value
    if not all(isinstance(url, str) for url in settings.get("checkpoints", [])):
        raise ValidatorSettingsError(f"{path}: validator.checkpoints must be a list of URLs")
    for key in PATH_KEYS:
        if key in settings:
            settings[key] = str((path.parent / Path(settings[key]).expanduser()).resolve())
    return settings
