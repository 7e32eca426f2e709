"""A pool's validator set as the chain holds it: who the pool owner appointed (ComputePool `ValidatorSet`).

ComputePool keeps the set in a mapping, which cannot be listed; its `ValidatorSet(poolId, validator, allowed)`
events can. `ValidatorSet.read` collects every address an event of the pool ever named, reading only the blocks
it has not read yet, and asks `isValidator` of each: the answer is the chain's state now, so an event a
reorganisation removed, or a later removal, never leaves a stranger in the set.
"""

from __future__ import annotations

from typing import Any

from eth_utils import to_checksum_address
from hexbytes import HexBytes
from web3.exceptions import Web3RPCError

from ledger.client import Ledger
from ledger.errors import LedgerError
from ledger.tx import with_retries

PAGE_BLOCKS = 10_000  # blocks one log query spans; the appointments of a pool are few


class ValidatorSet:
    """The appointed validators of one pool; `read()` is cheap to call often (it reads new blocks only)."""

    def __init__(self, ledger: Ledger, pool_id: int) -> None:
        self.ledger, self.pool_id = ledger, pool_id
        self.next_block = ledger.deployment.block
        self.candidates: set[str] = set()  # every address a ValidatorSet event of the pool named
        event = ledger.pools.events.ValidatorSet()
        self._event = event
        self._topic = bytes(HexBytes(event.topic))

    def read(self) -> frozenset[str]:
        """The pool's validators now (checksummed addresses)."""
        w3, url = self.ledger.w3, self.ledger.deployment.rpc_url
        head = int(with_retries(lambda: w3.eth.block_number, what="read block number", url=url))
        while self.next_block <= head:
            last = min(head, self.next_block + PAGE_BLOCKS - 1)
            for entry in self._logs(self.next_block, last):
                self.candidates.add(to_checksum_address(self._event.process_log(entry)["args"]["validator"]))
            self.next_block = last + 1
        return frozenset(v for v in self.candidates if self.ledger.is_validator(self.pool_id, v))

    def _logs(self, first: int, last: int) -> list[Any]:
        params = {
            "address": self.ledger.pools.address,
            "fromBlock": first,
            "toBlock": last,
            "topics": [self._topic, self.pool_id.to_bytes(32, "big")],
        }
        url = self.ledger.deployment.rpc_url
        try:
            return list(with_retries(lambda: self.ledger.w3.eth.get_logs(params), what="read logs", url=url))  # type: ignore[arg-type]
        except Web3RPCError as exc:  # the node refused the query: say which blocks
            raise LedgerError(f"reading ValidatorSet events of pool {self.pool_id} in {first}..{last}: {exc}") from exc
