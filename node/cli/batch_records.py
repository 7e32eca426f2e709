"""A provider's batches in a pool as `prime-node status|claim` read them: every `BatchSubmitted` of its nodes since
the deployment, each read from the batch slot its event names.

A node reuses its slots (`WorkLedger.submitBatch(pool, slot, ...)`): once a batch is settled (claimed or
invalidated) a later batch of the node may be written over it, and `getBatch` then answers for the later one. So
only a node's latest submission into a slot is read from the chain; an earlier one was settled before the next was
written, and its record is rebuilt from the events, in one pass: its count and units from its `BatchSubmitted`, its
time from that event's block, its fate from the `BatchesClaimed` that named its (slot, root) or the
`BatchInvalidated` of its root, and its refused units from the `LeafRefused` of its leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ledger.types import BatchRecord, BatchStatus

if TYPE_CHECKING:
    from ledger.client import Ledger
    from ledger.events import BatchSubmitted, LedgerEvent


@dataclass
class _Seen:
    """One submission as the events tell it: what settled it, and the units refused meanwhile."""

    event: BatchSubmitted
    status: BatchStatus = BatchStatus.PENDING
    refused: int = 0


def provider_batches(ledger: Ledger, pool_id: int, provider: str) -> list[BatchRecord]:
    """Every batch the provider's nodes submitted to the pool since the deployment, oldest first, each with its
    record (its `slot` set)."""
    from ledger.events import EventFollower

    providers: dict[str, str | None] = {}  # a node's binding never changes: one lookup per node

    def mine(node: str) -> bool:
        if node not in providers:
            providers[node] = ledger.provider_of(node)
        return providers[node] == provider

    seen, holding = submissions(EventFollower(ledger, pool_id=pool_id).poll(), mine)
    timestamps: dict[int, int] = {}
    records = []
    for one in seen:
        e = one.event
        if holding[(e.node, e.slot)] is one:  # the slot still holds it: the chain's record
            records.append(ledger.get_batch(pool_id, e.node, e.root, slot=e.slot))
            continue
        block = e.at.block_number
        if block not in timestamps:
            timestamps[block] = int(ledger.w3.eth.get_block(block)["timestamp"])
        refused = min(one.refused, e.total_units)  # as the contract caps it
        records.append(BatchRecord(pool_id, e.root, e.node, provider, e.count, e.total_units, refused,
                                   timestamps[block], one.status, slot=e.slot))  # fmt: skip
    return records


def submissions(
    events: Sequence[LedgerEvent], mine: Callable[[str], bool]
) -> tuple[list[_Seen], dict[tuple[str, int], _Seen]]:
    """The submissions of the nodes `mine` accepts in `events` (chain order), each with its fate as the events tell
    it, and the latest submission into each (node, slot): what the slot holds now. A judgement names no slot: it
    applies to the node's latest submission of its root."""
    from ledger.events import BatchesClaimed, BatchInvalidated, BatchSubmitted, LeafRefused

    seen: list[_Seen] = []
    holding: dict[tuple[str, int], _Seen] = {}
    by_root: dict[tuple[str, bytes], _Seen] = {}
    for event in events:
        if isinstance(event, BatchSubmitted):
            if mine(event.node):
                one = _Seen(event)
                seen.append(one)
                holding[(event.node, event.slot)] = by_root[(event.node, event.root)] = one
        elif isinstance(event, BatchesClaimed):
            for slot, root in zip(event.slots, event.roots, strict=True):
                held = holding.get((event.node, slot))
                if held is not None and held.event.root == root:
                    held.status = BatchStatus.CLAIMED
        elif (found := by_root.get((event.node, event.root))) is not None:
            if isinstance(event, BatchInvalidated):
                found.status = BatchStatus.INVALIDATED
            elif isinstance(event, LeafRefused):
                found.refused += event.units
    return seen, holding
