"""A batch's leaf list on the wire (protocol/batches.py): 40 bytes a leaf, in order, and every malformed list refused
with a `LeafListError` that names what is wrong; repeated keys decode (the validator punishes them) and are found."""

from __future__ import annotations

import pytest

from ledger.merkle import Leaf
from protocol.batches import (
    LEAF_BYTES,
    MAX_BATCH_BYTES,
    MAX_BATCH_LEAVES,
    MAX_LEAF_UNITS,
    LeafListError,
    decode_leaves,
    duplicate_keys,
    encode_leaves,
)


def key(n: int) -> bytes:
    return n.to_bytes(32, "big")


def leaves(n: int) -> tuple[Leaf, ...]:
    return tuple(Leaf(key(i), 1000 + i) for i in range(n))


def test_a_list_round_trips_in_its_order_at_one_and_at_the_most_leaves() -> None:
    for listed in (leaves(1), (Leaf(key(9), MAX_LEAF_UNITS), Leaf(key(3), 1)), leaves(MAX_BATCH_LEAVES)):
        data = encode_leaves(listed)
        assert len(data) == LEAF_BYTES * len(listed)
        assert decode_leaves(data, max_leaves=MAX_BATCH_LEAVES) == listed
    assert MAX_BATCH_BYTES == 160 * 1024


def test_a_leaf_is_its_work_key_then_its_units_in_eight_big_endian_bytes() -> None:
    assert encode_leaves([Leaf(b"\xab" * 32, 0x0102030405060708)]) == b"\xab" * 32 + bytes(range(1, 9))


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "holds no leaves"),
        (bytes(LEAF_BYTES - 1), "not a whole number of 40-byte leaves"),
        (encode_leaves(leaves(2)) + b"\x00", "not a whole number of 40-byte leaves"),
        (encode_leaves(leaves(4)), "holds 4 leaves, more than the 3"),
        (encode_leaves(leaves(2)) + key(7) + bytes(8), "leaf 2: claims 0 units"),
    ],
    ids=["empty", "a short leaf", "a stray byte", "too many", "zero units"],
)
def test_a_malformed_list_is_refused_naming_what_is_wrong(data: bytes, problem: str) -> None:
    with pytest.raises(LeafListError, match=problem) as refused:
        decode_leaves(data, max_leaves=3)
    assert str(refused.value).startswith(f"LeafList.{refused.value.field}: ")


@pytest.mark.parametrize(
    ("listed", "problem"),
    [
        ((), "holds no leaves"),
        (leaves(MAX_BATCH_LEAVES + 1), f"more than the {MAX_BATCH_LEAVES}"),
        ((Leaf(key(1), 0),), "leaf 0: units must be 1"),
        ((Leaf(key(1), 5), Leaf(key(2), MAX_LEAF_UNITS + 1)), "leaf 1: units must be 1"),
    ],
    ids=["none", "too many", "zero units", "units past 8 bytes"],
)
def test_a_list_no_coordinator_takes_is_not_encoded(listed: tuple[Leaf, ...], problem: str) -> None:
    with pytest.raises(LeafListError, match=problem):
        encode_leaves(listed)


def test_repeated_keys_decode_and_each_repeat_after_the_first_is_found() -> None:
    listed = (Leaf(key(1), 5), Leaf(key(2), 6), Leaf(key(1), 7), Leaf(key(3), 8), Leaf(key(2), 9), Leaf(key(1), 5))
    assert decode_leaves(encode_leaves(listed), max_leaves=MAX_BATCH_LEAVES) == listed
    assert duplicate_keys(listed) == [2, 4, 5]
    assert duplicate_keys(leaves(5)) == []
