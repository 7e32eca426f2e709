"""Following the WorkLedger's events from a block onward, in pages, resumable from a stored cursor."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from eth_utils import to_checksum_address
from hexbytes import HexBytes
from web3.exceptions import BlockNotFound, Web3RPCError

from ledger.client import Ledger
from ledger.errors import LedgerError
from ledger.tx import with_retries

log = logging.getLogger(__name__)

FOLLOWED = (
    "BatchSubmitted",
    "BatchInvalidated",
    "LeafRefused",
    "BatchesClaimed",
)
NO_LEAF = 2**256 - 1  # WorkLedger.NO_LEAF: BatchInvalidated's leafIndex when no leaf was shown (reason 8, no list)
# How JSON-RPC nodes word "this log query spans too much"; only those errors shrink the page.
# anvil's and Hardhat's default chain id, and ganache's: chains that only ever run on one machine.
LOCAL_CHAIN_IDS = frozenset({31337, 1337})
PUBLIC_CHAIN_CONFIRMATIONS = 12  # an operator on a chain with faster or slower finality sets its own
REORG_MEMORY = 256  # block hashes a follower remembers: how deep a reorganisation it can find the start of
_RANGE_LIMIT_HINTS = ("range", "too many", "limit", "exceed", "too large", "max results")


def _is_range_limit(exc: Exception) -> bool:
    return any(hint in str(exc).lower() for hint in _RANGE_LIMIT_HINTS)


@dataclass(frozen=True)
class EventPosition:
    block_number: int
    log_index: int
    tx_hash: str


@dataclass(frozen=True)
class BatchSubmitted:
    """`node` committed a batch of `count` files worth `total_units` under the Merkle `root`. The chain's event names
    no provider (a node's binding is permanent: `Ledger.provider_of(node)`, or `Ledger.get_batch`)."""

    pool_id: int
    root: bytes
    node: str
    count: int
    total_units: int
    at: EventPosition
    slot: int = field(default=0, kw_only=True)  # the node's batch slot that holds it


@dataclass(frozen=True)
class BatchInvalidated:
    """A validator voided `node`'s batch `root`: `slashed` burned from the node's lock, the node ejected. The leaf it
    showed bad is `leaf_index` (file `work_key`); both are None for a batch whose leaf list was never made available
    (`invalidateUnavailableBatch`, reason 8), where the chain's event carries `NO_LEAF` and a zero key."""

    pool_id: int
    root: bytes
    node: str
    validator: str
    leaf_index: int | None
    work_key: bytes | None
    reason: int
    slashed: int
    at: EventPosition


@dataclass(frozen=True)
class LeafRefused:
    """A validator refused leaf `leaf_index` (file `work_key`, `units`) of `node`'s batch `root` without a slash: those
    units are not paid, the rest of the batch is."""

    pool_id: int
    root: bytes
    node: str
    validator: str
    leaf_index: int
    work_key: bytes
    units: int
    reason: int
    at: EventPosition


@dataclass(frozen=True)
class BatchesClaimed:
    """`provider` was paid `amount` for `node`'s batches `roots`, held in its slots `slots` (in the same order)."""

    pool_id: int
    provider: str
    node: str
    amount: int
    roots: tuple[bytes, ...]
    at: EventPosition
    slots: tuple[int, ...] = field(default=(), kw_only=True)


LedgerEvent = BatchSubmitted | BatchInvalidated | LeafRefused | BatchesClaimed


class CursorFile:
    """The next block to read and the hashes of the last blocks read, kept in a small JSON file written atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self, default: int) -> int:
        return self.load_all(default)[0]

    def load_all(self, default: int) -> tuple[int, dict[int, bytes]]:
        """The next block and the remembered block hashes (none in a cursor written before they were kept)."""
        try:
            data = json.loads(self.path.read_text())
            value = data["next_block"]
            hashes = {int(number): bytes.fromhex(digest) for number, digest in data.get("hashes", {}).items()}
        except FileNotFoundError:
            return default, {}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # JSONDecodeError, UnicodeDecodeError too
            raise self._corrupt(repr(exc)) from exc
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise self._corrupt(f"next_block {value!r} is no block number")
        if any(number >= value or len(digest) != 32 for number, digest in hashes.items()):
            raise self._corrupt("a remembered block hash is not of a block before next_block")
        return value, hashes

    def _corrupt(self, detail: str) -> LedgerError:
        return LedgerError(f"event cursor {self.path} is corrupt ({detail}); delete it to start again")

    def save(self, next_block: int, hashes: Mapping[int, bytes] | None = None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {"next_block": next_block, "hashes": {str(n): h.hex() for n, h in sorted((hashes or {}).items())}}
        with tempfile.NamedTemporaryFile("w", dir=self.path.parent, prefix=f".{self.path.name}.", delete=False) as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(f.name, self.path)


def default_confirmations(chain_id: int) -> int:
    """Blocks to stay behind the head when nobody chose: none on a local devnet chain, where blocks are mined on
    demand and never reorganised, else `PUBLIC_CHAIN_CONFIRMATIONS`."""
    return 0 if chain_id in LOCAL_CHAIN_IDS else PUBLIC_CHAIN_CONFIRMATIONS


class EventFollower:
    """Reads WorkLedger events block range by block range, `confirmations` blocks behind the head, reorg-safe.

    `poll()` returns every followed event from the cursor up to the newest block less `confirmations`, in
    chain order, then moves the cursor past them (and saves it, when a `CursorFile` is given), one record per
    event, as on chain. When the node refuses a range as too large, the page is halved and retried.

    Reorganisations: the follower remembers the hashes of the last `remember` blocks it read. Before reading on,
    it checks that the block before the cursor still has the hash it had; when it does not, the chain was
    reorganised under the cursor, and the follower goes back to just after the newest remembered block the chain
    still has, and reads from there again (from the oldest remembered, with an error logged, when the chain has
    none of them: a reorganisation deeper than `remember` blocks). So an event a reorganisation
    moved into blocks already read is still returned; an event it removed may have been returned before (the
    consumer asks the chain before acting on one). `rewound_to` tells the consumer the block read again from.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        pool_id: int | None = None,
        start_block: int | None = None,
        events: Sequence[str] = FOLLOWED,
        page_size: int = 2_000,
        confirmations: int = 0,
        cursor: CursorFile | None = None,
        hashes: Mapping[int, bytes] | None = None,
        remember: int = REORG_MEMORY,
    ) -> None:
        unknown = set(events) - set(FOLLOWED)
        if unknown:
            raise LedgerError(f"cannot follow {sorted(unknown)}; known events: {', '.join(FOLLOWED)}")
        if confirmations < 0:
            raise LedgerError(f"confirmations must be 0 or more, not {confirmations}")
        self.ledger = ledger
        self.pool_id = pool_id
        self.page_size = page_size
        self.confirmations = confirmations
        self.cursor_file = cursor
        self.remember = max(1, remember)
        start = ledger.deployment.block if start_block is None else start_block
        if cursor is not None:
            self.next_block, remembered = cursor.load_all(start)
        else:
            self.next_block, remembered = start, dict(hashes or {})
        self.hashes: dict[int, bytes] = {n: h for n, h in sorted(remembered.items()) if n < self.next_block}
        self.rewound_to: int | None = None  # the block the last poll went back to after a reorganisation
        self.reorgs = 0  # reorganisations under the cursor seen since start
        contract_events = ledger.work.events
        self._decoders: dict[bytes, Any] = {}
        for name in events:
            event = getattr(contract_events, name)()
            self._decoders[bytes(HexBytes(event.topic))] = event  # web3 8 gives the topic as a hex string

    def poll(self) -> list[LedgerEvent]:
        """Everything new since the last poll (possibly nothing).

        The cursor moves only when every page was read: a poll that fails part way returns nothing and the
        next poll reads the same blocks again, so no event is lost (and none is returned twice, but after a
        reorganisation: then the blocks from `rewound_to` on are read again).
        """
        w3 = self.ledger.w3
        url = self.ledger.deployment.rpc_url
        head = with_retries(lambda: w3.eth.block_number, what="read block number", url=url) - self.confirmations
        found: list[LedgerEvent] = []
        position, hashes = self.next_block, dict(self.hashes)
        self.rewound_to = None
        changed = 0  # ranges whose last block changed while being read
        while True:
            fork = self._fork(position, hashes)  # also with no new block: a reorganisation need not add one
            if fork is not None:
                position, hashes = fork, {n: h for n, h in hashes.items() if n < fork}
                found = [e for e in found if e.at.block_number < fork]
                self.rewound_to = fork if self.rewound_to is None else min(self.rewound_to, fork)
                continue
            if position > head:
                break
            last = min(head, position + self.page_size - 1)
            before = self._hash(last)
            try:
                logs = self._logs(position, last)
            except Web3RPCError as exc:
                if self.page_size == 1 or not _is_range_limit(exc):
                    raise LedgerError(f"reading WorkLedger events in blocks {position}..{last} failed: {exc}") from exc
                self.page_size = max(1, self.page_size // 2)
                log.warning("node refused blocks %d..%d (%s); page size now %d", position, last, exc, self.page_size)
                continue
            after = self._hash(last)
            if (
                after is None
                or after != before
                or any(bytes(entry["blockHash"]) != after for entry in logs if entry["blockNumber"] == last)
            ):
                changed += 1
                if changed > 10:
                    raise LedgerError(f"blocks {position}..{last} keep changing while being read; trying again later")
                continue  # reorganised while being read: read the range again
            for entry in logs:
                found.extend(self._decode(entry))
            hashes[last] = after
            for number in range(max(position, last - self.remember + 1), last):
                if (digest := self._hash(number)) is not None:
                    hashes[number] = digest
            position = last + 1
        if self.rewound_to is not None:
            self.reorgs += 1
            log.warning("the chain was reorganised under the cursor: read blocks from %d again", self.rewound_to)
        self.next_block = position
        self.hashes = dict(sorted(hashes.items())[-self.remember :])
        if self.cursor_file is not None:
            self.cursor_file.save(self.next_block, self.hashes)
        return found

    def _hash(self, number: int) -> bytes | None:
        """The hash of block `number` as the node sees it now; None when the chain is shorter (a reorganisation to
        a shorter chain, or a reverted snapshot)."""
        w3, url = self.ledger.w3, self.ledger.deployment.rpc_url
        try:
            block = with_retries(lambda: w3.eth.get_block(number), what=f"read block {number}", url=url)
        except BlockNotFound:
            return None
        return bytes(block["hash"])

    def _fork(self, position: int, hashes: Mapping[int, bytes]) -> int | None:
        """None while the newest remembered block before `position` is still on the chain; else the block to read
        from again: just after the newest remembered one the chain still has (the oldest remembered, when none)."""
        older = sorted((n for n in hashes if n < position), reverse=True)
        if not older or self._hash(older[0]) == hashes[older[0]]:
            return None
        for number in older[1:]:
            if self._hash(number) == hashes[number]:
                return number + 1
        log.error("a reorganisation deeper than the %d remembered blocks: reading from block %d again",
                  len(older), older[-1])  # fmt: skip
        return older[-1]

    def _logs(self, first: int, last: int) -> list[Any]:
        topics: list[Any] = [list(self._decoders)]
        if self.pool_id is not None:
            topics.append(self.pool_id.to_bytes(32, "big"))
        params = {"address": self.ledger.work.address, "fromBlock": first, "toBlock": last, "topics": topics}
        url = self.ledger.deployment.rpc_url
        logs = with_retries(lambda: self.ledger.w3.eth.get_logs(params), what="read logs", url=url)  # type: ignore[arg-type]
        return sorted(logs, key=lambda entry: (entry["blockNumber"], entry["logIndex"]))

    def _decode(self, entry: Any) -> Iterator[LedgerEvent]:
        event = self._decoders[bytes(entry["topics"][0])]
        decoded = event.process_log(entry)
        args = decoded["args"]
        at = EventPosition(
            int(entry["blockNumber"]), int(entry["logIndex"]), "0x" + bytes(entry["transactionHash"]).hex()
        )
        name = decoded["event"]
        if name == "BatchSubmitted":
            yield BatchSubmitted(
                args["poolId"], bytes(args["root"]), to_checksum_address(args["node"]), args["count"],
                args["totalUnits"], at, slot=args["slot"],
            )  # fmt: skip
        elif name == "BatchInvalidated":
            shown = args["leafIndex"] != NO_LEAF
            yield BatchInvalidated(
                args["poolId"], bytes(args["root"]), to_checksum_address(args["node"]),
                to_checksum_address(args["validator"]), args["leafIndex"] if shown else None,
                bytes(args["workKey"]) if shown else None, args["reason"], args["slashed"], at,
            )  # fmt: skip
        elif name == "LeafRefused":
            yield LeafRefused(
                args["poolId"], bytes(args["root"]), to_checksum_address(args["node"]),
                to_checksum_address(args["validator"]), args["leafIndex"], bytes(args["workKey"]), args["units"],
                args["reason"], at,
            )  # fmt: skip
        elif name == "BatchesClaimed":
            yield BatchesClaimed(
                args["poolId"], to_checksum_address(args["provider"]), to_checksum_address(args["node"]),
                args["amount"], tuple(bytes(_ref(ref)[1]) for ref in args["batches"]), at,
                slots=tuple(_ref(ref)[0] for ref in args["batches"]),
            )  # fmt: skip


def _ref(ref: Any) -> tuple[int, bytes]:
    """A decoded `BatchRef`: web3 gives a struct in an event as a mapping of its fields (or a tuple, in order)."""
    if isinstance(ref, Mapping):
        return int(ref["slot"]), bytes(ref["root"])
    return int(ref[0]), bytes(ref[1])


def batch_invalidations(
    ledger: Ledger, pool_id: int, node: str | None = None
) -> dict[tuple[str, bytes], BatchInvalidated]:
    """Every batch invalidation in the pool since the deployment (of `node`'s batches only, when given), by (node,
    root): a batch is invalidated at most once, and two nodes' batches of one root are two records."""
    return {(e.node, e.root): e for e in _judgements(ledger, pool_id, BatchInvalidated, node)}


def leaf_refusals(ledger: Ledger, pool_id: int, node: str | None = None) -> dict[tuple[str, bytes, int], LeafRefused]:
    """Every leaf refused in the pool since the deployment (in `node`'s batches only, when given), by (node, root,
    leaf index): a leaf is refused at most once."""
    return {(e.node, e.root, e.leaf_index): e for e in _judgements(ledger, pool_id, LeafRefused, node)}


_Judged = TypeVar("_Judged", BatchInvalidated, LeafRefused)


def _judgements(ledger: Ledger, pool_id: int, kind: type[_Judged], node: str | None) -> list[_Judged]:
    """Every `kind` event in the pool since the deployment, of `node` only when given, in chain order."""
    follower = EventFollower(ledger, pool_id=pool_id, events=(kind.__name__,))
    wanted = None if node is None else to_checksum_address(node)
    return [e for e in follower.poll() if isinstance(e, kind) and (wanted is None or e.node == wanted)]
