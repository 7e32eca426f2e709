"""Following the WorkLedger's events from a block onward, in pages, resumable from a stored cursor."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eth_utils import to_checksum_address
from hexbytes import HexBytes
from web3.exceptions import Web3RPCError

from ledger.client import Ledger
from ledger.errors import LedgerError
from ledger.tx import with_retries

log = logging.getLogger(__name__)

FOLLOWED = ("WorkSubmitted", "WorkInvalidated", "RewardsClaimed")
# How JSON-RPC nodes word "this log query spans too much"; only those errors shrink the page.
_RANGE_LIMIT_HINTS = ("range", "too many", "limit", "exceed", "too large", "max results")


def _is_range_limit(exc: Exception) -> bool:
    return any(hint in str(exc).lower() for hint in _RANGE_LIMIT_HINTS)


@dataclass(frozen=True)
class EventPosition:
    block_number: int
    log_index: int
    tx_hash: str


@dataclass(frozen=True)
class WorkSubmitted:
    pool_id: int
    work_key: bytes
    node: str
    provider: str
    units: int
    at: EventPosition


@dataclass(frozen=True)
class WorkInvalidated:
    pool_id: int
    work_key: bytes
    node: str
    validator: str
    reason: int
    slashed: int
    at: EventPosition


@dataclass(frozen=True)
class RewardsClaimed:
    pool_id: int
    provider: str
    node: str
    amount: int
    count: int
    at: EventPosition


LedgerEvent = WorkSubmitted | WorkInvalidated | RewardsClaimed


class CursorFile:
    """The next block to read, kept in a small JSON file written atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self, default: int) -> int:
        try:
            value = json.loads(self.path.read_text())["next_block"]
        except FileNotFoundError:
            return default
        except (KeyError, TypeError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise self._corrupt(repr(exc)) from exc
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise self._corrupt(f"next_block {value!r} is no block number")
        return value

    def _corrupt(self, detail: str) -> LedgerError:
        return LedgerError(f"event cursor {self.path} is corrupt ({detail}); delete it to start again")

    def save(self, next_block: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=self.path.parent, prefix=f".{self.path.name}.", delete=False) as f:
            json.dump({"next_block": next_block}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(f.name, self.path)


class EventFollower:
    """Reads WorkLedger events block range by block range.

    `poll()` returns every followed event from the cursor up to the newest block less `confirmations`, in
    chain order, then moves the cursor past them (and saves it, when a `CursorFile` is given). A batch
    submission's `WorkBatchSubmitted` is expanded into one `WorkSubmitted` per key. When the node refuses a
    range as too large, the page is halved and retried.
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
    ) -> None:
        unknown = set(events) - set(FOLLOWED)
        if unknown:
            raise LedgerError(f"cannot follow {sorted(unknown)}; known events: {', '.join(FOLLOWED)}")
        self.ledger = ledger
        self.pool_id = pool_id
        self.page_size = page_size
        self.confirmations = confirmations
        self.cursor_file = cursor
        start = ledger.deployment.block if start_block is None else start_block
        self.next_block = cursor.load(start) if cursor else start
        contract_events = ledger.work.events
        self._decoders: dict[bytes, Any] = {}
        names = [*events, "WorkBatchSubmitted"] if "WorkSubmitted" in events else list(events)
        for name in names:
            event = getattr(contract_events, name)()
            self._decoders[bytes(HexBytes(event.topic))] = event  # web3 8 gives the topic as a hex string

    def poll(self) -> list[LedgerEvent]:
        """Everything new since the last poll (possibly nothing).

        The cursor moves only when every page was read: a poll that fails part way returns nothing and the
        next poll reads the same blocks again, so no event is lost (and none is returned twice).
        """
        w3 = self.ledger.w3
        url = self.ledger.deployment.rpc_url
        head = with_retries(lambda: w3.eth.block_number, what="read block number", url=url) - self.confirmations
        found: list[LedgerEvent] = []
        position = self.next_block
        while position <= head:
            last = min(head, position + self.page_size - 1)
            try:
                logs = self._logs(position, last)
            except Web3RPCError as exc:
                if self.page_size == 1 or not _is_range_limit(exc):
                    raise LedgerError(f"reading WorkLedger events in blocks {position}..{last} failed: {exc}") from exc
                self.page_size = max(1, self.page_size // 2)
                log.warning("node refused blocks %d..%d (%s); page size now %d", position, last, exc, self.page_size)
                continue
            for entry in logs:
                found.extend(self._decode(entry))
            position = last + 1
        self.next_block = position
        if self.cursor_file is not None:
            self.cursor_file.save(self.next_block)
        return found

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
        if name == "WorkSubmitted":
            yield WorkSubmitted(
                args["poolId"], bytes(args["workKey"]), to_checksum_address(args["node"]),
                to_checksum_address(args["provider"]), args["units"], at,
            )  # fmt: skip
        elif name == "WorkBatchSubmitted":
            node, provider = to_checksum_address(args["node"]), to_checksum_address(args["provider"])
            for key, units in zip(args["workKeys"], args["units"], strict=True):
                yield WorkSubmitted(args["poolId"], bytes(key), node, provider, units, at)
        elif name == "WorkInvalidated":
            yield WorkInvalidated(
                args["poolId"], bytes(args["workKey"]), to_checksum_address(args["node"]),
                to_checksum_address(args["validator"]), args["reason"], args["slashed"], at,
            )  # fmt: skip
        elif name == "RewardsClaimed":
            yield RewardsClaimed(
                args["poolId"], to_checksum_address(args["provider"]), to_checksum_address(args["node"]),
                args["amount"], args["count"], at,
            )  # fmt: skip


def invalidations(ledger: Ledger, pool_id: int, node: str | None = None) -> dict[tuple[str, bytes], WorkInvalidated]:
    """Every invalidation in the pool since the deployment (of `node`'s work only, when given), by (node, work key):
    records are per node, so two nodes' records of one key are two entries."""
    follower = EventFollower(ledger, pool_id=pool_id, events=("WorkInvalidated",))
    return {
        (e.node, e.work_key): e
        for e in follower.poll()
        if isinstance(e, WorkInvalidated) and (node is None or e.node == to_checksum_address(node))
    }
