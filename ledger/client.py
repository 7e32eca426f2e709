"""`Ledger`: what a worker, validator, trainer and pool owner do on chain, as typed Python calls."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from hexbytes import HexBytes
from web3 import Web3
from web3.contract import Contract
from web3.exceptions import ContractLogicError
from web3.types import TxReceipt

from ledger.artifacts import load_artifact
from ledger.deployment import Deployment
from ledger.errors import DeploymentError, LedgerError
from ledger.merkle import LeafProof
from ledger.tx import Transactor, revert_from_exception, with_retries
from ledger.types import (
    BatchRecord,
    BatchStatus,
    Ejection,
    PoolConfig,
    PoolInfo,
    Reason,
    StakeInfo,
    StakeLock,
)


def connect(rpc_url: str, timeout: float = 30.0) -> Web3:
    return Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": timeout}))


def node_binding_signature(node: LocalAccount, provider: str, *, chain_id: int, registry: str) -> bytes:
    """The node key's EIP-712 consent to work for `provider` (domain PrimeNode/1, this chain, this registry)."""
    message = encode_typed_data(
        full_message={
            "types": {
                "EIP712Domain": [
                    {"name": "name", "type": "string"},
                    {"name": "version", "type": "string"},
                    {"name": "chainId", "type": "uint256"},
                    {"name": "verifyingContract", "type": "address"},
                ],
                "NodeBinding": [{"name": "provider", "type": "address"}, {"name": "node", "type": "address"}],
            },
            "primaryType": "NodeBinding",
            "domain": {"name": "PrimeNode", "version": "1", "chainId": chain_id, "verifyingContract": registry},
            "message": {"provider": provider, "node": node.address},
        }
    )
    return bytes(Account.sign_message(message, node.key).signature)


