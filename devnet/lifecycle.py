"""The ledger's life in one run: pool, stake, work, a burned slash, claims paid and refused, locks released, on a
fresh anvil.

`run_lifecycle()` takes the four contracts through the path a real pool takes (DESIGN.md section 1,
steps 4 to 7), signing with anvil's public development keys. It reports each step through a callback
as it happens and returns the holdings before and after, so a caller can check the accounting:
a slash takes tokens from the node's lock in the pool and burns them (they stay in the NodeRegistry,
counted in `burned`, and nobody's balance grows by them), so the escrow is funded - claimed; work is committed
one Merkle root per batch, a batch with one bad file is void as a whole, and an ejected node's pending batches are
void; a lock outlives its membership by one challenge window.
Nothing here prints: `prime-devnet lifecycle` does.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Any

from eth_utils import to_checksum_address
from web3.logs import EventLogErrorFlags
from web3.types import TxReceipt

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.deployment import Deployment
from ledger.errors import ContractRevert
from ledger.merkle import BatchTree, Leaf
from ledger.types import BatchStatus, PoolConfig, Reason, StakeLock
from ledger.units import format_amount, parse_amount

# The receipts also hold the token's and registry's logs, which these contracts' ABIs cannot decode.
DISCARD = EventLogErrorFlags.Discard


@dataclass(frozen=True)
class LifecycleConfig:
    """The script's numbers; token amounts in whole tokens. Every amount shown or checked derives from these."""

    pool_name: str = "devnet-lifecycle"
    # seconds; at least the deployment's minimum (1 h by default), at most the registry's unbonding period (7 days)
    challenge_window: int = 3600
    min_stake_per_node: Decimal = Decimal("100")
    reward_per_unit: Decimal = Decimal("0.01")
    slash_amount: Decimal = Decimal("50")  # burned from the node's lock per invalidation; at most the min stake
    pool_funding: Decimal = Decimal("1000")
    provider_grant: Decimal = Decimal("500")  # minted to each provider
    provider_stake: Decimal = Decimal("200")  # must cover min_stake_per_node for its one node
    # output tokens in the rollout files of node 1's batch, and of node 2's batch: its first file is shown bad, which
    # voids its second with it
    units: tuple[int, int, int] = (1_500, 2_000, 2_500)
    invalid_reason: Reason = Reason.PROOF_INVALID


class Role(StrEnum):
    POOL_OWNER = "pool owner"
    PROVIDER_1 = "provider 1"
    PROVIDER_2 = "provider 2"
    VALIDATOR = "validator"
    NODE_1 = "node 1"
    NODE_2 = "node 2"
    ESCROW = "pool escrow"  # the WorkLedger contract, which holds every pool's reward escrow
    REGISTRY = "NodeRegistry"  # holds the stake, and the burned tokens for good


# Who signs with which anvil development key (public keys: fine here, never on a real chain).
DEV_KEY_INDEX: dict[Role, int] = {
    Role.POOL_OWNER: 0,
    Role.PROVIDER_1: 1,
    Role.PROVIDER_2: 2,
    Role.VALIDATOR: 3,
    Role.NODE_1: 4,
    Role.NODE_2: 5,
}
TABLE_PARTIES = (Role.PROVIDER_1, Role.PROVIDER_2, Role.ESCROW, Role.REGISTRY, Role.VALIDATOR, Role.POOL_OWNER)
NODES = (Role.NODE_1, Role.NODE_2)
PROVIDER_OF = {Role.NODE_1: Role.PROVIDER_1, Role.NODE_2: Role.PROVIDER_2}

_BATCH_STATUS_WORDS = {
    BatchStatus.PENDING: "the batch is still pending",
    BatchStatus.INVALIDATED: "the batch was invalidated: one of its files was shown bad, and none of it is paid",
    BatchStatus.CLAIMED: "the batch was already claimed",
}


@dataclass(frozen=True)
class Holdings:
    """One party's tokens, in base units."""

    balance: int
    active_stake: int
    locked: int  # of the active stake, by its nodes' locks in every pool (`lockedOf`)
    unbonding: int


