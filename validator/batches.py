"""What a validator checks of a batch's leaf list before it judges the batch's files one by one.

A batch is one record on chain (`WorkLedger.submitBatch`): a Merkle root, a leaf count and the total units. The chain
cannot see the leaves; the worker uploads them to the coordinator, which serves them to validators (`GET
/v1/batches/{root}`; the client refuses a list that does not hash to the root, so what is checked here is what the
node itself committed to on chain). A list that hashes to the root and still disagrees with the record is the node's
fault, as are two leaves naming one file: each file is paid once (docs/contracts.md, "Batches").

| fault | reason | the invalidation proves |
|---|---|---|
| another number of leaves than the record | 8: no list of the recorded count was made available | no leaf |
| a leaf claims more units than the pool allows a file | 2, bad format | that leaf |
| the leaves' units do not add up to the record's total | 2, bad format | leaf 0 |
| a leaf names a file this node already submitted (here or before) | 3, wrong assignment | the second leaf |

A list with none of these faults has its leaves judged as files (`validator.verify`), each against its leaf's units.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ledger.merkle import Leaf
from ledger.types import Reason
from protocol.batches import duplicate_keys
from validator.slots import SlotBatch


@dataclass(frozen=True)
class ListFault:
    """Why a batch's leaf list condemns the batch: the reason its invalidation sends, the leaf it proves (None: no
    leaf can be proven against the record), and what a person reads."""

    reason: Reason
    leaf_index: int | None
    detail: str


def check_leaves(
    leaves: Sequence[Leaf],
    *,
    count: int,
    total_units: int,
    max_units: int,
    earlier: Mapping[bytes, SlotBatch],
) -> ListFault | None:
    """The first fault of a batch's leaf list against its record (`count`, `total_units`) and the pool's cap on a
    file's units, given the node's files submitted before (`earlier`: work key -> the batch it is a leaf of, on chain
    or settled since: `validator.slots`); None when the list is sound."""
    if len(leaves) != count:
        return ListFault(
            Reason.FILE_UNAVAILABLE,
            None,
            f"the leaf list served for the batch holds {len(leaves)} leaves; the chain records {count}: no list of "
            f"{count} leaves was made available",
        )
    for index, leaf in enumerate(leaves):
        if leaf.units > max_units:
            return ListFault(
                Reason.BAD_FORMAT, index, f"leaf {index} claims {leaf.units} units; the pool allows {max_units} a file"
            )
    listed = sum(leaf.units for leaf in leaves)
    if listed != total_units:
        return ListFault(
            Reason.BAD_FORMAT, 0, f"the leaves' units add up to {listed}; the chain records {total_units} for the batch"
        )
    repeated = duplicate_keys(leaves)
    if repeated:
        index = repeated[0]
        return ListFault(
            Reason.WRONG_ASSIGNMENT,
            index,
            f"leaf {index} names file 0x{leaves[index].work_key.hex()} a second time in the batch: a file is paid once",
        )
    for index, leaf in enumerate(leaves):
        if leaf.work_key in earlier:
            return ListFault(
                Reason.WRONG_ASSIGNMENT,
                index,
                f"leaf {index} names file 0x{leaf.work_key.hex()}, which this node submitted before in batch "
                f"{earlier[leaf.work_key]}: a file is paid once",
            )
    return None
