"""Strict readers of the fields of a coordinator message, for JSON that came from another node.

Every reader takes the message's type name and the field's name, so a refusal says which part of which message
was wrong (`ProtocolError`). What they refuse: a missing key, a value of the wrong JSON type (a bool where a
number goes: `True` is an `int` in Python), a number out of its range (negative, past the width the signed
messages give it, not finite), a string past its length or not of its form, a list past its count, and an object
or a list where a scalar goes. Keys a reader does not ask for are ignored, so a newer peer may add fields.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, TypeVar

from protocol.coordinator.errors import ProtocolError

UINT8_MAX, UINT32_MAX, UINT64_MAX, UINT256_MAX = 2**8 - 1, 2**32 - 1, 2**64 - 1, 2**256 - 1
MAX_UNIX_SECONDS = 2**40  # past the year 36000: no clock of a peer is this far on
_HEX = re.compile(r"[0-9a-fA-F]*")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_Sized = TypeVar("_Sized", str, list[Any])


def obj(message: str, value: object, field: str = "") -> Mapping[str, Any]:
    """`value` as a JSON object (the whole message when `field` is empty)."""
    if not isinstance(value, dict):
        raise ProtocolError(message, field or "(message)", f"must be a JSON object, got {_kind(value)}")
    return value


def get(message: str, raw: Mapping[str, Any], field: str) -> object:
    if field not in raw:
        raise ProtocolError(message, field, "is missing")
    return raw[field]


def uint(message: str, raw: Mapping[str, Any], field: str, maximum: int, *, minimum: int = 0) -> int:
    value = get(message, raw, field)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(message, field, f"must be an integer, got {_kind(value)}")
    if not minimum <= value <= maximum:
        raise ProtocolError(message, field, f"must be {minimum} to {maximum}, got {_short(value)}")
    return value


def boolean(message: str, raw: Mapping[str, Any], field: str) -> bool:
    value = get(message, raw, field)
    if not isinstance(value, bool):
        raise ProtocolError(message, field, f"must be true or false, got {_kind(value)}")
    return value


def seconds(message: str, raw: Mapping[str, Any], field: str) -> float:
    """A unix time: a finite number from 0 to MAX_UNIX_SECONDS."""
    value = get(message, raw, field)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ProtocolError(message, field, f"must be a number, got {_kind(value)}")
    if not (math.isfinite(value) and 0 <= value <= MAX_UNIX_SECONDS):
        raise ProtocolError(message, field, f"must be a unix time, got {_short(value)}")
    return float(value)


def text(message: str, raw: Mapping[str, Any], field: str, max_chars: int) -> str:
    return _sized(message, raw, field, str, max_chars, "be a string", "be at most {} characters")


def address(message: str, raw: Mapping[str, Any], field: str) -> str:
    """An account address: 0x and 40 hex digits (whether its checksum casing is right is the caller's to ask)."""
    value = text(message, raw, field, 42)
    if not _ADDRESS.fullmatch(value):
        raise ProtocolError(message, field, f"must be 0x and 40 hex digits, got {value!r}")
    return value


def hex_bytes(message: str, raw: Mapping[str, Any], field: str, length: int, *, prefix: bool = True) -> bytes:
    """`length` bytes written as 0x and hex digits (`prefix=False`: the 0x may be left out, as requests to the
    coordinator always could)."""
    value = text(message, raw, field, 2 + 2 * length)
    digits = value[2:] if value.startswith("0x") else value
    if (prefix and not value.startswith("0x")) or len(digits) != 2 * length or not _HEX.fullmatch(digits):
        raise ProtocolError(message, field, f"must be 0x and {2 * length} hex digits, got {value[:80]!r}")
    return bytes.fromhex(digits)


def optional_hex(message: str, raw: Mapping[str, Any], field: str, length: int) -> bytes | None:
    """A `hex_bytes` field that may be absent (None)."""
    return hex_bytes(message, raw, field, length) if field in raw else None


def items(message: str, raw: Mapping[str, Any], field: str, max_items: int) -> list[Any]:
    return _sized(message, raw, field, list, max_items, "be a JSON list", "hold at most {} entries")


def _sized(
    message: str, raw: Mapping[str, Any], field: str, kind: type[_Sized], limit: int, what: str, at_most: str
) -> _Sized:
    """A string or a list of at most `limit` characters or entries; `what` and `at_most` word a refusal."""
    value = get(message, raw, field)
    if not isinstance(value, kind):
        raise ProtocolError(message, field, f"must {what}, got {_kind(value)}")
    if len(value) > limit:
        raise ProtocolError(message, field, f"must {at_most.format(limit)}, got {len(value)}")
    return value


def _kind(value: object) -> str:
    names = {bool: "a bool", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "an object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _short(value: object) -> str:
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."
