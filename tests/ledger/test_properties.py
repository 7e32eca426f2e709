"""Random operation sequences against the contracts, checked step by step against a Python model.

Three providers (one or two nodes each) and three pools with different terms: pool 0 (1 h window, 100 tokens
locked per node, 60 slashed per invalidated batch), pool 1 (2 h, 40 locked, 40 slashed, at most 5,000 units per
file) and pool 2, which provider 0 created with the smallest terms allowed (1 token locked and slashed) and
validates itself: its node can be "invalidated" by its own provider. Every bound node starts as a member of
pools 0 and 2 and may join pool 1. Unbonding takes 2 days. A funder tops up the escrows; nodes commit batches (one
Merkle root for 1 to 8 files, `ledger.merkle`), declaring their leaves' units or fewer or more than those; a
validator invalidates a batch (the whole batch void, a slash) or refuses its leaves one by one (no slash) with
proofs, some of them wrong, outside the tree or of the wrong length, or invalidates with no proof a batch whose leaf
list was never made available (reason 8), in pools 0 and 1, batches with refused leaves included; owners eject
nodes; anyone releases held locks and claims whole batches. Each operation is first applied to `Model`, which says
whether it must revert and with which custom error; the chain must agree.

After every step the invariants are read back from the chain:
- no token is created or lost; the registry holds exactly the stake plus what was burned, the work ledger
  exactly the escrows;
- nothing slashed is ever paid out: the escrows plus everything claimed equal everything funded, and the
  registry's `burned` equals everything slashed;
- the slashes of a node in a pool never total more than the lock it took there (`minStakePerNode`), and a
  provider's slashes in a pool never more than its nodes' locks there;
- a node ejected by an invalidation is never paid again; a node ejected by its owner is: its earlier batches are
  paid after their window unless invalidated (after `settle`, only a voided node's batches or batches the escrow
  could not cover are left unpaid), and an owner's ejection never turns one by invalidation back;
- nothing in an invalidated batch is paid; a batch is invalidated at most once and a leaf refused at most once, a
  refusal neither slashes, ejects nor pays; a claim pays each batch exactly its declared total less its refused
  leaves' units (at most the total: a leaf claiming more than its batch takes the batch to zero, not below), as
  summed from the events alone;
- stake backing an open window stays put: a provider's locked stake equals what its open locks hold and is
  covered by its active stake, every pending batch whose window is open (it may still be invalidated) is backed by
  an open lock holding the pool's `minStakePerNode` less what was slashed from it (an owner's ejection included),
  and a withdrawal never takes active or locked stake;
- and the model's view of every balance, stake, lock, membership and batch record matches.

Time is exact: every transaction of a step is mined at the model's clock (`evm_setNextBlockTimestamp`), and
the block before it has that timestamp too, so gas estimation (which runs on the latest block) and execution
agree even exactly at a window's end or a release time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests
from eth_account import Account
from eth_account.signers.local import LocalAccount
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from web3.types import TxReceipt

from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.errors import ContractRevert
from ledger.events import NO_LEAF
from ledger.merkle import BatchTree, Leaf, LeafProof
from ledger.types import BatchStatus, Ejection
from tests.conftest import TOKEN, UNBONDING_PERIOD
from tests.ledger.helpers import batch_of, events, make_pool, onboard

WALLET = 1_000 * TOKEN  # minted to each provider and to the funder, besides the initial stake
MAX_UNITS = 2**48 - 1  # the largest cap a pool may set
MAX_ALLOWANCE = 2**256 - 1
MAX_REASON = 8

OWNER, PROVIDERS, FUNDER, VALIDATOR = 0, (1, 2, 3), 4, 5


@dataclass(frozen=True)
class Terms:
    min_stake: int
    slash: int
    window: int
    reward: int
    max_units: int
    owner: int  # account index: creates the pool and may eject
    validator: int  # account index


POOLS = (
    Terms(100 * TOKEN, 60 * TOKEN, 3600, 10**14, 1_000_000, OWNER, VALIDATOR),
    Terms(40 * TOKEN, 40 * TOKEN, 7200, 2 * 10**14, 5_000, OWNER, VALIDATOR),
    Terms(TOKEN, TOKEN, 3600, 10**14, MAX_UNITS, PROVIDERS[0], PROVIDERS[0]),  # provider 0's own pool
)
LONGEST_WINDOW = max(t.window for t in POOLS)
START_POOLS = (0, 2)  # every bound node starts as a member of these; pool 1 it must join
START_LOCKS = sum(POOLS[pool].min_stake for pool in START_POOLS)
NODES_PER_PROVIDER = 2
NODE_KEYS: list[LocalAccount] = [
    Account.from_key(hashlib.sha256(f"property-node-{i}".encode()).digest())
    for i in range(len(PROVIDERS) * NODES_PER_PROVIDER)
]  # node slot i belongs to provider i // 2; a slot is unused when that provider drew one node
# The batches a node may commit: counts 1 to 8 (depths 0 to 3). In pool 1 (5,000 units a file) batch 3 holds a file
# over the cap within a total under count x cap (only a validator can tell), batch 4's total is over count x cap,
# batch 5's exactly at it.
BATCH_UNITS = [
    [3000],
    [2000, 4096],
    [1000, 5000, 2500],
    [512, 8192, 1, 4096, 2048],
    [10**6, 1],
    [5000, 5000],
    [1] * 8,
    [4096] * 6,
]
BATCH_TREES = [
    batch_of(*[(f"property-batch-{b}-{i}", u) for i, u in enumerate(units)]) for b, units in enumerate(BATCH_UNITS)
]
ROOTS = [tree.root for tree in BATCH_TREES]

Pair = tuple[int, int]  # (pool index, node slot)
BatchId = tuple[int, int, int]  # (pool index, node slot, index into BATCH_TREES)


# --- the model ---------------------------------------------------------------------------------------------
@dataclass
class ProviderState:
    wallet: int
    active: int = 0
    unbonding: int = 0
    locked: int = 0
    release_at: int = 0


@dataclass
class LockState:
    amount: int
    release_at: int = 0
    member: bool = True


@dataclass
class BatchState:
    total: int  # declared at submission
    submitted_at: int
    status: BatchStatus = BatchStatus.PENDING
    refused: set[int] = field(default_factory=set)  # leaf indexes
    refused_units: int = 0  # at most `total`

    @property
    def payable(self) -> int:
        return self.total - self.refused_units


@dataclass
class Model:
    """What the contracts should hold. Each operation returns the custom error it must revert with, or None
    after applying its effects; a reverting operation changes nothing."""

    now: int
    providers: list[ProviderState]
    node_provider: list[int | None]  # provider index of each node slot; None for an unused slot (never bound)
    funder_wallet: int
    escrow: list[int] = field(default_factory=lambda: [0] * len(POOLS))
    members: set[Pair] = field(default_factory=set)
    ejected: set[Pair] = field(default_factory=set)  # by the owner or by an invalidation
    voided: set[Pair] = field(default_factory=set)  # ejected by an invalidation: pending batches never paid
    locks: dict[Pair, LockState] = field(default_factory=dict)  # open locks only
    batches: dict[BatchId, BatchState] = field(default_factory=dict)
    slashed: dict[Pair, int] = field(default_factory=dict)
    burned: int = 0

    def stake(self, p: int, amount: int) -> str | None:
        s = self.providers[p]
        if amount == 0:
            return "ZeroAmount"
        if s.wallet < amount:
            return "ERC20InsufficientBalance"
        s.wallet -= amount
        s.active += amount
        return None

    def request_unstake(self, p: int, amount: int) -> str | None:
        s = self.providers[p]
        if amount == 0:
            return "ZeroAmount"
        if s.active < s.locked + amount:
            return "InsufficientActiveStake"
        s.active -= amount
        s.unbonding += amount
        s.release_at = self.now + UNBONDING_PERIOD  # all unbonding stake waits for the latest request
        return None

    def withdraw(self, p: int) -> str | None:
        s = self.providers[p]
        if s.unbonding == 0:
            return "NothingToWithdraw"
        if self.now < s.release_at:
            return "StillUnbonding"
        s.wallet += s.unbonding
        s.unbonding = s.release_at = 0
        return None

    def join(self, pair: Pair) -> str | None:
        if pair in self.ejected:
            return "EjectedFromPool"
        if pair in self.members:
            return "AlreadyMember"
        p = self.node_provider[pair[1]]
        if p is None:
            return "NodeNotActive"
        s, lock = self.providers[p], self.locks.get(pair)
        added = max(POOLS[pair[0]].min_stake - (lock.amount if lock else 0), 0)  # a held lock is reused
        if s.active < s.locked + added:
            return "InsufficientActiveStake"
        s.locked += added
        if lock is None:
            self.locks[pair] = LockState(POOLS[pair[0]].min_stake)
        else:
            lock.amount += added
            lock.member, lock.release_at = True, 0
        self.members.add(pair)
        return None

    def _end_membership(self, pair: Pair) -> None:
        """The lock stays held one window: until the last submission's window has closed."""
        self.members.remove(pair)
        lock = self.locks[pair]
        lock.member, lock.release_at = False, self.now + POOLS[pair[0]].window

    def leave(self, pair: Pair) -> str | None:
        if pair not in self.members:
            return "NotMember"
        self._end_membership(pair)
        return None

    def eject(self, pair: Pair, by_owner: bool) -> str | None:
        if not by_owner:
            return "NotAllowedToEject"
        if pair in self.members:
            self._end_membership(pair)
        self.ejected.add(pair)  # voids nothing, and never undoes an ejection by invalidation
        return None

    def release(self, pair: Pair) -> str | None:
        lock = self.locks.get(pair)
        if lock is None:
            return "NotLocked"
        if lock.member or self.now < lock.release_at:
            return "LockHeld"
        p = self.node_provider[pair[1]]
        assert p is not None
        self.providers[p].locked -= lock.amount
        del self.locks[pair]
        return None

    def _slash(self, pair: Pair) -> int:
        """An invalidation's effects on the node: its lock slashed (at most what it holds), ejected, voided."""
        terms, lock = POOLS[pair[0]], self.locks.get(pair)
        assert lock is not None, f"a batch of {pair} is inside its window without a lock behind it"
        slashed = min(terms.slash, lock.amount)
        p = self.node_provider[pair[1]]
        assert p is not None
        s = self.providers[p]
        lock.amount -= slashed
        s.locked -= slashed
        s.active -= slashed
        self.burned += slashed
        self.slashed[pair] = self.slashed.get(pair, 0) + slashed
        if pair in self.members:
            self._end_membership(pair)
        self.ejected.add(pair)
        self.voided.add(pair)
        return slashed

    def submit_batch(self, pair: Pair, b: int, total: int) -> str | None:
        if pair not in self.members:
            return "NotPoolMember"
        if total > BATCH_TREES[b].count * POOLS[pair[0]].max_units:
            return "UnitsOutOfRange"
        if (*pair, b) in self.batches:
            return "BatchExists"
        self.batches[(*pair, b)] = BatchState(total, self.now)
        return None

    def challenge_batch(
        self, batch_id: BatchId, index: int, spoil: str | None, by_validator: bool, reason: int, *, kind: str
    ) -> tuple[str | None, int]:
        """The expected error of `invalidateBatch` (kind "invalidate") or `refuseLeaf` ("refuse") of leaf `index`
        with a proof `spoil`t or not, or of `invalidateUnavailableBatch` ("unavailable": no reason, no leaf, no
        proof), and on success the amount slashed (0 for a refusal)."""
        proven = kind != "unavailable"
        if proven and not 0 < reason <= MAX_REASON:
            return "InvalidReason", 0
        batch = self.batches.get(batch_id)
        if batch is None:
            return "BatchNotFound", 0
        if batch.status != BatchStatus.PENDING:
            return "BatchNotPending", 0
        if not by_validator:
            return "NotValidator", 0
        if self.now >= batch.submitted_at + POOLS[batch_id[0]].window:
            return "BatchChallengeWindowClosed", 0
        spoiled = {"outside": "LeafOutOfRange", "short": "ProofLengthMismatch", "wrong": "InvalidProof"}
        if proven and spoil in spoiled:
            return spoiled[spoil], 0
        if kind != "refuse":
            batch.status = BatchStatus.INVALIDATED
            return None, self._slash((batch_id[0], batch_id[1]))
        if index in batch.refused:
            return "LeafAlreadyRefused", 0
        batch.refused.add(index)
        leaf_units = BATCH_TREES[batch_id[2]].leaves[index].units
        batch.refused_units = min(batch.refused_units + leaf_units, batch.total)
        return None, 0

    def claim_batches(self, pair: Pair, bs: Sequence[int]) -> tuple[str | None, int]:
        """The expected error, and on success the amount paid to the node's provider."""
        if not bs:
            return "EmptyBatch", 0
        if pair in self.voided:
            return "NodeEjected", 0
        terms, units, seen = POOLS[pair[0]], 0, set()
        for b in bs:  # the contract's loop, in its order of checks
            batch = self.batches.get((*pair, b))
            if batch is None:
                return "BatchNotFound", 0
            if batch.status != BatchStatus.PENDING or b in seen:
                return "BatchNotPending", 0
            if self.now < batch.submitted_at + terms.window:
                return "BatchChallengeWindowOpen", 0
            units += batch.payable
            seen.add(b)
        amount = units * terms.reward
        if amount > self.escrow[pair[0]]:
            return "InsufficientEscrow", 0
        for b in bs:
            self.batches[(*pair, b)].status = BatchStatus.CLAIMED
        self.escrow[pair[0]] -= amount
        p = self.node_provider[pair[1]]
        assert p is not None
        self.providers[p].wallet += amount
        return None, amount

    def fund(self, pool: int, amount: int) -> str | None:
        if amount == 0:
            return "ZeroAmount"
        if self.funder_wallet < amount:
            return "ERC20InsufficientBalance"
        self.funder_wallet -= amount
        self.escrow[pool] += amount
        return None

    def pending_batches(self, where: Callable[[BatchId, BatchState], bool] = lambda i, b: True) -> list[BatchId]:
        """Pending batches, oldest first."""
        found = [i for i, b in self.batches.items() if b.status == BatchStatus.PENDING and where(i, b)]
        return sorted(found, key=lambda i: (self.batches[i].submitted_at, i))

    def batch_window_open(self, batch_id: BatchId) -> bool:
        return self.now < self.batches[batch_id].submitted_at + POOLS[batch_id[0]].window

    def ejection(self, pair: Pair) -> Ejection:
        if pair in self.voided:
            return Ejection.BY_INVALIDATION
        return Ejection.BY_OWNER if pair in self.ejected else Ejection.NONE


