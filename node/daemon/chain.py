"""What the worker daemon needs from the chain: the `WorkChain` protocol, and its web3 adapter `LedgerWorkChain`.

The daemon (`node.daemon.worker`) checks its standing, submits its files and follows their fate through this
interface only. Two implementations answer it:

- `LedgerWorkChain` (here): the pool's contracts through `ledger.client.Ledger`, for `prime-node start`;
- `LocalWorkChain` (`node.daemon.local`): no chain at all, for the trusted workers of `prime-train run
  --local-workers N`; they are always members, their submissions are journaled, never invalidated nor paid.

Every method blocks (the daemon calls them in a thread) and raises what the backing store raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from web3.exceptions import TransactionNotFound

from protocol.signing import SigningDomain

if TYPE_CHECKING:
    from ledger.client import Ledger
    from ledger.events import WorkInvalidated
    from ledger.types import PoolInfo, StakeInfo, WorkRecord


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

    def get_work(self, pool_id: int, node: str, work_key: bytes) -> WorkRecord:
        """This node's record of `work_key` (status NONE when it has none)."""
        ...

    def submit(self, pool_id: int, work_keys: Sequence[bytes], units: Sequence[int]) -> str:
        """Submits the files in one transaction; returns its hash ("0x..."), which the journal keeps."""
        ...

    def claim_rewards(self, pool_id: int, node: str, work_keys: Sequence[bytes]) -> str:
        """Claims the rewards of matured files; returns the transaction's hash."""
        ...

    def timestamp(self) -> int:
        """The chain's time (the latest block's), in unix seconds."""
        ...

    def submission_gone(self, tx: str) -> bool:
        """Whether the chain no longer holds the submission transaction `tx` (a reorganisation took it out)."""
        ...

    def invalidation(self, pool_id: int, node: str, work_key: bytes) -> WorkInvalidated | None:
        """The event that invalidated this node's `work_key`, if any."""
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

    def get_work(self, pool_id: int, node: str, work_key: bytes) -> WorkRecord:
        return self.ledger.get_work(pool_id, node, work_key)

    def submit(self, pool_id: int, work_keys: Sequence[bytes], units: Sequence[int]) -> str:
        if len(work_keys) == 1:  # submitWork costs less gas than a batch of one
            receipt = self.ledger.submit_work(pool_id, work_keys[0], units[0])
        else:
            receipt = self.ledger.submit_work_batch(pool_id, work_keys, units)
        return "0x" + bytes(receipt["transactionHash"]).hex()

    def claim_rewards(self, pool_id: int, node: str, work_keys: Sequence[bytes]) -> str:
        receipt = self.ledger.claim_rewards(pool_id, node, work_keys)
        return "0x" + bytes(receipt["transactionHash"]).hex()

    def timestamp(self) -> int:
        return self.ledger.timestamp()

    def submission_gone(self, tx: str) -> bool:
        # A node that lags behind the one that mined `tx` has no receipt either, but answers "no such record" for
        # the work too; one that knows the receipt is on the chain that mined it, where the record exists.
        try:
            self.ledger.w3.eth.get_transaction_receipt(tx)  # type: ignore[arg-type]
        except TransactionNotFound:
            return True
        return False

    def invalidation(self, pool_id: int, node: str, work_key: bytes) -> WorkInvalidated | None:
        from ledger.events import invalidations

        return invalidations(self.ledger, pool_id, node).get((node, work_key))
