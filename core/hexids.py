"""Chain identifiers as people type them: 0x-addresses in any letter case, and 32-byte values in hex."""

from __future__ import annotations

import re

from core.errors import ParseError

_HEX32_RE = re.compile(r"^(0x)?[0-9a-fA-F]{64}$")


def parse_address(text: str, *, what: str) -> str:
    """A 0x-address in any letter case -> its checksummed form; `what` names the flag in the error."""
    from eth_utils import is_address, to_checksum_address

    if not is_address(text):
        raise ParseError(f"{what}: not an address: {text!r}", text=text)
    return str(to_checksum_address(text))


def parse_bytes32(text: str, *, what: str) -> bytes:
    """64 hex digits, with or without 0x."""
    if not _HEX32_RE.match(text):
        raise ParseError(f"{what}: expected 32 bytes as 64 hex digits, got {text!r}", text=text)
    return bytes.fromhex(text.removeprefix("0x"))