@dataclass(frozen=True)
class Snapshot:
    holdings: dict[Role, Holdings]
    escrow: int  # the pool's reward escrow (`escrowOf`)
    burned: int  # every token slashed so far, held by the NodeRegistry for good (`burned`)
    members: tuple[str, ...]  # node addresses
    locks: dict[Role, StakeLock]  # each node's lock in the pool (`lockOf`)


@dataclass(frozen=True)
class Refusal:
    """A transaction the contracts refused: the decoded custom error, and what it means in words."""

    error: str
    values: dict[str, Any]
    message: str
    explanation: str


@dataclass(frozen=True)
class LockRelease:
    """A lock that outlived its membership: held from `ended_at` (leave or ejection) until `held_until`, then freed."""

    node: Role
    ended_at: int  # chain time of the block that ended the membership
    held_until: int  # `lockOf(...).releaseAt`: ended_at + the challenge window
    released_at: int  # chain time of the `releaseStake` block
    amount: int  # what the lock held when it was released (after any slash)
    provider_locked: tuple[int, int]  # the provider's `lockedOf` just before and after the release


class UnexpectedSuccess(AssertionError):
    """The contracts accepted what they must refuse: a bug in the contracts or in this script."""


@dataclass(frozen=True)
class LifecycleReport:
    """Before is taken once both nodes have joined, before any work; after, once both locks are released."""

    config: LifecycleConfig
    deployment: Deployment
    pool_id: int
    decimals: int
    addresses: dict[Role, str]
    work_keys: tuple[bytes, bytes, bytes]  # node 1's file, node 2's bad file, node 2's second file (void with it)
    roots: tuple[bytes, bytes]  # node 1's batch (its file), node 2's batch (its two files)
    before: Snapshot
    after: Snapshot
    funded: int
    claimed: int  # paid to provider 1 (from the BatchesClaimed event)
    slashed: int  # burned from node 2's lock (from the BatchInvalidated event)
    lock_after_slash: StakeLock  # node 2's lock right after the invalidation: what is left, held until when
    repeat_claim: Refusal  # provider 1 claims node 1's batch a second time: BatchNotPending (claimed)
    ejected_claim: Refusal  # node 2's batch, past its window: NodeEjected (an ejected node's work is void)
    early_release: Refusal  # node 1's lock released before its window has passed: LockHeld
    releases: dict[Role, LockRelease]  # node 1 (left) and node 2 (ejected)

    def tokens(self, base_units: int) -> str:
        return format_amount(base_units, self.decimals)


StepCallback = Callable[[int, str], None]


def dev_key_cast() -> list[tuple[Role, int, str]]:
    """(role, anvil key index, address) for every development key the script signs with."""
    return [(role, index, dev_account(index).address) for role, index in DEV_KEY_INDEX.items()]


def explain_refusal(revert: ContractRevert) -> str:
    """The contract's reason for refusing, in words a person reads."""
    values = revert.values
    if revert.name == "BatchNotPending":
        batch_status = BatchStatus(int(values["status"]))
        return f"refused: {_BATCH_STATUS_WORDS.get(batch_status, f'the batch is {batch_status.name.lower()}')}"
    if revert.name == "BatchChallengeWindowOpen":
        return "refused: the challenge window is still open"
    if revert.name == "BatchNotFound":
        return "refused: no such batch was submitted"
    if revert.name == "NodeEjected":
        return "refused: an invalidation ejected the node from the pool, so its pending batches are void and never paid"
    if revert.name == "LockHeld":
        if values.get("member"):
            return "refused: the node is still a member of the pool; its lock ends only after it leaves"
        return (
            f"refused: the lock is held until block time {values['releaseAt']}, when the challenge window of the "
            "node's last submission closes"
        )
    if revert.name == "NotLocked":
        return "refused: the node holds no lock in this pool"
    return f"refused: {revert.name}"