# --- the operations ----------------------------------------------------------------------------------------
# Operations name accounts, memberships and batches by index or by a selector that resolves against the model
# when the step runs (deterministically, so shrinking still works), so that most of them reach the interesting
# checks: ("member", pool, i) is the i-th current membership of any pool, ("ejected", ...) the i-th ejection,
# ("held", ...) the i-th lock held past its membership, ("left", ...) such a lock of a node not ejected, and
# ("slot", pool, i) node slot i in that pool. A challenge targets the newest pending batch, the newest one still
# inside its window, one of an already ejected node (a second slash in the same pool), one with a refused leaf
# (an invalidation over a refusal, or a second refusal of that leaf), an invalidated or claimed one, or any
# (pool, slot, batch); claim_batches claims a node's oldest claimable batches, optionally spoiled by another node's
# root, a settled or an unripe batch, a repeated root, or aimed at an ejected node; claim_listed claims any list of
# any node's roots.
provider_choice = st.tuples(st.sampled_from(["index", "index", "unbonding"]), st.integers(0, len(PROVIDERS) - 1))
pool_index = st.sampled_from([0, 0, 1, 2])
slot_index = st.integers(0, len(NODE_KEYS) - 1)
batch_index = st.integers(0, len(BATCH_TREES) - 1)


