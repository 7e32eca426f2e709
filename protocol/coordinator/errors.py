"""What goes wrong on the coordinator's wire: the codes of its refusals, their HTTP statuses, the error body, and
`ProtocolError` for a message that does not fit its schema.

Each refusal is a JSON body `{"error": code, "message": text}` under the status its code has here; the client
and the server both read this table, so a code cannot mean one status to one and another to the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from core.errors import NodeError
from protocol.signing import AuthFailure


class ProtocolError(NodeError):
    """A coordinator message that does not fit its schema: `message` names the message type, `field` its part."""

    def __init__(self, message: str, field: str, problem: str) -> None:
        super().__init__(f"{message}.{field}: {problem}")
        self.message, self.field, self.problem = message, field, problem


class ErrorCode(StrEnum):
    """The `error` of a refusal. The request-signature codes are `protocol.signing.AuthFailure`'s values."""

    # the body and its signature
    TOO_LARGE = "too_large"  # a body over its limit, or a file whose parse passed the memory limit
    MISSING_HEADER = AuthFailure.MISSING_HEADER.value
    MALFORMED_HEADER = AuthFailure.MALFORMED_HEADER.value
    TIMESTAMP_SKEW = AuthFailure.TIMESTAMP_SKEW.value
    BAD_SIGNATURE = AuthFailure.BAD_SIGNATURE.value
    SIGNER_MISMATCH = AuthFailure.SIGNER_MISMATCH.value
    REPLAYED_NONCE = AuthFailure.REPLAYED_NONCE.value
    NONCE_WINDOW = AuthFailure.NONCE_WINDOW.value
    BODY_MISMATCH = "body_mismatch"  # the body's sha256 is not the one X-Prime-Body-Sha256 declared (and was signed)
    BODY_TIMEOUT = "body_timeout"  # the body did not arrive within its time (ConnectionLimits.body_deadline)
    INCOMPLETE_BODY = "incomplete_body"  # the connection ended before the body did (the answer reaches no one)
    # who the signer is, and how often it asks
    RATE_LIMITED = "rate_limited"
    BUSY = "busy"  # the role lookups of unknown addresses are over their budget
    NOT_MEMBER = "not_member"
    NOT_VALIDATOR = "not_validator"
    # assignments
    NO_WORK = "no_work"
    # uploads
    BAD_NAME = "bad_name"
    HASH_MISMATCH = "hash_mismatch"
    QUOTA = "quota"
    MALFORMED_FILE = "malformed_file"
    PARSE_TIMEOUT = "parse_timeout"
    PARSER_DIED = "parser_died"
    WRONG_NODE = "wrong_node"
    WRONG_POOL = "wrong_pool"
    # a batch's leaf list (protocol.batches)
    MALFORMED_BATCH = "malformed_batch"  # not a list of 1 to MAX_BATCH_LEAVES leaves of at least one unit each
    ROOT_MISMATCH = "root_mismatch"  # the leaves' Merkle root is not the one the path names
    MISSING_FILES = "missing_files"  # a leaf names a rollout file the coordinator does not hold: upload it first
    # downloads and attestations
    NOT_FOUND = "not_found"
    LOST = "lost"  # stored and acknowledged, then lost: never the worker's fault
    BAD_ATTESTATION = "bad_attestation"
    HTTP = "http"  # no route, wrong method: the status is aiohttp's


STATUS: dict[ErrorCode, int] = {
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.MISSING_HEADER: 401,
    ErrorCode.MALFORMED_HEADER: 400,
    ErrorCode.TIMESTAMP_SKEW: 401,
    ErrorCode.BAD_SIGNATURE: 401,
    ErrorCode.SIGNER_MISMATCH: 401,
    ErrorCode.REPLAYED_NONCE: 409,
    ErrorCode.NONCE_WINDOW: 409,
    ErrorCode.BODY_MISMATCH: 400,
    ErrorCode.BODY_TIMEOUT: 408,
    ErrorCode.INCOMPLETE_BODY: 400,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.BUSY: 429,
    ErrorCode.NOT_MEMBER: 403,
    ErrorCode.NOT_VALIDATOR: 403,
    ErrorCode.NO_WORK: 503,
    ErrorCode.BAD_NAME: 400,
    ErrorCode.HASH_MISMATCH: 400,
    ErrorCode.QUOTA: 429,
    ErrorCode.MALFORMED_FILE: 422,
    ErrorCode.PARSE_TIMEOUT: 422,
    ErrorCode.PARSER_DIED: 422,
    ErrorCode.WRONG_NODE: 403,
    ErrorCode.WRONG_POOL: 422,
    ErrorCode.MALFORMED_BATCH: 400,
    ErrorCode.ROOT_MISMATCH: 400,
    ErrorCode.MISSING_FILES: 409,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.LOST: 410,
    ErrorCode.BAD_ATTESTATION: 400,
}  # ErrorCode.HTTP has none of its own


MAX_CODE_CHARS, MAX_MESSAGE_CHARS = 40, 300  # what a client keeps of a refusal's code and message


@dataclass(frozen=True)
class ErrorBody:
    """A refusal's body. `from_answer` never raises: an answer that is already an error is read for display."""

    error: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"error": self.error, "message": self.message}

    @classmethod
    def from_answer(cls, answer: object, raw: bytes) -> ErrorBody:
        """The code and message of an error answer, cut to size; `http` and the raw bytes when it has none."""
        error = answer if isinstance(answer, dict) else {}
        code, message = error.get("error", "http"), error.get("message", raw[:200])
        return cls(str(code)[:MAX_CODE_CHARS], str(message)[:MAX_MESSAGE_CHARS])