def rollout_work_key(node: str, step: int = 0) -> bytes:
    """sha256 of bytes that stand in for the node's rollout file (DESIGN.md section 6: workKey = sha256(file))."""
    return hashlib.sha256(f"rollout file of {node} at step {step}".encode()).digest()


def run_lifecycle(
    on_step: StepCallback | None = None,
    *,
    config: LifecycleConfig | None = None,
    chain: LocalChain | None = None,
) -> LifecycleReport:
    """Runs the whole script on a fresh anvil and returns what changed.

    Pass an unstarted `chain` to keep it running afterwards (the caller stops it); by default the
    function starts its own and stops it before returning.
    """
    owned = chain is None
    local = chain if chain is not None else LocalChain()
    local.start()
    try:
        return _run(local, config or LifecycleConfig(), on_step or (lambda number, text: None))
    finally:
        if owned:
            local.stop()


def _run(chain: LocalChain, config: LifecycleConfig, on_step: StepCallback) -> LifecycleReport:
    numbers = itertools.count(1)

    def step(text: str) -> None:
        on_step(next(numbers), text)

    step(f"started anvil at {chain.rpc_url} (chain id {chain.chain_id})")
    deployment = chain.deploy()
    contracts = ", ".join(f"{name} {address}" for name, address in deployment.contracts.items())
    step(f"deployed {contracts}")

    keys = {role: dev_account(index) for role, index in DEV_KEY_INDEX.items()}
    addresses: dict[Role, str] = {role: str(account.address) for role, account in keys.items()}
    addresses[Role.ESCROW] = deployment.address("WorkLedger")
    addresses[Role.REGISTRY] = deployment.address("NodeRegistry")
    as_role = {role: Ledger(chain.w3, deployment, account) for role, account in keys.items()}
    owner = as_role[Role.POOL_OWNER]
    decimals = owner.decimals

    def base(amount: Decimal) -> int:
        return parse_amount(amount, decimals)

    def tokens(base_units: int) -> str:
        return format_amount(base_units, decimals)

    def block_time(receipt: TxReceipt) -> int:
        return int(chain.w3.eth.get_block(receipt["blockNumber"])["timestamp"])

    pool_config = PoolConfig(
        name=config.pool_name,
        model_hash=hashlib.sha256(config.pool_name.encode()).digest(),
        spec_uri=f"devnet://{config.pool_name}",
        trainer=addresses[Role.POOL_OWNER],
        min_stake_per_node=base(config.min_stake_per_node),
        challenge_window=config.challenge_window,
        reward_per_unit=base(config.reward_per_unit),
        slash_amount=base(config.slash_amount),
    )
    pool_id = owner.create_pool(pool_config)
    step(
        f"pool owner created pool #{pool_id} '{config.pool_name}': "
        f"challenge window {_duration(config.challenge_window)}, "
        f"min stake {tokens(pool_config.min_stake_per_node)} per node, "
        f"reward {tokens(pool_config.reward_per_unit)} per unit, slash {tokens(pool_config.slash_amount)} "
        f"(burned from the node's lock in this pool), at most {pool_config.max_units_per_key:,} units per file"
    )
    funded = base(config.pool_funding)
    owner.mint(owner.address, funded)
    owner.fund_rewards(pool_id, funded)
    step(f"pool owner minted and funded pool #{pool_id} with {tokens(funded)} tokens")
    owner.set_validator(pool_id, addresses[Role.VALIDATOR])
    step(f"pool owner appointed the validator {addresses[Role.VALIDATOR]}")

    for node_role in NODES:
        provider_role = PROVIDER_OF[node_role]
        provider = as_role[provider_role]
        owner.mint(provider.address, base(config.provider_grant))
        provider.stake(base(config.provider_stake))
        provider.add_node(keys[node_role])  # the node key signs the EIP-712 NodeBinding
        as_role[node_role].join(pool_id)
        lock = owner.lock_of(pool_id, addresses[node_role])
        step(
            f"{provider_role} got {tokens(base(config.provider_grant))} tokens, staked "
            f"{tokens(base(config.provider_stake))}, bound {node_role} {addresses[node_role]} "
            f"(binding signed by the node key); {node_role} joined pool #{pool_id}, locking "
            f"{tokens(lock.amount)} of {provider_role}'s stake there"
        )

    before = _snapshot(owner, pool_id, addresses)
    work_keys = (
        rollout_work_key(addresses[Role.NODE_1]),
        rollout_work_key(addresses[Role.NODE_2]),
        rollout_work_key(addresses[Role.NODE_2], step=1),
    )
    trees = (
        BatchTree([Leaf(work_keys[0], config.units[0])]),
        BatchTree([Leaf(work_keys[1], config.units[1]), Leaf(work_keys[2], config.units[2])]),
    )
    for node_role, tree in zip(NODES, trees, strict=True):  # each node's first batch, in its batch slot 0
        as_role[node_role].submit_batch(pool_id, tree.root, tree.count, tree.total_units, slot=0)
        files = ", ".join(f"0x{leaf.work_key.hex()[:16]}... ({leaf.units:,} units)" for leaf in tree.leaves)
        step(
            f"{node_role} committed a batch of {tree.count} file{'s' if tree.count > 1 else ''}: one record on chain, "
            "in its batch slot 0, "
            f"its Merkle root 0x{tree.root.hex()[:16]}..., {tree.total_units:,} units in all: {files}"
        )

    validator = as_role[Role.VALIDATOR]
    node_2 = addresses[Role.NODE_2]
    burned_before = owner.burned()
    proof = trees[1].proof(0)
    receipt = validator.invalidate_batch(pool_id, node_2, trees[1].root, proof, config.invalid_reason, slot=0)
    (invalidated,) = validator.work.events.BatchInvalidated().process_receipt(receipt, errors=DISCARD)
    slashed = int(invalidated["args"]["slashed"])
    ejected_at = block_time(receipt)
    lock_after_slash = owner.lock_of(pool_id, node_2)
    step(
        f"validator showed node 2's first file bad ({config.invalid_reason.name}, reason "
        f"{int(config.invalid_reason)}) with its Merkle proof ({len(proof.siblings)} sibling hash): the whole batch "
        f"is void, its good second file too; {tokens(slashed)} tokens taken from node 2's lock in pool #{pool_id} "
        f"({tokens(before.locks[Role.NODE_2].amount)} -> {tokens(lock_after_slash.amount)}) and burned: they stay "
        f"in the NodeRegistry for good, paid to nobody (burned {tokens(burned_before)} -> {tokens(owner.burned())}); "
        f"node 2 ejected, so any other pending work of it is void; its lock is held until block time "
        f"{lock_after_slash.release_at}"
    )

    now = chain.increase_time(config.challenge_window + 1)
    step(
        f"chain time moved {_duration(config.challenge_window + 1)} forward, "
        f"past the challenge window (block time {now})"
    )

    provider_1 = as_role[Role.PROVIDER_1]
    node_1 = addresses[Role.NODE_1]
    receipt = provider_1.claim_batches(pool_id, node_1, [trees[0].root], slots=[0])
    (paid,) = owner.work.events.BatchesClaimed().process_receipt(receipt, errors=DISCARD)
    claimed = int(paid["args"]["amount"])
    step(
        f"provider 1 claimed {tokens(claimed)} tokens for node 1's batch "
        f"({trees[0].total_units:,} units x {tokens(pool_config.reward_per_unit)})"
    )

    repeat_claim = _refused(
        lambda: provider_1.claim_batches(pool_id, node_1, [trees[0].root], slots=[0]), "claiming a claimed batch again"
    )
    step(f"provider 1 tried to claim node 1's batch again -> {repeat_claim.explanation}\n    {repeat_claim.message}")

    ejected_claim = _refused(
        lambda: as_role[Role.PROVIDER_2].claim_batches(pool_id, node_2, [trees[1].root], slots=[0]),
        "claiming the batch of an ejected node",
    )
    step(
        f"provider 2 tried to claim node 2's batch, past its challenge window -> {ejected_claim.explanation} (the "
        f"ejection is checked before any batch)\n    {ejected_claim.message}"
    )

    receipt = as_role[Role.NODE_1].leave(pool_id)
    left_at = block_time(receipt)
    held = owner.lock_of(pool_id, node_1)
    step(
        f"node 1 left pool #{pool_id}: its lock of {tokens(held.amount)} tokens is held until block time "
        f"{held.release_at} (one challenge window: its last submission could still be invalidated until then); "
        f"provider 1 still has {tokens(owner.stake_of(addresses[Role.PROVIDER_1]).locked)} locked"
    )
    early_release = _refused(lambda: provider_1.release_stake(pool_id, node_1), "releasing a held lock early")
    step(
        f"provider 1 tried to release node 1's lock at once -> {early_release.explanation}\n    {early_release.message}"
    )

    wait = held.release_at - now
    now = chain.increase_time(wait)
    step(f"chain time moved {_duration(wait)} forward, to node 1's release time (block time {now})")

    releases: dict[Role, LockRelease] = {}
    ended = {Role.NODE_1: left_at, Role.NODE_2: ejected_at}
    for node_role in NODES:
        provider_role = PROVIDER_OF[node_role]
        lock = owner.lock_of(pool_id, addresses[node_role])
        locked_before = owner.stake_of(addresses[provider_role]).locked
        receipt = as_role[provider_role].release_stake(pool_id, addresses[node_role])
        locked_after = owner.stake_of(addresses[provider_role]).locked
        releases[node_role] = LockRelease(
            node=node_role,
            ended_at=ended[node_role],
            held_until=lock.release_at,
            released_at=block_time(receipt),
            amount=lock.amount,
            provider_locked=(locked_before, locked_after),
        )
        why = "left" if node_role == Role.NODE_1 else "was ejected"
        step(
            f"{provider_role} released {node_role}'s lock ({node_role} {why} at block time {ended[node_role]}, "
            f"held until {lock.release_at}): {provider_role} locked {tokens(locked_before)} -> "
            f"{tokens(locked_after)}; its {tokens(owner.stake_of(addresses[provider_role]).active)} staked tokens "
            f"are free to unstake"
        )

    return LifecycleReport(
        config=config,
        deployment=deployment,
        pool_id=pool_id,
        decimals=decimals,
        addresses=addresses,
        work_keys=work_keys,
        roots=(trees[0].root, trees[1].root),
        before=before,
        after=_snapshot(owner, pool_id, addresses),
        funded=funded,
        claimed=claimed,
        slashed=slashed,
        lock_after_slash=lock_after_slash,
        repeat_claim=repeat_claim,
        ejected_claim=ejected_claim,
        early_release=early_release,
        releases=releases,
    )