def pick(*hows: str, pools: st.SearchStrategy[int] = pool_index) -> st.SearchStrategy[tuple[str, int, int]]:
    return st.tuples(st.sampled_from(hows), pools, slot_index)


submitter = pick("member", "member", "member", "member", "member", "slot", "ejected")
joiner = pick("slot", "slot", "slot", "left", "ejected", pools=st.sampled_from([0, 1, 1, 1, 2]))  # all start in 0, 2
declared = st.sampled_from(["leaves"] * 8 + ["half", "double", "cap", "over"])
batch_target = st.tuples(
    st.sampled_from(["newest", "open", "open", "open", "ejected", "ejected", "refused", "refused", "settled", "given"]),
    pool_index,
    slot_index,
    batch_index,
)
leaf_choice = st.tuples(
    st.integers(0, max(tree.count for tree in BATCH_TREES) - 1),  # the leaf, modulo the batch's count
    st.sampled_from([None] * 8 + ["refused", "refused", "outside", "short", "wrong"]),  # "refused": one refused before
)
reason = st.sampled_from([*range(1, MAX_REASON + 1)] * 2 + [0, MAX_REASON + 1])
spoiler = st.sampled_from([None, None, None, "other_node", "settled", "unripe", "repeat", "ejected"])
tokens = st.sampled_from([0, 1, 10, 40, 60, 100, 150])
seconds = st.sampled_from([1, 60, 600, 600, 3599, 3600, 3601, 7200, 86_400, UNBONDING_PERIOD])


def weighted(*choices: tuple[int, st.SearchStrategy[tuple[Any, ...]]]) -> st.SearchStrategy[tuple[Any, ...]]:
    """Picks a strategy with probability proportional to its weight (`one_of` would ignore repeats)."""
    picks = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(picks) - 1).flatmap(lambda i: picks[i])


operation = weighted(
    (1, st.tuples(st.just("stake"), provider_choice, tokens)),
    (2, st.tuples(st.just("unstake"), provider_choice, tokens)),
    (2, st.tuples(st.just("withdraw"), provider_choice)),
    (2, st.tuples(st.just("join"), joiner)),
    (1, st.tuples(st.just("leave"), pick("member", "member", "slot"))),
    (1, st.tuples(st.just("eject"), pick("member", "member", "slot"), st.sampled_from([True] * 5 + [False]))),
    (1, st.tuples(st.just("release"), pick("held", "held", "held", "member", "slot"))),
    (8, st.tuples(st.just("submit_batch"), submitter, batch_index, declared)),
    (
        12,
        st.tuples(
            st.just("challenge_batch"),
            batch_target,
            leaf_choice,
            st.sampled_from([True] * 7 + [False]),
            reason,
            # refuse (no slash) twice as often as invalidate with a proof, or as invalidate a batch whose leaf list
            # was never made available (no proof)
            st.sampled_from(["invalidate", "refuse", "refuse", "unavailable"]),
        ),
    ),
    (4, st.tuples(st.just("claim_batches"), st.integers(0, 5), st.integers(1, 3), spoiler)),
    (1, st.tuples(st.just("claim_listed"), pool_index, slot_index, st.lists(batch_index, max_size=3))),
    (1, st.tuples(st.just("fund"), pool_index, st.sampled_from([0, 1, 5, 20]))),
    (3, st.tuples(st.just("advance"), seconds)),
    # to a pending batch's window end, a provider's release time or a held lock's release, give or take a second
    (
        3,
        st.tuples(
            st.just("advance_to"),
            st.sampled_from(["window", "release", "lock"]),
            st.integers(0, 5),
            st.sampled_from([-1, 0, 1]),
        ),
    ),
)


