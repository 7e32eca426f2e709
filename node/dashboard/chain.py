"""The worker dashboard's chain reads: blocking web3 calls, made in a thread on a refresh interval, never per request.

One `WorkerChain.read` is a handful of calls (block, stake, membership, the node's lock in the pool) plus, for the
journal's batches, what only changes rarely: a batch's record is read from the slot the journal keeps for it
(`getBatch(pool, node, slot)`: this node's own, records are per node) once (its submission time never changes), and
again only while it looks claimable (someone may claim it outside this daemon) or, journaled submitted, is not found
there yet. A settled batch is read once whatever the answer: a later batch of the node may have taken its slot since,
and the journal holds its fate. Invalidations and refused leaves come from following `BatchInvalidated` and
`LeafRefused` events, this node's only, from where the last read stopped, so a refresh costs the same after a week as
after a minute.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from eth_utils import to_checksum_address

from ledger.client import Ledger
from ledger.events import BatchInvalidated, EventFollower, LeafRefused
from ledger.types import BatchRecord, BatchStatus, Ejection, PoolConfig
from node.daemon.state import BatchEntry
from node.dashboard.model import ChainReading
from protocol.terms import batch_state


class WorkerChain:
    """Reads the chain for one node in one pool; keeps what does not change between reads."""

    def __init__(self, ledger: Ledger, pool_id: int, node: str) -> None:
        self.ledger, self.pool_id, self.node = ledger, pool_id, node
        self._pool: PoolConfig | None = None
        self._provider: str | None = None
        self._batches: dict[bytes, BatchRecord] = {}
        self._invalidated: dict[bytes, BatchInvalidated] = {}  # every invalidation of this node's batches, by root
        self._refused: dict[tuple[bytes, int], LeafRefused] = {}  # every refused leaf of this node's, by (root, index)
        self._follower = EventFollower(ledger, pool_id=pool_id, events=("BatchInvalidated", "LeafRefused"))

    def read(self, batches: Iterable[BatchEntry]) -> ChainReading:
        """A fresh reading; `batches` are the journal's that were (or may have been) submitted.

        Blocking: call it in a thread. Raises what the ledger raises (an unreachable RPC endpoint); the state
        kept from earlier reads stays valid.
        """
        ledger = self.ledger
        block = ledger.w3.eth.get_block("latest")
        number, chain_time = int(block["number"]), int(block["timestamp"])
        if self._pool is None:
            self._pool = ledger.pool(self.pool_id).config
        pool = self._pool
        if self._provider is None:  # a binding never changes once made
            self._provider = ledger.provider_of(self.node)
        stake = ledger.stake_of(self._provider) if self._provider is not None else None
        member = ledger.is_member(self.pool_id, self.node)
        ejection = ledger.ejection_of(self.pool_id, self.node)
        lock = ledger.lock_of(self.pool_id, self.node)
        node = to_checksum_address(self.node)
        events = self._follower.poll()
        if (fork := self._follower.rewound_to) is not None:  # a reorganisation: what it replaced is read again
            self._invalidated = {k: e for k, e in self._invalidated.items() if e.at.block_number < fork}
            self._refused = {k: e for k, e in self._refused.items() if e.at.block_number < fork}
            self._batches = {}
        for event in events:
            # another node's record of the same root is its own: only this node's invalidations are this node's
            if isinstance(event, BatchInvalidated) and event.node == node:
                self._invalidated[event.root] = event
            elif isinstance(event, LeafRefused) and event.node == node:
                self._refused[(event.root, event.leaf_index)] = event
        # a batch in no slot was submitted to a ledger from before slots: this one does not hold it
        entries = [b for b in batches if b.slot is not None]
        wanted = [b.root for b in entries]
        journaled = set(wanted)
        for entry in entries:
            known = self._batches.get(entry.root)
            unknown = known is None or (known.status == BatchStatus.NONE and entry.stage == "submitted")
            maybe_claimed = known is not None and batch_state(known, pool.challenge_window, chain_time) == "claimable"
            if unknown or maybe_claimed:
                self._batches[entry.root] = ledger.get_batch(self.pool_id, self.node, entry.root, slot=entry.slot)
        return ChainReading(
            read_at=time.time(),
            block=number,
            chain_time=chain_time,
            pool=pool,
            decimals=ledger.decimals,
            provider=self._provider,
            stake=stake,
            member=member,
            ejected=ejection != Ejection.NONE,
            voided=ejection == Ejection.BY_INVALIDATION,
            lock=lock,
            batches={root: self._batches[root] for root in wanted},
            invalidations={root: self._invalidated[root] for root in wanted if root in self._invalidated},
            refusals={leaf: e for leaf, e in self._refused.items() if leaf[0] in journaled},
        )