class Ledger:
    """Typed access to the four contracts of one deployment, sending as `account` (read-only without one)."""

    def __init__(self, w3: Web3, deployment: Deployment, account: LocalAccount | None = None) -> None:
        self.w3 = w3
        self.deployment = deployment
        self.account = account
        self.token = self._contract("StakeToken")
        self.registry = self._contract("NodeRegistry")
        self.pools = self._contract("ComputePool")
        self.work = self._contract("WorkLedger")
        self._sender = Transactor(w3, account) if account is not None else None
        self._decimals: int | None = None

    @classmethod
    def connect(
        cls, deployment: Deployment, account: LocalAccount | None = None, *, rpc_url: str | None = None
    ) -> Ledger:
        """Connects to `rpc_url` (default: the deployment's) and checks the chain id matches the deployment."""
        url = rpc_url or deployment.rpc_url
        w3 = connect(url)
        chain_id = with_retries(lambda: w3.eth.chain_id, what="read chain id", url=url)
        if chain_id != deployment.chain_id:
            raise DeploymentError(f"{url} is chain {chain_id}, but the deployment is on chain {deployment.chain_id}")
        return cls(w3, deployment, account)

    def as_account(self, account: LocalAccount) -> Ledger:
        """The same deployment and connection, sending as another account."""
        return Ledger(self.w3, self.deployment, account)

    @property
    def address(self) -> str:
        if self.account is None:
            raise LedgerError("this ledger client has no account; pass a keystore to sign transactions")
        return str(self.account.address)

    def _contract(self, name: str) -> Contract:
        return self.w3.eth.contract(
            address=to_checksum_address(self.deployment.address(name)), abi=load_artifact(name).abi
        )

    def _send(self, call: Any, description: str) -> TxReceipt:
        if self._sender is None:
            raise LedgerError(f"cannot {description}: no account to sign with")
        return self._sender.send(call, description=description)

    def _call(self, call: Any, description: str) -> Any:
        try:
            return with_retries(call.call, what=description, url=self.deployment.rpc_url)
        except ContractLogicError as exc:
            raise revert_from_exception(exc, description) from exc

    # --- chain and token -------------------------------------------------------------------------
    @property
    def decimals(self) -> int:
        if self._decimals is None:
            self._decimals = int(self._call(self.token.functions.decimals(), "decimals"))
        return self._decimals

    def timestamp(self) -> int:
        return int(self.w3.eth.get_block("latest")["timestamp"])

    def balance_of(self, owner: str) -> int:
        return int(self._call(self.token.functions.balanceOf(owner), "balanceOf"))

    def allowance(self, owner: str, spender: str) -> int:
        return int(self._call(self.token.functions.allowance(owner, spender), "allowance"))

    def mint(self, to: str, amount: int) -> TxReceipt:
        return self._send(self.token.functions.mint(to, amount), "mint")

    def transfer(self, to: str, amount: int) -> TxReceipt:
        return self._send(self.token.functions.transfer(to, amount), "transfer")

    def approve(self, spender: str, amount: int) -> TxReceipt:
        return self._send(self.token.functions.approve(spender, amount), "approve")

    def ensure_allowance(self, spender: str, amount: int) -> TxReceipt | None:
        """Approves exactly `amount` when the current allowance is lower; nothing otherwise."""
        if self.allowance(self.address, spender) >= amount:
            return None
        return self.approve(spender, amount)

    # --- provider: stake and nodes ---------------------------------------------------------------
    def stake(self, amount: int) -> TxReceipt:
        """Approves the registry if needed, then stakes `amount` base units."""
        self.ensure_allowance(self.registry.address, amount)
        return self._send(self.registry.functions.stake(amount), "stake")

    def request_unstake(self, amount: int) -> TxReceipt:
        return self._send(self.registry.functions.requestUnstake(amount), "requestUnstake")

    def withdraw(self) -> TxReceipt:
        return self._send(self.registry.functions.withdraw(), "withdraw")

    def node_binding_signature(self, node: LocalAccount, provider: str | None = None) -> bytes:
        return node_binding_signature(
            node, provider or self.address, chain_id=self.deployment.chain_id, registry=self.registry.address
        )

    def add_node(self, node: LocalAccount | str, signature: bytes | None = None) -> TxReceipt:
        """Binds a node to this account; pass the node's account to sign here, or its address and signature."""
        if isinstance(node, str):
            if signature is None:
                raise LedgerError("add_node with a node address needs the node's binding signature")
            address = node
        else:
            address = node.address
            signature = signature or self.node_binding_signature(node)
        return self._send(self.registry.functions.addNode(address, signature), "addNode")

    def remove_node(self, node: str) -> TxReceipt:
        return self._send(self.registry.functions.removeNode(node), "removeNode")

    def stake_of(self, provider: str) -> StakeInfo:
        active, unbonding = self._call(self.registry.functions.stakeOf(provider), "stakeOf")
        locked = self._call(self.registry.functions.lockedOf(provider), "lockedOf")
        release_at = self._call(self.registry.functions.releaseAt(provider), "releaseAt")
        return StakeInfo(int(active), int(unbonding), int(locked), int(release_at))

    def provider_of(self, node: str) -> str | None:
        provider = self._call(self.registry.functions.providerOf(node), "providerOf")
        return None if int(provider, 16) == 0 else to_checksum_address(provider)

    def is_active_node(self, node: str) -> bool:
        return bool(self._call(self.registry.functions.isActiveNode(node), "isActiveNode"))

    def nodes_of(self, provider: str) -> list[str]:
        return [to_checksum_address(n) for n in self._call(self.registry.functions.nodesOf(provider), "nodesOf")]

    def unbonding_period(self) -> int:
        return int(self._call(self.registry.functions.unbondingPeriod(), "unbondingPeriod"))

    def lock_of(self, pool_id: int, node: str) -> StakeLock:
        amount, release_at, member, is_open = self._call(self.registry.functions.lockOf(pool_id, node), "lockOf")
        return StakeLock(pool_id, to_checksum_address(node), int(amount), int(release_at), bool(member), bool(is_open))

    def release_stake(self, pool_id: int, node: str) -> TxReceipt:
        """Frees `node`'s lock in `pool_id` once it left (or was ejected) and one challenge window has passed."""
        return self._send(self.registry.functions.releaseStake(pool_id, node), "releaseStake")

    def burned(self) -> int:
        """Every token slashed so far: held by the registry for good, paid to nobody."""
        return int(self._call(self.registry.functions.burned(), "burned"))

    # --- pools -----------------------------------------------------------------------------------
    def create_pool(self, config: PoolConfig) -> int:
        """Creates a pool owned by this account and returns its id."""
        receipt = self._send(self.pools.functions.createPool(config.as_tuple()), "createPool")
        (event,) = self.pools.events.PoolCreated().process_receipt(receipt)
        return int(event["args"]["poolId"])

    def set_validator(self, pool_id: int, validator: str, allowed: bool = True) -> TxReceipt:
        return self._send(self.pools.functions.setValidator(pool_id, validator, allowed), "setValidator")

    def join(self, pool_id: int) -> TxReceipt:
        return self._send(self.pools.functions.join(pool_id), "join")

    def leave(self, pool_id: int) -> TxReceipt:
        return self._send(self.pools.functions.leave(pool_id), "leave")

    def eject(self, pool_id: int, node: str) -> TxReceipt:
        """The owner's ejection: `node` submits no more, but its earlier work is still paid unless invalidated."""
        return self._send(self.pools.functions.eject(pool_id, node), "eject")

    def pool_count(self) -> int:
        return int(self._call(self.pools.functions.poolCount(), "poolCount"))

    def min_challenge_window(self) -> int:
        """The deployment-wide lower bound of every pool's challenge window, in seconds."""
        return int(self._call(self.pools.functions.minChallengeWindow(), "minChallengeWindow"))

    def pool(self, pool_id: int) -> PoolInfo:
        config, owner = self._call(self.pools.functions.getPool(pool_id), "getPool")
        name, model_hash, spec_uri, trainer, min_stake, window, reward, slash, max_nodes, max_units = config
        return PoolInfo(
            pool_id=pool_id,
            owner=to_checksum_address(owner),
            config=PoolConfig(
                name=name,
                model_hash=bytes(model_hash),
                spec_uri=spec_uri,
                trainer=to_checksum_address(trainer),
                min_stake_per_node=int(min_stake),
                challenge_window=int(window),
                reward_per_unit=int(reward),
                slash_amount=int(slash),
                max_nodes=int(max_nodes),
                max_units_per_key=int(max_units),
            ),
        )

    def members(self, pool_id: int) -> list[str]:
        return [to_checksum_address(n) for n in self._call(self.pools.functions.members(pool_id), "members")]

    def is_member(self, pool_id: int, node: str) -> bool:
        return bool(self._call(self.pools.functions.isMember(pool_id, node), "isMember"))

    def is_ejected(self, pool_id: int, node: str) -> bool:
        """Whether `node` was ejected from `pool_id` (by its owner or by an invalidation): it submits no more."""
        return bool(self._call(self.pools.functions.isEjected(pool_id, node), "isEjected"))

    def ejection_of(self, pool_id: int, node: str) -> Ejection:
        return Ejection(int(self._call(self.pools.functions.ejectionOf(pool_id, node), "ejectionOf")))

    def is_voided(self, pool_id: int, node: str) -> bool:
        """Whether an invalidation ejected `node` from `pool_id`: none of its pending work there is ever paid."""
        return self.ejection_of(pool_id, node) == Ejection.BY_INVALIDATION

    def is_validator(self, pool_id: int, validator: str) -> bool:
        return bool(self._call(self.pools.functions.isValidator(pool_id, validator), "isValidator"))

    # --- work and rewards ------------------------------------------------------------------------
    def fund_rewards(self, pool_id: int, amount: int) -> TxReceipt:
        """Approves the work ledger if needed, then moves `amount` into the pool's reward escrow."""
        self.ensure_allowance(self.work.address, amount)
        return self._send(self.work.functions.fundRewards(pool_id, amount), "fundRewards")

    def escrow_of(self, pool_id: int) -> int:
        return int(self._call(self.work.functions.escrowOf(pool_id), "escrowOf"))

    # --- batches: one Merkle root per batch (ledger.merkle builds the tree and the proofs) -------------------
    # A batch lives in one of its node's numbered slots, reused once its batch is settled; every call that names a
    # batch names its slot. `slot=None` finds it: the node's latest `BatchSubmitted` of that root (one log query from
    # the deployment block). A daemon passes the slot it recorded; the lookup is for people and tests.
    def submit_batch(
        self, pool_id: int, root: bytes, count: int, total_units: int, *, slot: int | None = None
    ) -> TxReceipt:
        """Records this node's batch of `count` files worth `total_units` under the Merkle `root`, in its slot `slot`
        (None: the lowest free one, `free_slot`)."""
        chosen = self.free_slot(pool_id) if slot is None else slot
        return self._send(self.work.functions.submitBatch(pool_id, chosen, root, count, total_units), "submitBatch")

    def invalidate_batch(
        self, pool_id: int, node: str, root: bytes, proof: LeafProof, reason: Reason | int, *, slot: int | None = None
    ) -> TxReceipt:
        """Shows one file of `node`'s batch bad with its proof: the batch is void, the node slashed and ejected."""
        ref = self._ref(pool_id, node, root, slot)
        call = self.work.functions.invalidateBatch(pool_id, node, ref, proof.as_tuple(), int(reason))
        return self._send(call, "invalidateBatch")

    def invalidate_unavailable_batch(
        self, pool_id: int, node: str, root: bytes, *, slot: int | None = None
    ) -> TxReceipt:
        """Invalidates `node`'s batch whose leaf list was never made available (reason 8, no proof): the batch is
        void, the node slashed and ejected, as by `invalidate_batch`."""
        call = self.work.functions.invalidateUnavailableBatch(pool_id, node, self._ref(pool_id, node, root, slot))
        return self._send(call, "invalidateUnavailableBatch")

    def refuse_leaf(
        self, pool_id: int, node: str, root: bytes, proof: LeafProof, reason: Reason | int, *, slot: int | None = None
    ) -> TxReceipt:
        """Refuses one file of `node`'s batch with its proof, without a slash: its units are not paid."""
        ref = self._ref(pool_id, node, root, slot)
        call = self.work.functions.refuseLeaf(pool_id, node, ref, proof.as_tuple(), int(reason))
        return self._send(call, "refuseLeaf")

    def claim_batches(
        self, pool_id: int, node: str, roots: Sequence[bytes], *, slots: Sequence[int] | None = None
    ) -> TxReceipt:
        """Pays `node`'s provider for `node`'s batches `roots` (in `slots`, when given), less their refused leaves
        (anyone may send this)."""
        if slots is not None and len(slots) != len(roots):
            raise LedgerError(f"{len(roots)} roots but {len(slots)} slots to claim")
        refs = [self._ref(pool_id, node, root, None if slots is None else slots[i]) for i, root in enumerate(roots)]
        return self._send(self.work.functions.claimBatches(pool_id, node, refs), "claimBatches")

    def get_slot(self, pool_id: int, node: str, slot: int) -> BatchRecord:
        """What `node`'s batch slot `slot` holds: its batch's record, status NONE when never used."""
        root, provider, count, total, refused, submitted_at, status = self._call(
            self.work.functions.getBatch(pool_id, node, slot), "getBatch"
        )
        return BatchRecord(
            pool_id=pool_id,
            root=bytes(root),
            node=to_checksum_address(node),
            provider=to_checksum_address(provider),
            count=int(count),
            total_units=int(total),
            refused_units=int(refused),
            submitted_at=int(submitted_at),
            status=BatchStatus(int(status)),
            slot=slot,
        )

    def get_batch(self, pool_id: int, node: str, root: bytes, *, slot: int | None = None) -> BatchRecord:
        """`node`'s batch `root`: status NONE when `node` never submitted it, or its slot holds another batch now."""
        chosen = self.slot_of(pool_id, node, root) if slot is None else slot
        if chosen is not None:
            record = self.get_slot(pool_id, node, chosen)
            if record.root == bytes(root) and record.status != BatchStatus.NONE:
                return record
        none = BatchStatus.NONE
        zero = "0x" + "00" * 20
        return BatchRecord(pool_id, bytes(root), to_checksum_address(node), zero, 0, 0, 0, 0, none, slot=chosen or 0)

    def free_slot(self, pool_id: int, node: str | None = None) -> int:
        """The lowest of `node`'s (this account's) slots that takes a new batch: never used, or its batch settled."""
        owner = self.address if node is None else node
        slot = 0
        while self.get_slot(pool_id, owner, slot).status == BatchStatus.PENDING:
            slot += 1
        return slot

    def slot_of(self, pool_id: int, node: str, root: bytes) -> int | None:
        """The slot of `node`'s latest `BatchSubmitted` of `root` in the pool, or None when there is none."""
        event = self.work.events.BatchSubmitted()
        params = {
            "address": self.work.address,
            "fromBlock": self.deployment.block,
            "toBlock": "latest",
            "topics": [
                bytes(HexBytes(event.topic)),  # web3 8 gives it as a hex string
                pool_id.to_bytes(32, "big"),
                bytes(root),
                bytes(12) + bytes.fromhex(to_checksum_address(node)[2:]),
            ],
        }
        url = self.deployment.rpc_url
        logs = with_retries(lambda: self.w3.eth.get_logs(params), what="read logs", url=url)  # type: ignore[arg-type]
        if not logs:
            return None
        return int(event.process_log(logs[-1])["args"]["slot"])

    def _ref(self, pool_id: int, node: str, root: bytes, slot: int | None) -> tuple[int, bytes]:
        """The (slot, root) a call names a batch by; a batch not found names slot 0, and the call reverts
        `BatchNotFound` for it."""
        chosen = self.slot_of(pool_id, node, root) if slot is None else slot
        return (0 if chosen is None else chosen, bytes(root))

    def is_leaf_refused(self, pool_id: int, node: str, root: bytes, index: int) -> bool:
        return bool(self._call(self.work.functions.isLeafRefused(pool_id, node, root, index), "isLeafRefused"))

    def challenge_window(self, pool_id: int) -> int:
        window, _, _, _ = self._call(self.pools.functions.terms(pool_id), "terms")
        return int(window)
