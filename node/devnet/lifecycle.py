"""The ledger's life in one run: pool, stake, work, a slash, a claim and a refused claim, on a fresh anvil.

`run_lifecycle()` takes the four contracts through the path a real pool takes (DESIGN.md section 1,
steps 4 to 7), signing with anvil's public development keys. It reports each step through a callback
as it happens and returns the holdings before and after, so a caller can check the accounting.
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

from web3.logs import EventLogErrorFlags

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.deployment import Deployment
from ledger.errors import ContractRevert
from ledger.types import PoolConfig, Reason, WorkStatus
from ledger.units import format_amount, parse_amount

# The receipts also hold the token's and registry's logs, which these contracts' ABIs cannot decode.
DISCARD = EventLogErrorFlags.Discard


@dataclass(frozen=True)
class LifecycleConfig:
    """The script's numbers; token amounts in whole tokens. Every amount shown or checked derives from these."""

    pool_name: str = "devnet-lifecycle"
    challenge_window: int = 3600  # seconds; at most the registry's unbonding period (7 days by default)
    min_stake_per_node: Decimal = Decimal("100")
    reward_per_unit: Decimal = Decimal("0.01")
    slash_amount: Decimal = Decimal("50")
    pool_funding: Decimal = Decimal("1000")
    provider_grant: Decimal = Decimal("500")  # minted to each provider
    provider_stake: Decimal = Decimal("200")  # must cover min_stake_per_node for its one node
    units: tuple[int, int] = (1_500, 2_000)  # output tokens in the rollout file of node 1 and node 2
    invalid_reason: Reason = Reason.PROOF_INVALID


class Role(StrEnum):
    POOL_OWNER = "pool owner"
    PROVIDER_1 = "provider 1"
    PROVIDER_2 = "provider 2"
    VALIDATOR = "validator"
    NODE_1 = "node 1"
    NODE_2 = "node 2"
    ESCROW = "pool escrow"  # the WorkLedger contract, which holds every pool's reward escrow


# Who signs with which anvil development key (public keys: fine here, never on a real chain).
DEV_KEY_INDEX: dict[Role, int] = {
    Role.POOL_OWNER: 0,
    Role.PROVIDER_1: 1,
    Role.PROVIDER_2: 2,
    Role.VALIDATOR: 3,
    Role.NODE_1: 4,
    Role.NODE_2: 5,
}
TABLE_PARTIES = (Role.PROVIDER_1, Role.PROVIDER_2, Role.ESCROW, Role.VALIDATOR, Role.POOL_OWNER)

_STATUS_WORDS = {
    WorkStatus.PENDING: "the work is still pending",
    WorkStatus.INVALIDATED: "the work was invalidated",
    WorkStatus.CLAIMED: "the work was already claimed",
}


@dataclass(frozen=True)
class Holdings:
    """One party's tokens, in base units."""

    balance: int
    active_stake: int
    unbonding: int


@dataclass(frozen=True)
class Snapshot:
    holdings: dict[Role, Holdings]
    escrow: int  # the pool's reward escrow (`escrowOf`)
    members: tuple[str, ...]  # node addresses


@dataclass(frozen=True)
class Refusal:
    """A transaction the contracts refused: the decoded custom error, and what it means in words."""

    error: str
    values: dict[str, Any]
    message: str
    explanation: str


class UnexpectedSuccess(AssertionError):
    """The contracts accepted what they must refuse: a bug in the contracts or in this script."""


@dataclass(frozen=True)
class LifecycleReport:
    """Before is taken once both nodes have joined, before any work; after, once the refused claim is done."""

    config: LifecycleConfig
    deployment: Deployment
    pool_id: int
    decimals: int
    addresses: dict[Role, str]
    work_keys: tuple[bytes, bytes]
    before: Snapshot
    after: Snapshot
    funded: int
    claimed: int  # paid to provider 1 (from the RewardsClaimed event)
    slashed: int  # taken from provider 2 (from the WorkInvalidated event)
    refusal: Refusal

    def tokens(self, base_units: int) -> str:
        return format_amount(base_units, self.decimals)


StepCallback = Callable[[int, str], None]


def dev_key_cast() -> list[tuple[Role, int, str]]:
    """(role, anvil key index, address) for every development key the script signs with."""
    return [(role, index, dev_account(index).address) for role, index in DEV_KEY_INDEX.items()]


