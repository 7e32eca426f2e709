"""Moved to `ledger.cli.common` (ledger <- node); re-exported for existing imports."""

from ledger.cli.common import DEBUG_ENV_VAR, KNOWN_ERRORS, cli_errors, debug_enabled, one_line  # noqa: F401