# --- reading the chain in one round trip ---------------------------------------------------------------------
class RawReader:
    """Many `eth_call`s in one JSON-RPC batch, each returning 32-byte words; web3's per-call overhead would
    make the per-step invariant checks dominate the test's runtime."""

    def __init__(self, rpc_url: str) -> None:
        self.url = rpc_url
        self.session = requests.Session()

    def words(self, calls: Sequence[tuple[str, str]]) -> list[list[int]]:
        body: Any = [
            {"jsonrpc": "2.0", "id": i, "method": "eth_call", "params": [{"to": to, "data": data}, "latest"]}
            for i, (to, data) in enumerate(calls)
        ]
        replies = sorted(self.session.post(self.url, json=body, timeout=10).json(), key=lambda r: r["id"])
        out = []
        for reply, (to, data) in zip(replies, calls, strict=True):
            assert "result" in reply, f"eth_call to {to} with {data[:10]} failed: {reply.get('error')}"
            raw = bytes.fromhex(reply["result"][2:])
            out.append([int.from_bytes(raw[i : i + 32], "big") for i in range(0, len(raw), 32)])
        return out


@dataclass
class Totals:
    """Cumulative flows, summed from the receipts' events (not from the model)."""

    funded: int = 0
    slashed: int = 0  # BatchInvalidated.slashed
    paid: int = 0
    slashed_by: dict[Pair, int] = field(default_factory=dict)  # registry Slashed events, per (pool, node)
    ejected: set[Pair] = field(default_factory=set)  # NodeEjected events
    voided: set[Pair] = field(default_factory=set)  # NodeEjected events of kind ByInvalidation
    declared: dict[BatchId, int] = field(default_factory=dict)  # BatchSubmitted.totalUnits
    refused_units: dict[BatchId, int] = field(default_factory=dict)  # LeafRefused.units, summed per batch
    refused_leaves: set[tuple[BatchId, int]] = field(default_factory=set)  # LeafRefused events
    invalidated_batches: set[BatchId] = field(default_factory=set)  # BatchInvalidated events
    claimed_batches: set[BatchId] = field(default_factory=set)  # BatchesClaimed events


ACCOUNTS = (OWNER, *PROVIDERS, FUNDER, VALIDATOR)


@dataclass
class Base:
    """The state every example starts from (the pools, their validators, minted and approved wallets, node keys
    with gas), restored by reverting to `snapshot`: setting it up for each example would double the runtime."""

    snapshot: str
    pool_ids: list[int]

    def restore(self, chain: LocalChain) -> None:
        chain.revert(self.snapshot)  # consumes the snapshot, so take it again
        self.snapshot = chain.snapshot()


@pytest.fixture
def base(chain: LocalChain, ledger_for: Callable[[int], Ledger]) -> Base:
    accounts = {i: ledger_for(i) for i in ACCOUNTS}
    owner, funder = accounts[OWNER], accounts[FUNDER]
    pool_ids = [
        make_pool(
            accounts[t.owner],
            min_stake_per_node=t.min_stake,
            challenge_window=t.window,
            reward_per_unit=t.reward,
            slash_amount=t.slash,
            max_units_per_key=t.max_units,
        )
        for t in POOLS
    ]
    for pool_id, t in zip(pool_ids, POOLS, strict=True):
        accounts[t.owner].set_validator(pool_id, accounts[t.validator].address)
    owner.mint(funder.address, WALLET)
    funder.approve(funder.work.address, MAX_ALLOWANCE)
    for i in PROVIDERS:
        owner.mint(accounts[i].address, WALLET)
        accounts[i].approve(owner.registry.address, MAX_ALLOWANCE)
    for key in NODE_KEYS:
        chain.w3.provider.make_request("anvil_setBalance", [key.address, hex(10**20)])  # type: ignore[arg-type]
    return Base(chain.snapshot(), pool_ids)