def explain_refusal(revert: ContractRevert) -> str:
    """The contract's reason for refusing, in words a person reads."""
    if revert.name == "WorkNotPending":
        status = WorkStatus(int(revert.values["status"]))
        return f"refused: {_STATUS_WORDS.get(status, f'the work is {status.name.lower()}')}"
    if revert.name == "ChallengeWindowOpen":
        return "refused: the challenge window is still open"
    if revert.name == "WorkNotFound":
        return "refused: no such work was submitted"
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
    as_role = {role: Ledger(chain.w3, deployment, account) for role, account in keys.items()}
    owner = as_role[Role.POOL_OWNER]
    decimals = owner.decimals

    def base(amount: Decimal) -> int:
        return parse_amount(amount, decimals)

    def tokens(base_units: int) -> str:
        return format_amount(base_units, decimals)

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
        f"reward {tokens(pool_config.reward_per_unit)} per unit, slash {tokens(pool_config.slash_amount)}"
    )
    funded = base(config.pool_funding)
    owner.mint(owner.address, funded)
    owner.fund_rewards(pool_id, funded)
    step(f"pool owner minted and funded pool #{pool_id} with {tokens(funded)} tokens")
    owner.set_validator(pool_id, addresses[Role.VALIDATOR])
    step(f"pool owner appointed the validator {addresses[Role.VALIDATOR]}")

    pairs = ((Role.PROVIDER_1, Role.NODE_1), (Role.PROVIDER_2, Role.NODE_2))
    for provider_role, node_role in pairs:
        provider = as_role[provider_role]
        owner.mint(provider.address, base(config.provider_grant))
        provider.stake(base(config.provider_stake))
        provider.add_node(keys[node_role])  # the node key signs the EIP-712 NodeBinding
        as_role[node_role].join(pool_id)
        step(
            f"{provider_role} got {tokens(base(config.provider_grant))} tokens, staked "
            f"{tokens(base(config.provider_stake))}, bound {node_role} {addresses[node_role]} "
            f"(binding signed by the node key); {node_role} joined pool #{pool_id}"
        )

    before = _snapshot(owner, pool_id, addresses)
    work_keys = (rollout_work_key(addresses[Role.NODE_1]), rollout_work_key(addresses[Role.NODE_2]))
    for (_, node_role), work_key, units in zip(pairs, work_keys, config.units, strict=True):
        as_role[node_role].submit_work(pool_id, work_key, units)
        step(f"{node_role} submitted work 0x{work_key.hex()[:16]}... ({units:,} units)")

    validator = as_role[Role.VALIDATOR]
    receipt = validator.invalidate_work(pool_id, work_keys[1], config.invalid_reason)
    (invalidated,) = validator.work.events.WorkInvalidated().process_receipt(receipt, errors=DISCARD)
    slashed = int(invalidated["args"]["slashed"])
    step(
        f"validator invalidated node 2's work ({config.invalid_reason.name}, reason {int(config.invalid_reason)}): "
        f"provider 2 slashed {tokens(slashed)} tokens into the escrow, node 2 ejected"
    )

    now = chain.increase_time(config.challenge_window + 1)
    step(
        f"chain time moved {_duration(config.challenge_window + 1)} forward, "
        f"past the challenge window (block time {now})"
    )

    receipt = as_role[Role.PROVIDER_1].claim_rewards(pool_id, [work_keys[0]])
    (paid,) = owner.work.events.RewardsClaimed().process_receipt(receipt, errors=DISCARD)
    claimed = int(paid["args"]["amount"])
    step(
        f"provider 1 claimed {tokens(claimed)} tokens "
        f"({config.units[0]:,} units x {tokens(pool_config.reward_per_unit)})"
    )

    refusal = _refused_claim(as_role[Role.PROVIDER_2], pool_id, work_keys[1])
    step(f"provider 2 tried to claim its invalidated work -> {refusal.explanation}\n    {refusal.message}")

    return LifecycleReport(
        config=config,
        deployment=deployment,
        pool_id=pool_id,
        decimals=decimals,
        addresses=addresses,
        work_keys=work_keys,
        before=before,
        after=_snapshot(owner, pool_id, addresses),
        funded=funded,
        claimed=claimed,
        slashed=slashed,
        refusal=refusal,
    )


def _refused_claim(provider: Ledger, pool_id: int, work_key: bytes) -> Refusal:
    try:
        receipt = provider.claim_rewards(pool_id, [work_key])
    except ContractRevert as revert:
        return Refusal(revert.name, dict(revert.values), str(revert), explain_refusal(revert))
    raise UnexpectedSuccess(f"claiming invalidated work succeeded (tx {receipt['transactionHash'].hex()})")


def _duration(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{value} {unit}" for value, unit in ((hours, "h"), (minutes, "min"), (secs, "s")) if value]
    return " ".join(parts) or "0 s"


def _snapshot(ledger: Ledger, pool_id: int, addresses: dict[Role, str]) -> Snapshot:
    holdings: dict[Role, Holdings] = {}
    for role in TABLE_PARTIES:
        stake = ledger.stake_of(addresses[role])
        holdings[role] = Holdings(ledger.balance_of(addresses[role]), stake.active, stake.unbonding)
    return Snapshot(holdings, ledger.escrow_of(pool_id), tuple(ledger.members(pool_id)))
