"""Parsing JSON from strangers without letting its nesting crash the process.

Importing eth_account raises the interpreter's recursion limit to 100000 (its dependency py_ecc does it on
import), so Python's C JSON parser no longer stops deep nesting with a RecursionError: 64 KiB of `[` overflows
the C stack and kills the process with a segfault. Every parse of bytes from a peer, a relay, a coordinator or
an uploaded file goes through `loads_bounded`, or checks `json_too_deep` first.
"""

from __future__ import annotations

import json
from typing import Any


class TooDeepError(ValueError):
    """The JSON nests deeper than its format allows; it was not parsed."""


def json_too_deep(data: bytes, limit: int) -> bool:
    """True if `data` nests arrays or objects deeper than `limit` (brackets inside strings do not count).

    The byte counts are a fast path for the usual flat document.
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    depth, in_string, escaped = 0, False, False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return False


def loads_bounded(data: bytes | str, max_depth: int, **options: Any) -> Any:
    """`json.loads(data, **options)` once `data` is known to nest at most `max_depth` levels.

    Raises TooDeepError for deeper input, and json's own ValueError (JSONDecodeError, bad UTF-8) otherwise.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if json_too_deep(raw, max_depth):
        raise TooDeepError(f"JSON nested deeper than {max_depth} levels")
    return json.loads(raw, **options)