class Harness:
    """Sets up one example's chain state from `Base`, applies operations to chain and model, and checks
    invariants."""

    def __init__(
        self,
        chain: LocalChain,
        ledger_for: Callable[[int], Ledger],
        pool_ids: Sequence[int],
        node_counts: Sequence[int],
        extra: int,
    ) -> None:
        self.chain = chain
        self.accounts = {i: ledger_for(i) for i in ACCOUNTS}  # one client per account: each keeps its nonce
        self.owner, self.funder = self.accounts[OWNER], self.accounts[FUNDER]
        self.providers = [self.accounts[i] for i in PROVIDERS]
        self.pool_ids = list(pool_ids)

        self.nodes: list[Ledger] = []
        node_provider: list[int | None] = []
        for p, provider in enumerate(self.providers):
            for j in range(NODES_PER_PROVIDER):
                key = NODE_KEYS[p * NODES_PER_PROVIDER + j]
                if j < node_counts[p]:
                    stake_tokens = (node_counts[p] * START_LOCKS + extra) // TOKEN if j == 0 else 0
                    node = onboard(self.owner, provider, key, self.pool_ids[0], stake_tokens=stake_tokens)
                    node.join(self.pool_ids[2])
                    self.nodes.append(node)
                    node_provider.append(p)
                else:
                    self.nodes.append(provider.as_account(key))
                    node_provider.append(None)
        self.slot_of = {node.address: n for n, node in enumerate(self.nodes)}
        self.pool_of = {pool_id: i for i, pool_id in enumerate(self.pool_ids)}

        stakes = [ProviderState(WALLET, active=n * START_LOCKS + extra, locked=n * START_LOCKS) for n in node_counts]
        self.model = Model(self.owner.timestamp(), stakes, node_provider, funder_wallet=WALLET)
        for n, owner in enumerate(node_provider):
            if owner is not None:
                for pool in START_POOLS:
                    self.model.members.add((pool, n))
                    self.model.locks[(pool, n)] = LockState(POOLS[pool].min_stake)
        self.totals = Totals()
        self.reader = RawReader(chain.rpc_url)
        self.log: list[str] = []
        self._prepare_reads()

    # --- one operation ---------------------------------------------------------------------------------------
    def step(self, op: tuple[Any, ...]) -> None:
        kind, *args = op
        getattr(self, f"do_{kind}")(*args)
        self.check_invariants()

    def send(self, expected: str | None, action: Callable[[], TxReceipt], what: str) -> TxReceipt | None:
        """Runs `action` mined at the model's clock and checks it reverts exactly when the model says so."""
        self.chain.set_next_timestamp(self.model.now)
        try:
            receipt = action()
        except ContractRevert as exc:
            self.log.append(f"{what} -> {exc.name}")
            event(f"{what.split('(')[0]} -> {exc.name}")  # shown by --hypothesis-show-statistics
            assert exc.name == expected, f"{what}: chain reverted {exc}, model expected {expected or 'success'}"
            return None
        self.log.append(f"{what} -> ok")
        event(f"{what.split('(')[0]} -> ok")
        assert expected is None, f"{what}: chain succeeded, model expected {expected}"
        block = self.chain.w3.eth.get_block(receipt["blockNumber"])
        assert block["timestamp"] == self.model.now, "the harness lost control of block time"
        self._account(receipt)
        return receipt

    def _account(self, receipt: TxReceipt) -> None:
        """Adds the receipt's flows to the totals and checks, from the events alone, that no node ejected by an
        invalidation is paid, that nothing in an invalidated batch is paid, that a claim pays each batch its declared
        total less its refused leaves' units (never below zero), and that a refusal moves no token."""
        work, registry, pools, t = (
            self.owner.work.events,
            self.owner.registry.events,
            self.owner.pools.events,
            self.totals,
        )
        t.funded += sum(e["amount"] for e in events(work.RewardsFunded(), receipt))
        for e in events(work.BatchSubmitted(), receipt):
            batch_id = self.batch_id(e)
            assert batch_id not in t.declared, f"batch {batch_id} submitted twice"
            t.declared[batch_id] = e["totalUnits"]
        for e in events(work.BatchInvalidated(), receipt):
            batch_id = self.batch_id(e)
            assert batch_id not in t.invalidated_batches, f"batch {batch_id} invalidated twice"
            assert batch_id not in t.claimed_batches, f"batch {batch_id} invalidated after its claim"
            t.invalidated_batches.add(batch_id)
            t.slashed += e["slashed"]
        for e in events(registry.Slashed(), receipt):
            pair = (self.pool_of[e["poolId"]], self.slot_of[e["node"]])
            p = self.model.node_provider[pair[1]]
            assert p is not None and e["provider"] == self.providers[p].address, f"slashed {e} of the wrong provider"
            t.slashed_by[pair] = t.slashed_by.get(pair, 0) + e["amount"]
        for e in events(work.BatchesClaimed(), receipt):
            pair = (self.pool_of[e["poolId"]], self.slot_of[e["node"]])
            assert pair not in t.voided, f"node {pair[1]} was paid in pool {pair[0]} after an invalidation ejected it"
            claimed = {(*pair, ROOTS.index(root)) for root in e["roots"]}
            assert len(claimed) == len(e["roots"]), f"a batch paid twice in one claim: {e}"
            assert not claimed & t.invalidated_batches, f"paid an invalidated batch: {e}"
            assert not claimed & t.claimed_batches, f"paid a batch twice: {e}"
            units = sum(max(t.declared[b] - t.refused_units.get(b, 0), 0) for b in claimed)
            assert e["amount"] == units * POOLS[pair[0]].reward, f"claimed {e['amount']} for {units} payable units"
            t.claimed_batches |= claimed
            t.paid += e["amount"]
        for e in events(pools.NodeEjected(), receipt):
            pair = (self.pool_of[e["poolId"]], self.slot_of[e["node"]])
            t.ejected.add(pair)
            if e["kind"] == Ejection.BY_INVALIDATION:
                t.voided.add(pair)
            else:
                assert pair not in t.voided, f"an owner's ejection undid the invalidation's of {pair}"
        leaves = events(work.LeafRefused(), receipt)
        for e in leaves:
            batch_id = self.batch_id(e)
            leaf = (batch_id, e["leafIndex"])
            assert leaf not in t.refused_leaves, f"leaf {leaf} refused twice"
            assert batch_id not in t.invalidated_batches | t.claimed_batches, f"leaf {leaf} refused in a settled batch"
            t.refused_leaves.add(leaf)
            t.refused_units[batch_id] = t.refused_units.get(batch_id, 0) + e["units"]
        if leaves:  # no stake, escrow or membership moves
            assert not any(events(c, receipt) for c in (registry.Slashed(), pools.NodeEjected(), work.BatchesClaimed()))

    # selectors
    def provider(self, choice: tuple[str, int]) -> int:
        how, p = choice
        unbonding = [q for q, s in enumerate(self.model.providers) if s.unbonding > 0]
        return unbonding[p % len(unbonding)] if how == "unbonding" and unbonding else p

    def pair(self, choice: tuple[str, int, int]) -> Pair:
        how, pool, i = choice
        m = self.model
        found: list[Pair] = []
        if how == "member":
            found = sorted(m.members)
        elif how == "ejected":
            found = sorted(m.ejected)
        elif how == "held":
            found = sorted(pair for pair, lock in m.locks.items() if not lock.member)
        elif how == "left":
            found = sorted(pair for pair, lock in m.locks.items() if not lock.member and pair not in m.ejected)
        return found[i % len(found)] if found else (pool, i)

    def pid(self, pool: int) -> int:
        return self.pool_ids[pool]

    def batch_id(self, e: Any) -> BatchId:
        """The batch an event names by (poolId, node, root)."""
        return (self.pool_of[e["poolId"]], self.slot_of[e["node"]], ROOTS.index(e["root"]))

    # operations
    def do_stake(self, choice: tuple[str, int], amount_tokens: int) -> None:
        p, amount = self.provider(choice), amount_tokens * TOKEN
        self.send(self.model.stake(p, amount), lambda: self.providers[p].stake(amount), f"stake({p}, {amount_tokens})")

    def do_unstake(self, choice: tuple[str, int], amount_tokens: int) -> None:
        self._unstake(self.provider(choice), amount_tokens * TOKEN)

    def _unstake(self, p: int, amount: int) -> None:
        expected = self.model.request_unstake(p, amount)
        self.send(expected, lambda: self.providers[p].request_unstake(amount), f"requestUnstake({p}, {amount})")

    def do_withdraw(self, choice: tuple[str, int]) -> None:
        p = self.provider(choice)
        provider = self.providers[p]
        before = provider.stake_of(provider.address)  # from the chain, before the model moves
        receipt = self.send(self.model.withdraw(p), provider.withdraw, f"withdraw({p})")
        if receipt is not None:
            after = provider.stake_of(provider.address)
            assert self.model.now >= before.release_at, f"stake left at {self.model.now}, before {before.release_at}"
            (withdrawn,) = events(provider.registry.events.Withdrawn(), receipt)
            assert withdrawn["amount"] == before.unbonding, "a withdrawal took more than the unbonding stake"
            assert (after.active, after.locked) == (before.active, before.locked), "a withdrawal took active stake"

    def do_join(self, choice: tuple[str, int, int]) -> None:
        pool, n = pair = self.pair(choice)
        self.send(self.model.join(pair), lambda: self.nodes[n].join(self.pid(pool)), f"join({pool}, node {n})")

    def do_leave(self, choice: tuple[str, int, int]) -> None:
        self._leave(self.pair(choice))

    def _leave(self, pair: Pair) -> None:
        pool, n = pair
        self.send(self.model.leave(pair), lambda: self.nodes[n].leave(self.pid(pool)), f"leave({pool}, node {n})")

    def do_eject(self, choice: tuple[str, int, int], by_owner: bool) -> None:
        pool, n = pair = self.pair(choice)
        sender = self.accounts[POOLS[pool].owner] if by_owner else self.funder
        expected = self.model.eject(pair, by_owner)
        self.send(expected, lambda: sender.eject(self.pid(pool), self.nodes[n].address), f"eject({pool}, node {n})")

    def do_release(self, choice: tuple[str, int, int]) -> None:
        self._release(self.pair(choice))

    def _release(self, pair: Pair) -> None:
        pool, n = pair
        action = lambda: self.funder.release_stake(self.pid(pool), self.nodes[n].address)  # noqa: E731 - anyone may
        self.send(self.model.release(pair), action, f"releaseStake({pool}, node {n})")

    @staticmethod
    def declared_total(tree: BatchTree, how: str, cap: int) -> int:
        """What a node declares as `tree`'s total in a pool of `cap` units a file: its leaves' units, half of them (a
        batch whose leaves claim more than it: refusing them takes it to zero, not below), twice them (an overclaim
        only a validator can tell), count x cap (the most a batch may claim) or one unit more."""
        return {
            "leaves": tree.total_units,
            "half": max(tree.total_units // 2, 1),
            "double": 2 * tree.total_units,
            "cap": tree.count * cap,
            "over": tree.count * cap + 1,
        }[how]

    def do_submit_batch(self, choice: tuple[str, int, int], b: int, declared: str) -> None:
        pool, n = pair = self.pair(choice)
        tree, node = BATCH_TREES[b], self.nodes[n]
        total = self.declared_total(tree, declared, POOLS[pool].max_units)
        action = lambda: node.submit_batch(self.pid(pool), tree.root, tree.count, total)  # noqa: E731
        what = f"submitBatch({pool}, node {n}, batch {b}, {total} of {tree.total_units} units)"
        self.send(self.model.submit_batch(pair, b, total), action, what)
        self.check_batches([(pool, n, b)])

    def batch_target(self, target: tuple[str, int, int, int]) -> BatchId:
        m = self.model
        how, *given = target
        if how == "given":
            return (given[0], given[1], given[2])
        if how == "settled":  # invalidated or claimed: BatchNotPending, the second slash a batch never takes
            settled = sorted(i for i, b in m.batches.items() if b.status != BatchStatus.PENDING)
            if settled:
                return settled[given[2] % len(settled)]
        candidates = (
            {
                "newest": m.pending_batches(),
                "open": m.pending_batches(lambda i, b: m.batch_window_open(i)),
                "ejected": m.pending_batches(lambda i, b: (i[0], i[1]) in m.ejected and m.batch_window_open(i)),
                "refused": m.pending_batches(lambda i, b: bool(b.refused) and m.batch_window_open(i)),
                "settled": [],  # none settled yet
            }[how]
            or m.pending_batches(lambda i, b: m.batch_window_open(i))
            or m.pending_batches()
        )
        return candidates[-1] if candidates else (given[0], given[1], given[2])  # none pending: BatchNotFound

    def do_challenge_batch(
        self,
        target: tuple[str, int, int, int],
        leaf: tuple[int, str | None],
        by_validator: bool,
        reason: int,
        kind: str,
    ) -> None:
        pool, n, b = batch_id = self.batch_target(target)
        tree, (pick_leaf, spoil) = BATCH_TREES[b], leaf
        index = pick_leaf % tree.count
        state = self.model.batches.get(batch_id)
        if spoil == "refused":  # a leaf refused before, if there is one: a second refusal, or an invalidation over it
            index, spoil = (min(state.refused) if state and state.refused else index), None
        proof = self.spoiled(tree.proof(index), spoil)
        before = self.batch_statuses([batch_id])
        expected, slashed = self.model.challenge_batch(batch_id, index, spoil, by_validator, reason, kind=kind)
        sender = self.accounts[POOLS[pool].validator] if by_validator else self.funder
        node = self.nodes[n].address
        if kind == "unavailable":
            name, what = "invalidateUnavailableBatch", f"({pool}, node {n}, batch {b}, validator={by_validator})"
            action = lambda: sender.invalidate_unavailable_batch(self.pid(pool), node, tree.root)  # noqa: E731
        else:
            name, call = (
                ("refuseLeaf", sender.refuse_leaf) if kind == "refuse" else ("invalidateBatch", sender.invalidate_batch)
            )
            what = f"({pool}, node {n}, batch {b}, leaf {proof.index}, {spoil}, validator={by_validator}, {reason})"
            action = lambda: call(self.pid(pool), node, tree.root, proof, reason)  # noqa: E731
        receipt = self.send(expected, action, name + what)
        if receipt is not None:
            assert before[0] == BatchStatus.PENDING, f"{name} of batch {batch_id} that was {before[0].name}"
            if kind != "refuse":
                (invalidated,) = events(self.owner.work.events.BatchInvalidated(), receipt)
                shown = (index, proof.leaf.work_key, reason) if kind == "invalidate" else (NO_LEAF, bytes(32), 8)
                assert invalidated["slashed"] == slashed
                assert (invalidated["leafIndex"], invalidated["workKey"], invalidated["reason"]) == shown
        self.check_batches([batch_id])

    @staticmethod
    def spoiled(proof: LeafProof, spoil: str | None) -> LeafProof:
        """`proof` made wrong: its index outside the tree (aliasing the same path), a sibling short (one extra for
        a batch of one), or its units off by one."""
        if spoil == "outside":  # the proof reads only the index's low bits: the same path, under an index >= count
            return LeafProof(proof.index + (1 << len(proof.siblings)), proof.leaf, proof.siblings)
        if spoil == "short":
            return LeafProof(proof.index, proof.leaf, proof.siblings[:-1] if proof.siblings else (bytes(32),))
        if spoil == "wrong":
            return LeafProof(proof.index, Leaf(proof.leaf.work_key, proof.leaf.units + 1), proof.siblings)
        return proof

    def do_claim_batches(self, index: int, count: int, spoiler: str | None) -> None:
        """Claims up to `count` of the oldest claimable batches of one node (of its pending ones, when no node has
        one claimable), then adds the spoiler, if any."""
        m = self.model
        ready = m.pending_batches(lambda i, b: not m.batch_window_open(i))
        # none ready: a node's batches still in their window (BatchChallengeWindowOpen)
        pairs = sorted({(pool, n) for pool, n, _ in ready or m.pending_batches()})
        if spoiler == "ejected":
            pairs = sorted({(pool, n) for pool, n, _ in m.pending_batches() if (pool, n) in m.ejected}) or pairs
        if not pairs:
            return
        pair = pairs[index % len(pairs)]
        own = [b for pool, n, b in m.pending_batches() if (pool, n) == pair]
        bs = [b for pool, n, b in ready if (pool, n) == pair][:count] or own[:count]
        if spoiler == "other_node":  # another node's batch: under this node, that root is its own record or none
            bs += [b for pool, n, b in m.pending_batches() if (pool, n) != pair][:1]
        elif spoiler == "settled":
            settled = (
                b for (pool, n, b), s in m.batches.items() if (pool, n) == pair and s.status != BatchStatus.PENDING
            )
            bs += sorted(settled)[:1]
        elif spoiler == "unripe":
            bs += [b for pool, n, b in m.pending_batches(lambda i, s: m.batch_window_open(i)) if (pool, n) == pair][:1]
        elif spoiler == "repeat" and bs:
            bs.append(bs[0])
        self._claim_batches(pair, bs)

    def do_claim_listed(self, pool: int, n: int, bs: list[int]) -> None:
        self._claim_batches((pool, n), bs)

    def _claim_batches(self, pair: Pair, bs: list[int]) -> None:
        pool, n = pair
        expected, amount = self.model.claim_batches(pair, bs)
        node = self.nodes[n].address
        action = lambda: self.funder.claim_batches(self.pid(pool), node, [ROOTS[b] for b in bs])  # noqa: E731
        receipt = self.send(expected, action, f"claimBatches({pool}, node {n}, {bs})")
        if receipt is not None:
            (claimed,) = events(self.owner.work.events.BatchesClaimed(), receipt)
            assert claimed["amount"] == amount
        self.check_batches([(pool, n, b) for b in bs])

    def do_fund(self, pool: int, amount_tokens: int) -> None:
        amount = amount_tokens * TOKEN
        expected = self.model.fund(pool, amount)
        self.send(expected, lambda: self.funder.fund_rewards(self.pid(pool), amount), f"fund({pool}, {amount_tokens})")

    def do_advance(self, delta: int) -> None:
        self._move_clock(self.model.now + delta)

    def do_advance_to(self, what: str, index: int, offset: int) -> None:
        m = self.model
        if what == "window":
            ends = sorted(m.batches[i].submitted_at + POOLS[i[0]].window for i in m.pending_batches())
        elif what == "release":
            ends = sorted(s.release_at for s in m.providers if s.unbonding > 0)
        else:
            ends = sorted(lock.release_at for lock in m.locks.values() if not lock.member)
        if ends and ends[index % len(ends)] + offset > m.now:
            self._move_clock(ends[index % len(ends)] + offset)

    def _move_clock(self, timestamp: int) -> None:
        """Mines an empty block at `timestamp`: later transactions are estimated and mined at that time."""
        self.log.append(f"time +{timestamp - self.model.now}")
        self.model.now = timestamp
        self.chain.set_next_timestamp(timestamp)
        self.chain.mine()

    def settle(self, unlock: bool) -> None:
        """Past every window, claims each pending batch on its own (a voided node's fail); with `unlock`, every
        node leaves, every lock is released after its window and all stake is unstaked, so that only the burned
        tokens remain in the registry; then each provider withdraws what unbonds."""
        m = self.model
        self._move_clock(m.now + LONGEST_WINDOW)
        self.check_invariants()
        for pool, n, b in m.pending_batches():
            self._claim_batches((pool, n), [b])
            self.check_invariants()
        for pool, n, b in m.pending_batches():  # no earned reward is lost to an owner's ejection
            short = m.batches[(pool, n, b)].payable * POOLS[pool].reward > m.escrow[pool]
            assert (pool, n) in m.voided or short, f"batch {(pool, n, b)} left unpaid; {' | '.join(self.log)}"
        if unlock:
            for pair in sorted(m.members):
                self._leave(pair)
                self.check_invariants()
            self._move_clock(m.now + LONGEST_WINDOW)
            for pair in sorted(m.locks):
                self._release(pair)
                self.check_invariants()
            for p, s in enumerate(m.providers):
                if s.active:
                    self._unstake(p, s.active)
                    self.check_invariants()
        self._move_clock(m.now + UNBONDING_PERIOD)
        for p in range(len(PROVIDERS)):
            self.do_withdraw(("index", p))
            self.check_invariants()
        if unlock:
            assert all((s.active, s.unbonding, s.locked) == (0, 0, 0) for s in m.providers), m.providers
            registry = self.owner.registry.address
            assert self.owner.balance_of(registry) == self.owner.burned() == m.burned, " | ".join(self.log)

    # --- checks ----------------------------------------------------------------------------------------------
    def _prepare_reads(self) -> None:
        token, registry, work, pools = self.owner.token, self.owner.registry, self.owner.work, self.owner.pools
        self.holders = [
            *(ledger.address for ledger in self.accounts.values()),
            *(n.address for n in self.nodes),
            registry.address,
            work.address,
        ]
        calls = [(token.address, token.encode_abi("totalSupply", []))]
        calls += [(token.address, token.encode_abi("balanceOf", [a])) for a in self.holders]
        calls.append((registry.address, registry.encode_abi("burned", [])))
        for p in self.providers:
            calls.append((registry.address, registry.encode_abi("stakeOf", [p.address])))
            calls.append((registry.address, registry.encode_abi("lockedOf", [p.address])))
            calls.append((registry.address, registry.encode_abi("releaseAt", [p.address])))
        for pool_id in self.pool_ids:
            calls.append((work.address, work.encode_abi("escrowOf", [pool_id])))
            for n in self.nodes:
                calls.append((pools.address, pools.encode_abi("isMember", [pool_id, n.address])))
                calls.append((pools.address, pools.encode_abi("ejectionOf", [pool_id, n.address])))
                calls.append((registry.address, registry.encode_abi("lockOf", [pool_id, n.address])))
        self.invariant_calls = calls

    def check_invariants(self) -> None:
        words = iter(self.reader.words(self.invariant_calls))
        (supply,) = next(words)
        balances = {address: next(words)[0] for address in self.holders}
        (burned,) = next(words)
        stakes = [(next(words), next(words)[0], next(words)[0]) for _ in self.providers]
        escrows: list[int] = []
        memberships: dict[Pair, tuple[bool, Ejection]] = {}
        locks: dict[Pair, tuple[int, int, bool, bool]] = {}
        for pool in range(len(POOLS)):
            escrows.append(next(words)[0])
            for n in range(len(self.nodes)):
                memberships[(pool, n)] = (bool(next(words)[0]), Ejection(next(words)[0]))
                amount, release_at, member, is_open = next(words)
                locks[(pool, n)] = (amount, release_at, bool(member), bool(is_open))
        registry, work = self.owner.registry.address, self.owner.work.address
        history = " | ".join(self.log)
        m, t = self.model, self.totals

        # conservation: every token is in some account we track, the registry or the work ledger
        assert supply == sum(balances.values()), f"token supply {supply} != sum of balances; after {history}"
        staked = sum(active + unbonding for (active, unbonding), _, _ in stakes)
        assert balances[registry] == staked + burned, f"registry {balances[registry]} != stake + burned; {history}"
        assert balances[work] == sum(escrows), f"work ledger {balances[work]} != escrows {escrows}; {history}"

        # nothing slashed is ever paid out: the escrows hold what was funded less what was claimed
        assert sum(escrows) + t.paid == t.funded, f"escrows {escrows} + paid {t.paid} != funded {t.funded}; {history}"
        assert burned == t.slashed == sum(t.slashed_by.values()) == m.burned, f"burned {burned}; {history}"

        # a slash reaches only the lock in its pool: per node, at most that lock; per provider, its nodes' locks
        for (pool, n), amount in t.slashed_by.items():
            assert amount <= POOLS[pool].min_stake, f"node {n} lost {amount} in pool {pool}; {history}"
        for p in range(len(PROVIDERS)):
            for pool in range(len(POOLS)):
                nodes = [n for n, q in enumerate(m.node_provider) if q == p]
                lost = sum(t.slashed_by.get((pool, n), 0) for n in nodes)
                assert lost <= len(nodes) * POOLS[pool].min_stake, f"provider {p} lost {lost} in pool {pool}"

        # stake that backs open windows stays: locked is what the open locks hold, active covers it
        for p, ((active, _), locked, _) in enumerate(stakes):
            held = sum(locks[(pool, n)][0] for (pool, n) in locks if m.node_provider[n] == p and locks[(pool, n)][3])
            assert locked == held, f"provider {p} locked {locked}, its open locks hold {held}; {history}"
            assert active >= locked, f"provider {p} active {active} < locked {locked}; {history}"
        for batch_id in m.pending_batches(lambda i, b: m.batch_window_open(i)):
            pair = (batch_id[0], batch_id[1])
            amount, _, _, is_open = locks[pair]
            expected = POOLS[pair[0]].min_stake - t.slashed_by.get(pair, 0)
            assert is_open and amount == expected, f"open batch {batch_id} backed by lock {locks[pair]}; {history}"

        # and the chain is where the model says it is
        assert escrows == m.escrow, f"escrows {escrows}, model {m.escrow}; {history}"
        assert balances[self.funder.address] == m.funder_wallet, history
        for p, ((active, unbonding), locked, release_at) in enumerate(stakes):
            s = m.providers[p]
            chain_view = (balances[self.providers[p].address], active, unbonding, locked, release_at)
            model_view = (s.wallet, s.active, s.unbonding, s.locked, s.release_at)
            assert chain_view == model_view, f"provider {p}: chain {chain_view}, model {model_view}; {history}"
        for pair, (member, ejection) in memberships.items():
            assert (member, ejection) == (pair in m.members, m.ejection(pair)), f"membership {pair}; {history}"
            lock = m.locks.get(pair)
            model_lock = (lock.amount, lock.release_at, lock.member, True) if lock else (0, 0, False, False)
            assert locks[pair] == model_lock, f"lock {pair}: chain {locks[pair]}, model {model_lock}; {history}"
        assert t.ejected == m.ejected, f"ejections {sorted(t.ejected)}, model {sorted(m.ejected)}; {history}"
        assert t.voided == m.voided, f"voided {sorted(t.voided)}, model {sorted(m.voided)}; {history}"

    def batch_records(self, batch_ids: Sequence[BatchId]) -> list[list[int]]:
        work = self.owner.work
        calls = [
            (work.address, work.encode_abi("getBatch", [self.pid(pool), self.nodes[n].address, ROOTS[b]]))
            for pool, n, b in batch_ids
        ]
        return self.reader.words(calls) if calls else []

    def batch_statuses(self, batch_ids: Sequence[BatchId]) -> list[BatchStatus]:
        return [BatchStatus(words[5]) for words in self.batch_records(batch_ids)]

    def check_batches(self, batch_ids: Sequence[BatchId]) -> None:
        """Each batch's record as the model has it: provider, count, total, refused units, time and status, and
        which of its leaves are refused; no claim may ever pay more than a batch's units (refused <= total)."""
        history = " | ".join(self.log)
        work = self.owner.work
        for batch_id, words in zip(batch_ids, self.batch_records(batch_ids), strict=True):
            provider, count, total, refused, submitted_at, status = words
            state = self.model.batches.get(batch_id)
            if state is None:
                assert words == [0] * 6, f"batch {batch_id} exists on chain only; {history}"
                continue
            pool, n, b = batch_id
            tree, p = BATCH_TREES[b], self.model.node_provider[n]
            assert p is not None
            chain_view = (provider, count, total, refused, submitted_at, status)
            model_view = (
                int(self.providers[p].address, 16),
                tree.count,
                state.total,
                state.refused_units,
                state.submitted_at,
                state.status,
            )
            assert chain_view == model_view, f"batch {batch_id}: chain {chain_view}, model {model_view}; {history}"
            assert refused <= total
            calls = [
                (work.address, work.encode_abi("isLeafRefused", [self.pid(pool), self.nodes[n].address, ROOTS[b], i]))
                for i in range(tree.count)
            ]
            refused_leaves = {i for i, (bit,) in enumerate(self.reader.words(calls)) if bit}
            assert refused_leaves == state.refused, f"batch {batch_id} refused leaves {refused_leaves}; {history}"


@pytest.mark.slow
@pytest.mark.timeout(900)  # passing takes ~30 s; a failure's shrinking may take minutes more
@settings(
    max_examples=20,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    node_counts=st.lists(st.integers(1, NODES_PER_PROVIDER), min_size=len(PROVIDERS), max_size=len(PROVIDERS)),
    extra_tokens=st.sampled_from([0, 60, 150, 150]),
    funding=st.lists(st.sampled_from([0, 50, 50, 50]), min_size=len(POOLS), max_size=len(POOLS)),
    operations=st.lists(operation, min_size=10, max_size=25),
    unlock=st.booleans(),
)
def test_random_operations_match_the_model_and_keep_the_invariants(
    chain: LocalChain,
    ledger_for: Callable[[int], Ledger],
    base: Base,
    node_counts: list[int],
    extra_tokens: int,
    funding: list[int],
    operations: list[tuple[Any, ...]],
    unlock: bool,
) -> None:
    try:
        harness = Harness(chain, ledger_for, base.pool_ids, node_counts, extra_tokens * TOKEN)  # fresh nonces
        for pool, tokens_ in enumerate(funding):
            if tokens_:
                harness.do_fund(pool, tokens_)
        harness.check_invariants()
        for op in operations:
            harness.step(op)
        harness.settle(unlock)
        harness.check_batches(
            [(pool, n, b) for pool in range(len(POOLS)) for n in range(len(NODE_KEYS)) for b in range(len(BATCH_TREES))]
        )
    finally:
        base.restore(chain)