def _refused(send: Callable[[], TxReceipt], what: str) -> Refusal:
    try:
        receipt = send()
    except ContractRevert as revert:
        values = {k: to_checksum_address(v) if _is_address(v) else v for k, v in revert.values.items()}
        return Refusal(revert.name, values, str(revert), explain_refusal(revert))
    raise UnexpectedSuccess(f"{what} succeeded (tx {receipt['transactionHash'].hex()})")


def _is_address(value: object) -> bool:
    return isinstance(value, str) and value.startswith("0x") and len(value) == 42


def _duration(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{value} {unit}" for value, unit in ((hours, "h"), (minutes, "min"), (secs, "s")) if value]
    return " ".join(parts) or "0 s"


def _snapshot(ledger: Ledger, pool_id: int, addresses: dict[Role, str]) -> Snapshot:
    holdings: dict[Role, Holdings] = {}
    for role in TABLE_PARTIES:
        stake = ledger.stake_of(addresses[role])
        holdings[role] = Holdings(ledger.balance_of(addresses[role]), stake.active, stake.locked, stake.unbonding)
    return Snapshot(
        holdings,
        ledger.escrow_of(pool_id),
        ledger.burned(),
        tuple(ledger.members(pool_id)),
        {role: ledger.lock_of(pool_id, addresses[role]) for role in NODES},
    )
