"""What a worker reads from a batch's record and its invalidation: pure functions, shared by the daemon, `prime-node
status|claim` and the dashboard.

A batch is one record on chain (`WorkLedger.submitBatch`): a Merkle root over its files' leaves (`ledger.merkle`),
paid whole after its challenge window, less the leaves validators refused (`refuseLeaf`: not paid, not slashed),
or not at all when one leaf is shown bad (`invalidateBatch`: the batch void, the node slashed and ejected).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ledger.types import Reason
from ledger.units import format_amount

if TYPE_CHECKING:
    from ledger.events import BatchInvalidated

# What the journal says of the files of a batch that is never paid because an invalidation ejected its node; the
# dashboard reads a file `expired` with a detail starting so as void.
VOID_DETAIL = "void"


def void_detail(pool_id: int) -> str:
    return f"{VOID_DETAIL}: node ejected from pool {pool_id} by an invalidation"


def slash_text(event: BatchInvalidated, decimals: int) -> str:
    """`proof_invalid (7), 50 tokens slashed`."""
    return f"{Reason.label(event.reason)}, {format_amount(event.slashed, decimals)} tokens slashed"


@dataclass(frozen=True)
class Voided:
    """What the journal says of an invalidated batch: the batch's detail, each file's (by leaf index), and the
    leaf shown bad (None when the invalidation proved no leaf of the journal's, as reason 8 without a list)."""

    batch: str
    files: dict[int, str]
    bad_leaf: int | None


def invalidation_details(
    root: bytes, work_keys: Sequence[bytes], event: BatchInvalidated | None, decimals: int
) -> Voided:
    """The details of batch `root` of `work_keys` (in leaf order) that `event` invalidated (None: not found)."""
    short = f"0x{root.hex()[:12]}"
    if event is None:
        text = "invalidated (the event was not found)"
        return Voided(text, dict.fromkeys(range(len(work_keys)), f"its batch {short} was {text}"), None)
    why = slash_text(event, decimals)
    index = event.leaf_index
    if index is None or not (0 <= index < len(work_keys) and work_keys[index] == event.work_key):
        # no leaf shown (its list was never made available), or one the journal does not hold there
        return Voided(why, dict.fromkeys(range(len(work_keys)), f"its batch {short} was invalidated: {why}"), None)
    bad = leaf_name(index, work_keys[index])
    files = {i: f"its batch {short} was voided by {bad}: {why}" for i in range(len(work_keys))}
    files[index] = why
    return Voided(f"{bad}: {why}", files, index)


def leaf_name(index: int, work_key: bytes) -> str:
    """`leaf 3 (0x1a2b3c4d5e6f)`."""
    return f"leaf {index} (0x{work_key.hex()[:12]})"
