"""The status request/response protocol, `/prime/status/1.0.0`: ask a peer what it is doing.

One exchange per stream, each side one varint-length-prefixed canonical JSON object (py-libp2p's
`RequestResponse` does the framing, timeouts, size limits and the inbound concurrency bound). The request
is `{}` for now; new fields may be added and old servers ignore them. The response is whatever the
answering node's status handler returns (its role, step, relays ...), at most `max_status_bytes`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from libp2p.custom_types import TProtocol

from core.safejson import json_too_deep

STATUS_PROTOCOL = TProtocol("/prime/status/1.0.0")
MAX_REQUEST_BYTES = 4096
MAX_JSON_DEPTH = 16

StatusHandler = Callable[[str], Awaitable[Mapping[str, Any]]]
"""Answers a status request; called on the asyncio loop with the requesting peer's id."""


def _encode(value: Mapping[str, Any]) -> bytes:
    if not isinstance(value, Mapping):
        raise TypeError(f"a status message must be a JSON object, got {type(value).__name__}")
    return json.dumps(dict(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _decode(payload: bytes) -> dict[str, Any]:
    if json_too_deep(payload, MAX_JSON_DEPTH):  # see core.safejson: deep nesting crashes the parser
        raise ValueError(f"status JSON nested deeper than {MAX_JSON_DEPTH}")
    value = json.loads(payload)
    if not isinstance(value, dict):
        raise ValueError(f"a status message must be a JSON object, got {type(value).__name__}")
    return value


class StatusCodec:
    """JSON objects both ways (py-libp2p's `RequestResponseCodec` protocol)."""

    def encode_request(self, request: Mapping[str, Any]) -> bytes:
        return _encode(request)

    def decode_request(self, payload: bytes) -> dict[str, Any]:
        return _decode(payload)

    def encode_response(self, response: Mapping[str, Any]) -> bytes:
        return _encode(response)

    def decode_response(self, payload: bytes) -> dict[str, Any]:
        return _decode(payload)
