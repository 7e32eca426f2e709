"""Rollout files (DESIGN section 6): one Parquet file per upload, one row per completion, proofs per row.

`write_rollouts` on the worker, `read_rollouts` on the validator and trainer (`inspect_rollouts`, the same checks
without Python rows, in the coordinator's parsing processes); docs/rollout-format.md
describes the bytes for anyone writing another implementation.
"""

from protocol.rollouts.meta import FORMAT_VERSION, METADATA_KEY, RolloutMeta, SamplingMeta
from protocol.rollouts.reader import (
    DEFAULT_MAX_ROWS,
    DEFAULT_MAX_TOKENS,
    RolloutFile,
    RolloutSummary,
    inspect_rollouts,
    read_rollouts,
)
from protocol.rollouts.schema import (
    ARROW_SCHEMA,
    COLUMN_NAMES,
    FINISH_REASONS,
    NO_TARGET_LENGTH,
    FormatProblem,
    RolloutFormatError,
    RolloutRow,
    work_units,
)
from protocol.rollouts.writer import WrittenFile, encode_rollouts, write_rollouts

__all__ = [
    "ARROW_SCHEMA",
    "COLUMN_NAMES",
    "DEFAULT_MAX_ROWS",
    "DEFAULT_MAX_TOKENS",
    "FINISH_REASONS",
    "FORMAT_VERSION",
    "METADATA_KEY",
    "NO_TARGET_LENGTH",
    "FormatProblem",
    "RolloutFile",
    "RolloutFormatError",
    "RolloutMeta",
    "RolloutRow",
    "RolloutSummary",
    "SamplingMeta",
    "WrittenFile",
    "encode_rollouts",
    "inspect_rollouts",
    "read_rollouts",
    "work_units",
    "write_rollouts",
]
