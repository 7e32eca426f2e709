"""What the worker reads from a batch's record and its invalidation (`node.daemon.batches`): pure, no chain."""

from __future__ import annotations

from ledger.events import BatchInvalidated, EventPosition
from ledger.types import Reason
from node.daemon.batches import invalidation_details

TOKEN = 10**18
ROOT = b"\xaa" * 32
KEYS = [bytes([i]) * 32 for i in range(3)]


def invalidated(leaf: int | None, key: bytes | None) -> BatchInvalidated:
    return BatchInvalidated(1, ROOT, "0xnode", "0xv", leaf, key, int(Reason.PROOF_INVALID), 50 * TOKEN,
                            EventPosition(1, 0, "0x"))  # fmt: skip


def test_an_invalidation_names_the_leaf_it_proved_on_it_and_voids_the_others_by_it() -> None:
    voided = invalidation_details(ROOT, KEYS, invalidated(1, KEYS[1]), 18)
    slash = "proof_invalid (7), 50 tokens slashed"
    leaf = f"leaf 1 (0x{KEYS[1].hex()[:12]})"
    assert (voided.batch, voided.bad_leaf) == (f"{leaf}: {slash}", 1)
    assert voided.files == {
        0: f"its batch 0x{ROOT.hex()[:12]} was voided by {leaf}: {slash}",
        1: slash,
        2: f"its batch 0x{ROOT.hex()[:12]} was voided by {leaf}: {slash}",
    }


def test_an_invalidation_without_a_leaf_of_the_journals_voids_every_file_alike() -> None:
    for event in (invalidated(None, None), invalidated(1, KEYS[2])):  # no list made available; another file there
        voided = invalidation_details(ROOT, KEYS, event, 18)
        assert voided.bad_leaf is None and voided.batch == "proof_invalid (7), 50 tokens slashed"
        assert set(voided.files.values()) == {f"its batch 0x{ROOT.hex()[:12]} was invalidated: {voided.batch}"}
    unknown = invalidation_details(ROOT, KEYS, None, 18)  # the event not found
    assert unknown.batch == "invalidated (the event was not found)" and len(unknown.files) == 3
