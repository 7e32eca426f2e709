"""What the worker daemon needs from the chain: the `WorkChain` protocol, and its web3 adapter `LedgerWorkChain`.

The daemon (`node.daemon.worker`) checks its standing, submits its files in batches (one Merkle root each,
`ledger.merkle`) and follows their fate through this interface only. Two implementations answer it:

- `LedgerWorkChain` (here): the pool's contracts through `ledger.client.Ledger`, for `prime-node start`;
- `LocalWorkChain` (`node.daemon.local`): no chain at all, for the trusted workers of `prime-train run
  --local-workers N`; they are always members, their batches are journaled, never invalidated nor paid.

Every method blocks (the daemon calls them in a thread) and raises what the backing store raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from web3.exceptions import TransactionNotFound

from protocol.signing import SigningDomain

if TYPE_CHECKING:
    from ledger.client import Ledger
    from ledger.events import BatchInvalidated
    from ledger.types import BatchRecord, PoolInfo, StakeInfo


class WorkChain(Protocol):
    """The chain as one worker node of one pool sees it."""

    @property
    def domain(self) -> SigningDomain:
        """The EIP-712 domain the pool signs under (chain id, ComputePool)."""
        ...

    @property
    def decimals(self) -> int:
        """The reward token's decimals, for messages."""
        ...

    def provider_of(self, node: str) -> str | None: ...

    def is_member(self, pool_id: int, node: str) -> bool: ...

    def is_ejected(self, pool_id: int, node: str) -> bool: ...

    def is_voided(self, pool_id: int, node: str) -> bool:
        """Whether an invalidation ejected `node`: its pending work is never paid (an owner's ejection voids none)."""
        ...

    def stake_of(self, provider: str) -> StakeInfo: ...

    def pool(self, pool_id: int) -> PoolInfo: ...

    def join(self, pool_id: int) -> None: ...

    def get_batch(self, pool_id: int, node: str, root: bytes) -> BatchRecord:
        """This node's batch `root` (status NONE when it has none)."""
        ...

    def submit_batch(self, pool_id: int, root: bytes, count: int, total_units: int) -> str:
        """Records the batch's root in one transaction; returns its hash ("0x..."), which the journal keeps."""
        ...

    def claim_batches(self, pool_id: int, node: str, roots: Sequence[bytes]) -> str:
        """Claims the rewards of matured batches (their units less refused leaves); returns the transaction's hash."""
        ...

    def is_leaf_refused(self, pool_id: int, node: str, root: bytes, index: int) -> bool:
        """Whether a validator refused leaf `index` of this node's batch `root` (not paid, not slashed)."""
        ...

    def timestamp(self) -> int:
        """The chain's time (the latest block's), in unix seconds."""
        ...

    def submission_gone(self, tx: str) -> bool:
        """Whether the chain no longer holds the submission transaction `tx` (a reorganisation took it out)."""
        ...

    def batch_invalidation(self, pool_id: int, node: str, root: bytes) -> BatchInvalidated | None:
        """The event that invalidated this node's batch `root`, if any: which leaf, why, and what it slashed."""
        ...


class LedgerWorkChain:
    """`WorkChain` over the pool's contracts (`ledger.client.Ledger`, signing as the node)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    @property
    def domain(self) -> SigningDomain:
        deployment = self.ledger.deployment
        return SigningDomain(deployment.chain_id, deployment.address("ComputePool"))

    @property
    def decimals(self) -> int:
        return self.ledger.decimals

    def provider_of(self, node: str) -> str | None:
        return self.ledger.provider_of(node)

    def is_member(self, pool_id: int, node: str) -> bool:
        return self.ledger.is_member(pool_id, node)

    def is_ejected(self, pool_id: int, node: str) -> bool:
        return self.ledger.is_ejected(pool_id, node)

    def is_voided(self, pool_id: int, node: str) -> bool:
        return self.ledger.is_voided(pool_id, node)

    def stake_of(self, provider: str) -> StakeInfo:
        return self.ledger.stake_of(provider)

    def pool(self, pool_id: int) -> PoolInfo:
        return self.ledger.pool(pool_id)

    def join(self, pool_id: int) -> None:
        self.ledger.join(pool_id)

    def get_batch(self, pool_id: int, node: str, root: bytes) -> BatchRecord:
        return self.ledger.get_batch(pool_id, node, root)

    def submit_batch(self, pool_id: int, root: bytes, count: int, total_units: int) -> str:
        receipt = self.ledger.submit_batch(pool_id, root, count, total_units)
        return "0x" + bytes(receipt["transactionHash"]).hex()

    def claim_batches(self, pool_id: int, node: str, roots: Sequence[bytes]) -> str:
        receipt = self.ledger.claim_batches(pool_id, node, roots)
        return "0x" + bytes(receipt["transactionHash"]).hex()

    def is_leaf_refused(self, pool_id: int, node: str, root: bytes, index: int) -> bool:
        return self.ledger.is_leaf_refused(pool_id, node, root, index)

    def timestamp(self) -> int:
        return self.ledger.timestamp()

    def submission_gone(self, tx: str) -> bool:
        # A node that lags behind the one that mined `tx` has no receipt either, but answers "no such record" for
        # the batch too; one that knows the receipt is on the chain that mined it, where the record exists.
        try:
            self.ledger.w3.eth.get_transaction_receipt(tx)  # type: ignore[arg-type]
        except TransactionNotFound:
            return True
        return False

    def batch_invalidation(self, pool_id: int, node: str, root: bytes) -> BatchInvalidated | None:
        from ledger.events import batch_invalidations

        return batch_invalidations(self.ledger, pool_id, node).get((node, root))
