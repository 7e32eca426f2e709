"""`validator.slots.presence`: what a node's batch slot on chain says of a batch the validator recorded."""

from __future__ import annotations

import pytest

from ledger.types import BatchRecord, BatchStatus
from validator.slots import Presence, SlotBatch, held_in, presence

WINDOW = 3600
T = 1_700_000_000
RECORDED = SlotBatch(2, b"\x01" * 32, T)
OTHER = b"\x02" * 32


def held(root: bytes, submitted_at: int) -> SlotBatch:
    return SlotBatch(RECORDED.slot, root, submitted_at)


def test_a_slot_holding_the_batch_holds_it_even_moved_by_a_reorganisation() -> None:
    assert presence(RECORDED, held(RECORDED.root, T), WINDOW) is Presence.HELD
    assert presence(RECORDED, held(RECORDED.root, T + 12), WINDOW) is Presence.HELD  # read again in a later block
    assert presence(RECORDED, held(RECORDED.root, T - 12), WINDOW) is Presence.HELD
    assert presence(RECORDED, held(RECORDED.root, T + WINDOW - 1), WINDOW) is Presence.HELD


@pytest.mark.parametrize(
    "in_slot",
    [
        None,  # empty: the batch was taken out and nothing came since
        held(OTHER, T + 12),  # the next batch, in the slot the batch left empty
        held(OTHER, T + WINDOW - 1),  # a second short of a window: no claim could have freed the slot
        held(OTHER, T - 5 * WINDOW),  # an older batch: the recorded one never replaced it
        held(RECORDED.root, T - WINDOW),  # its root, but an earlier submission of it
    ],
    ids=["empty", "the next batch", "a second short of a window", "an older batch", "an earlier submission of it"],
)
def test_a_slot_holding_nothing_or_another_batch_within_a_window_means_a_reorganisation_took_it_out(
    in_slot: SlotBatch | None,
) -> None:
    assert presence(RECORDED, in_slot, WINDOW) is Presence.GONE


@pytest.mark.parametrize("root", [OTHER, RECORDED.root], ids=["another root", "its root again"])
def test_a_slot_holding_a_batch_submitted_a_window_or_more_later_was_written_over_after_settling(root: bytes) -> None:
    """Its own root submitted again (once the batch was claimed) is another batch too."""
    assert presence(RECORDED, held(root, T + WINDOW), WINDOW) is Presence.OVERWRITTEN
    assert presence(RECORDED, held(root, T + 30 * WINDOW), WINDOW) is Presence.OVERWRITTEN


def test_what_a_slot_holds_is_read_from_its_record_and_an_unused_slot_holds_nothing() -> None:
    zero = "0x" + "00" * 20
    record = BatchRecord(1, OTHER, zero, zero, 2, 20, 0, T + 7, BatchStatus.CLAIMED, slot=2)
    assert held_in(record) == SlotBatch(2, OTHER, T + 7)
    empty = BatchRecord(1, bytes(32), zero, zero, 0, 0, 0, 0, BatchStatus.NONE, slot=2)
    assert held_in(empty) is None
