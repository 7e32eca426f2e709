"""What the worker daemon needs from the chain: the `WorkChain` protocol, and its web3 adapter `LedgerWorkChain`.

The daemon (`node.daemon.worker`) checks its standing, submits its files in batches (one Merkle root each,
`ledger.merkle`) and follows their fate through this interface only. Two implementations answer it:

- `LedgerWorkChain` (here): the pool's contracts through `ledger.client.Ledger`, for `prime-node start`;
- `LocalWorkChain` (`node.daemon.local`): no chain at all, for the trusted workers of `prime-train run
  --local-workers N`; they are always members, their batches are journaled, never invalidated nor paid.

A node's batches live in its numbered slots on chain (`WorkLedger.submitBatch(pool, slot, ...)`): every call that
names a batch names the slot the journal keeps for it, never looked up.

Every method blocks (the daemon calls them in a thread) and raises what the backing store raises, except a
submission into a slot that holds a pending batch, which raises `SlotInUse` whatever the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from web3.exceptions import TransactionNotFound

from core.errors import NodeError
from ledger.errors import ContractRevert
from protocol.signing import SigningDomain

if TYPE_CHECKING:
    from ledger.client import Ledger
    from ledger.events import BatchInvalidated
    from ledger.types import BatchRecord, PoolInfo, StakeInfo


class SlotInUse(NodeError):
    """The node's batch slot `slot` holds its pending batch `root`: a submission into it is refused (`SlotInUse`)."""

    def __init__(self, pool_id: int, slot: int, root: bytes) -> None:
        super().__init__(f"slot {slot} of this node in pool {pool_id} holds its pending batch 0x{root.hex()}")
        self.pool_id, self.slot, self.root = pool_id, slot, root


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

    def get_batch(self, pool_id: int, node: str, root: bytes, *, slot: int) -> BatchRecord:
        """This node's batch `root` in its slot `slot` (status NONE when the slot does not hold that root)."""
        ...

    def submit_batch(self, pool_id: int, root: bytes, count: int, total_units: int, *, slot: int) -> str:
        """Records the batch's root in slot `slot` in one transaction; returns its hash ("0x..."), which the journal
        keeps. Raises `SlotInUse` when the slot holds a pending batch."""
        ...

    def claim_batches(self, pool_id: int, node: str, roots: Sequence[bytes], *, slots: Sequence[int]) -> str:
        """Claims the rewards of matured batches `roots` in `slots` (their units less refused leaves); returns the
        transaction's hash."""
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

    def get_batch(self, pool_id: int, node: str, root: bytes, *, slot: int) -> BatchRecord:
        return self.ledger.get_batch(pool_id, node, root, slot=slot)

    def submit_batch(self, pool_id: int, root: bytes, count: int, total_units: int, *, slot: int) -> str:
        try:
            receipt = self.ledger.submit_batch(pool_id, root, count, total_units, slot=slot)
        except ContractRevert as exc:
            if exc.name == "SlotInUse":
                raise SlotInUse(pool_id, int(exc.values["slot"]), bytes(exc.values["root"])) from exc
            raise
        return "0x" + bytes(receipt["transactionHash"]).hex()

    def claim_batches(self, pool_id: int, node: str, roots: Sequence[bytes], *, slots: Sequence[int]) -> str:
        receipt = self.ledger.claim_batches(pool_id, node, roots, slots=slots)
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
