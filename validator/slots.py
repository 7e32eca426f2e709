"""What a node's batch slot on chain says of a batch this validator recorded: still there, gone, or settled and reused.

A node's batches live in numbered slots it reuses (`WorkLedger.submitBatch(poolId, slot, root, ...)`): a slot takes a
new batch once its batch is settled, so reading the slot a recorded batch was submitted into (`getBatch(pool, node,
slot)`) has three answers, and reading them wrong either pays a file twice or slashes an honest node:

| the slot holds | the recorded batch is | its files were |
|---|---|---|
| its root, submitted less than a window apart | `HELD`: on chain (perhaps moved to another block) | submitted |
| a batch submitted a window or more after it (its root too) | `OVERWRITTEN`: settled, then written over | submitted |
| nothing, or anything else | `GONE`: a reorganisation took it out | never submitted |

The window is what tells the last two apart. A settled batch's slot is reused only after a claim, which the chain
takes once the batch's challenge window has passed, or after an invalidation, which ejects the node for good: a
batch in the slot submitted less than a window after the recorded one cannot have replaced it, so the recorded one
was never there (a reorganisation took it out, and the slot was empty again for the next batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ledger.types import BatchRecord, BatchStatus


@dataclass(frozen=True)
class SlotBatch:
    """A node's batch as a slot holds it: the slot, the batch's Merkle root and the chain time it was submitted."""

    slot: int
    root: bytes
    submitted_at: int

    def __str__(self) -> str:
        return f"0x{self.root.hex()} (slot {self.slot})"


class Presence(StrEnum):
    HELD = "held"  # the slot holds the batch: on chain
    OVERWRITTEN = "overwritten"  # settled, and the slot reused since: it was a real submission
    GONE = "gone"  # a reorganisation took it out: never a submission


def held_in(record: BatchRecord) -> SlotBatch | None:
    """What a slot's record (`Ledger.get_slot`) holds; None when the slot was never used."""
    if record.status == BatchStatus.NONE:
        return None
    return SlotBatch(record.slot, record.root, record.submitted_at)


def presence(batch: SlotBatch, held: SlotBatch | None, window: int) -> Presence:
    """Whether `batch` is on chain, given what its slot `held` (None: nothing) and the pool's challenge `window`
    (seconds): the module's table. The same root submitted again a window or more later is another batch."""
    if held is None:
        return Presence.GONE
    if held.submitted_at >= batch.submitted_at + window:
        return Presence.OVERWRITTEN
    if held.root == batch.root and held.submitted_at > batch.submitted_at - window:
        return Presence.HELD
    return Presence.GONE
