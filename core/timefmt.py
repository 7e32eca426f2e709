"""Chain timestamps and durations: printed for people, and parsed from what they type (`90m`, `7d`)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from core.errors import ParseError

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400, "w": 604_800}
_DURATION_RE = re.compile(r"(?:\d+[smhdw])+")


def format_time(timestamp: int) -> str:
    """A chain timestamp as '2025-01-31 12:00:00 UTC'."""
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_duration(seconds: int) -> str:
    """86400 -> '1d', 5400 -> '1h 30m', 0 -> '0s'."""
    parts = []
    remaining = max(0, seconds)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    return " ".join(parts) or "0s"


def parse_duration(text: str) -> int:
    """'3600' (seconds), '90m', '24h', '7d', '1h30m' -> seconds."""
    value = text.strip().lower()
    if value.isdigit():
        return int(value)
    if not _DURATION_RE.fullmatch(value):
        raise ParseError(
            f"not a duration: {text!r}; give seconds, or a number with s, m, h, d or w (90m, 24h, 7d)", text=text
        )
    return sum(int(count) * _DURATION_UNITS[unit] for count, unit in re.findall(r"(\d+)([smhdw])", value))
