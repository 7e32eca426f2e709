"""A batch's leaf list on the wire: what the worker uploads (`PUT /v1/batches/{root}`) and validators download.

A batch is one record on chain (`WorkLedger.submitBatch`: root, count, total units); its leaves, one per rollout file,
are what a validator needs to check it, so the list travels beside the files. The format is binary
(`application/octet-stream`): `count` records of `LEAF_BYTES`, in leaf order, each the file's 32-byte work key
followed by its units as an 8-byte big-endian unsigned integer. A list holds 1 to `MAX_BATCH_LEAVES` leaves, each of
at least one unit (a file's units are its output tokens). The tree the root is built from is `ledger.merkle`'s.

Two leaves naming one file decode as they are: that is the worker's fault to be punished, so the validator must see
it (`duplicate_keys` finds them). Nothing here does IO.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from core.errors import NodeError
from ledger.merkle import Leaf

MAX_BATCH_LEAVES = 4096  # leaves of one batch, at most, whoever sends or reads it
_RECORD = struct.Struct(">32sQ")  # a work key, then units as a uint64 (big-endian)
LEAF_BYTES = _RECORD.size  # 40
MAX_BATCH_BYTES = MAX_BATCH_LEAVES * LEAF_BYTES  # 160 KiB: the largest body of a leaf list
MAX_LEAF_UNITS = 2**64 - 1  # what 8 bytes hold
MEDIA_TYPE = "application/octet-stream"


class LeafListError(NodeError):
    """A leaf list that cannot be written or read: `field` names the part (`body`, `leaf 3`), `problem` what is wrong.

    Not a `protocol.coordinator.ProtocolError`, though the coordinator's messages carry the list: the coordinator
    protocol imports this module, and the two parts of `protocol` may not import each other (as the rollout format's
    `RolloutFormatError`)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"LeafList.{field}: {problem}")
        self.field, self.problem = field, problem


def encode_leaves(leaves: Sequence[Leaf]) -> bytes:
    """The list's bytes; refuses what `decode_leaves` would refuse at `MAX_BATCH_LEAVES` (no leaves, too many, a
    leaf of 0 units or of more than 8 bytes hold)."""
    _check_count(len(leaves), MAX_BATCH_LEAVES)
    for index, leaf in enumerate(leaves):
        if not 1 <= leaf.units <= MAX_LEAF_UNITS:
            raise LeafListError(f"leaf {index}", f"units must be 1 to {MAX_LEAF_UNITS}, got {leaf.units}")
    return b"".join(_RECORD.pack(leaf.work_key, leaf.units) for leaf in leaves)


def decode_leaves(data: bytes, *, max_leaves: int) -> tuple[Leaf, ...]:
    """The leaves of a list of at most `max_leaves`, in order; `LeafListError` for an empty body, a length that is
    not a whole number of records, more than `max_leaves` of them, or a leaf of 0 units. Repeated keys are kept."""
    count, rest = divmod(len(data), LEAF_BYTES)
    if rest:
        raise LeafListError("body", f"is {len(data)} bytes, not a whole number of {LEAF_BYTES}-byte leaves")
    _check_count(count, max_leaves)
    leaves = []
    for index, (work_key, units) in enumerate(_RECORD.iter_unpack(data)):
        if units == 0:
            raise LeafListError(f"leaf {index}", "claims 0 units: a file holds at least one output token")
        leaves.append(Leaf(work_key, units))
    return tuple(leaves)


def duplicate_keys(leaves: Sequence[Leaf]) -> list[int]:
    """The indices of the leaves whose work key an earlier leaf of the list names already, in order."""
    seen: set[bytes] = set()
    repeated = []
    for index, leaf in enumerate(leaves):
        if leaf.work_key in seen:
            repeated.append(index)
        seen.add(leaf.work_key)
    return repeated


def _check_count(count: int, max_leaves: int) -> None:
    if count == 0:
        raise LeafListError("body", "holds no leaves: a batch holds at least one")
    if count > max_leaves:
        raise LeafListError("body", f"holds {count} leaves, more than the {max_leaves} a batch may hold")
