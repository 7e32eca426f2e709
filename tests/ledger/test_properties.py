"""Random operation sequences against the contracts, checked step by step against a Python model.

Three providers (one or two nodes each) and three pools with different terms: pool 0 (1 h window, 100 tokens
locked per node, 60 slashed per invalidated batch), pool 1 (2 h, 40 locked, 40 slashed, at most 5,000 units per
file) and pool 2, which provider 0 created with the smallest terms allowed (1 token locked and slashed) and
validates itself: its node can be "invalidated" by its own provider. Every bound node starts as a member of
pools 0 and 2 and may join pool 1. Unbonding takes 2 days. A funder tops up the escrows; nodes commit batches (one
Merkle root for 1 to 8 files, `ledger.merkle`), declaring their leaves' units or fewer or more than those, into
numbered batch slots: the lowest free one, one whose batch is settled (reused), one still pending (refused), a root
again in a second slot; a validator invalidates a batch (the whole batch void, a slash) or refuses its leaves one by
one (no slash) with proofs, some of them wrong, outside the tree or of the wrong length, or invalidates with no
proof a batch whose leaf list was never made available (reason 8), in pools 0 and 1, batches with refused leaves
included, naming each batch by (slot, root), some of them written over or swapped; owners eject nodes; anyone
releases held locks and claims whole batches. Each operation is first applied to `Model`, which holds what each
(pool, node, slot) holds and the refused leaves of each node's root (the chain's bitmap is keyed by root, not by
slot), says whether the operation must revert and with which custom error; the chain must agree.

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
- a slot takes a new batch only once its batch is settled (claimed or invalidated), as read from the events;
- nothing in an invalidated batch is paid; a batch is invalidated at most once and a leaf of a node's root refused
  at most once, a refusal neither slashes, ejects nor pays; a claim pays each batch exactly its declared total less
  its refused leaves' units (at most the total: a leaf claiming more than its batch takes the batch to zero, not
  below), as summed from the events (a challenge's event names no slot: the record is the one its call named);
- stake backing an open window stays put: a provider's locked stake equals what its open locks hold and is
  covered by its active stake, every pending batch whose window is open (it may still be invalidated) is backed by
  an open lock holding the pool's `minStakePerNode` less what was slashed from it (an owner's ejection included),
  and a withdrawal never takes active or locked stake;
- and the model's view of every balance, stake, lock, membership, batch slot and refused leaf matches.

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
]  # node i belongs to provider i // 2; node i is unused (never bound) when that provider drew one node
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

SLOTS = 3  # the batch slots a submission names, besides the lowest free one: few, so that most are reused
Pair = tuple[int, int]  # (pool index, node index)
BatchId = tuple[int, int, int]  # (pool index, node index, index into BATCH_TREES): a node's root in a pool
SlotKey = tuple[int, int, int]  # (pool index, node index, batch slot): where the chain holds a batch record
RecordId = tuple[int, int, int, int]  # a slot key and how many batches the slot held before: one record over time
Ref = tuple[int, int]  # (batch slot, index into BATCH_TREES): how a call names a batch


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
    """The batch a slot holds (the latest one submitted into it)."""

    b: int  # its root: an index into BATCH_TREES
    total: int  # declared at submission
    submitted_at: int
    status: BatchStatus = BatchStatus.PENDING
    refused_units: int = 0  # at most `total`; refused leaves themselves are the root's (`Model.refused`)

    @property
    def payable(self) -> int:
        return self.total - self.refused_units


@dataclass
class Model:
    """What the contracts should hold. Each operation returns the custom error it must revert with, or None
    after applying its effects; a reverting operation changes nothing."""

    now: int
    providers: list[ProviderState]
    node_provider: list[int | None]  # provider index of each node; None for an unused node (never bound)
    funder_wallet: int
    escrow: list[int] = field(default_factory=lambda: [0] * len(POOLS))
    members: set[Pair] = field(default_factory=set)
    ejected: set[Pair] = field(default_factory=set)  # by the owner or by an invalidation
    voided: set[Pair] = field(default_factory=set)  # ejected by an invalidation: pending batches never paid
    locks: dict[Pair, LockState] = field(default_factory=dict)  # open locks only
    batches: dict[SlotKey, BatchState] = field(default_factory=dict)  # what each batch slot holds, never-used absent
    # refused leaves of each node's root in a pool: the chain's bitmap is keyed by the root, not the slot, so a root
    # submitted again (into another slot, or the same one once settled) finds its leaves refused before still refused
    refused: dict[BatchId, set[int]] = field(default_factory=dict)
    overwritten: list[tuple[SlotKey, int]] = field(default_factory=list)  # (slot, root) of batches written over
    latest_slot: dict[BatchId, int] = field(default_factory=dict)  # a root's latest submission (`Ledger.slot_of`)
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

    def free_slot(self, pair: Pair) -> int:
        """The node's lowest slot that takes a new batch: never used, or its batch settled (`Ledger.free_slot`)."""
        slot = 0
        while (held := self.batches.get((*pair, slot))) is not None and held.status == BatchStatus.PENDING:
            slot += 1
        return slot

    def submit_batch(self, key: SlotKey, b: int, total: int) -> str | None:
        pair = (key[0], key[1])
        if pair not in self.members:
            return "NotPoolMember"
        if total > BATCH_TREES[b].count * POOLS[pair[0]].max_units:
            return "UnitsOutOfRange"
        held = self.batches.get(key)
        if held is not None and held.status == BatchStatus.PENDING:
            return "SlotInUse"
        if held is not None:  # settled: claimed, or invalidated (never, in fact: its node was ejected)
            self.overwritten.append((key, held.b))
        self.batches[key] = BatchState(b, total, self.now)
        self.latest_slot[(*pair, b)] = key[2]
        return None

    def found(self, key: SlotKey, b: int) -> BatchState | None:
        """The batch a call naming (slot, root) reaches: the slot's, if it holds that root."""
        batch = self.batches.get(key)
        return batch if batch is not None and batch.b == b else None

    def challenge_batch(
        self, key: SlotKey, b: int, index: int, spoil: str | None, by_validator: bool, reason: int, *, kind: str
    ) -> tuple[str | None, int]:
        """The expected error of `invalidateBatch` (kind "invalidate") or `refuseLeaf` ("refuse") of leaf `index`
        of the batch (slot, root `b`) with a proof `spoil`t or not, or of `invalidateUnavailableBatch`
        ("unavailable": no reason, no leaf, no proof), and on success the amount slashed (0 for a refusal)."""
        proven = kind != "unavailable"
        if proven and not 0 < reason <= MAX_REASON:
            return "InvalidReason", 0
        batch = self.found(key, b)
        if batch is None:
            return "BatchNotFound", 0
        if batch.status != BatchStatus.PENDING:
            return "BatchNotPending", 0
        if not by_validator:
            return "NotValidator", 0
        if self.now >= batch.submitted_at + POOLS[key[0]].window:
            return "BatchChallengeWindowClosed", 0
        spoiled = {"outside": "LeafOutOfRange", "short": "ProofLengthMismatch", "wrong": "InvalidProof"}
        if proven and spoil in spoiled:
            return spoiled[spoil], 0
        if kind != "refuse":
            batch.status = BatchStatus.INVALIDATED
            return None, self._slash((key[0], key[1]))
        refused = self.refused.get((key[0], key[1], b), set())
        if index in refused:
            return "LeafAlreadyRefused", 0
        self.refused[(key[0], key[1], b)] = refused | {index}
        leaf_units = BATCH_TREES[b].leaves[index].units
        batch.refused_units = min(batch.refused_units + leaf_units, batch.total)
        return None, 0

    def claim_batches(self, pair: Pair, refs: Sequence[Ref]) -> tuple[str | None, int]:
        """The expected error of a claim of the batches `refs` (slot, root), and on success the amount paid to the
        node's provider."""
        if not refs:
            return "EmptyBatch", 0
        if pair in self.voided:
            return "NodeEjected", 0
        terms, units, seen = POOLS[pair[0]], 0, set()
        for slot, b in refs:  # the contract's loop, in its order of checks
            batch = self.found((*pair, slot), b)
            if batch is None:
                return "BatchNotFound", 0
            if batch.status != BatchStatus.PENDING or slot in seen:  # the loop claims each slot as it goes
                return "BatchNotPending", 0
            if self.now < batch.submitted_at + terms.window:
                return "BatchChallengeWindowOpen", 0
            units += batch.payable
            seen.add(slot)
        amount = units * terms.reward
        if amount > self.escrow[pair[0]]:
            return "InsufficientEscrow", 0
        for slot, _ in refs:
            self.batches[(*pair, slot)].status = BatchStatus.CLAIMED
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

    def pending_batches(self, where: Callable[[SlotKey, BatchState], bool] = lambda k, b: True) -> list[SlotKey]:
        """The slots holding pending batches, oldest batch first."""
        found = [k for k, b in self.batches.items() if b.status == BatchStatus.PENDING and where(k, b)]
        return sorted(found, key=lambda k: (self.batches[k].submitted_at, k))

    def batch_window_open(self, key: SlotKey) -> bool:
        return self.now < self.batches[key].submitted_at + POOLS[key[0]].window

    def ref(self, key: SlotKey) -> Ref:
        """How a call names the batch slot `key` holds."""
        return key[2], self.batches[key].b

    def ejection(self, pair: Pair) -> Ejection:
        if pair in self.voided:
            return Ejection.BY_INVALIDATION
        return Ejection.BY_OWNER if pair in self.ejected else Ejection.NONE


# --- the operations ----------------------------------------------------------------------------------------
# Operations name accounts, memberships and batches by index or by a selector that resolves against the model
# when the step runs (deterministically, so shrinking still works), so that most of them reach the interesting
# checks: ("member", pool, i) is the i-th current membership of any pool, ("busy", ...) the i-th of those holding
# batches, ("reuser", ...) of those holding a settled one, ("ejected", ...) the i-th ejection,
# ("held", ...) the i-th lock held past its membership, ("left", ...) such a lock of a node not ejected, and
# ("node", pool, i) node i in that pool. A submission goes into the node's lowest free slot (the client's choice), a
# slot whose batch is settled (reused), a slot holding a pending batch (SlotInUse) or any of the first SLOTS, with a
# root of its own or, now and then, the root of its newest batch again (one root in two slots: two records). A
# challenge names (slot, root) of the newest pending batch, the newest one still inside its window, one of an
# already ejected node (a second slash in the same pool), one whose root has a refused leaf (an invalidation over a
# refusal, a second refusal of that leaf, or the refusal of a leaf refused in an earlier record of the root), an
# invalidated or claimed one, a batch written over since (BatchNotFound), a pending batch's slot with another root
# (BatchNotFound), or any (pool, node, slot, root); claim_batches claims a node's oldest claimable batches, optionally
# spoiled by another node's batch, a settled, unripe or written-over batch, a slot with another root, a repeated
# batch, or aimed at an ejected node; claim_listed claims any list of any node's roots, the client naming each by the
# slot of its latest submission.
provider_choice = st.tuples(st.sampled_from(["index", "index", "unbonding"]), st.integers(0, len(PROVIDERS) - 1))
pool_index = st.sampled_from([0, 0, 1, 2])
node_index = st.integers(0, len(NODE_KEYS) - 1)
slot_index = st.integers(0, SLOTS - 1)
batch_index = st.integers(0, len(BATCH_TREES) - 1)


def pick(*hows: str, pools: st.SearchStrategy[int] = pool_index) -> st.SearchStrategy[tuple[str, int, int]]:
    return st.tuples(st.sampled_from(hows), pools, node_index)


# a member, most often one that holds batches (a settled one: its slot reused), so that slots fill up and are reused
submitter = pick("member", "member", "busy", "busy", "reuser", "reuser", "node", "ejected")
joiner = pick("node", "node", "node", "left", "ejected", pools=st.sampled_from([0, 1, 1, 1, 2]))  # all start in 0, 2
declared = st.sampled_from(["leaves"] * 8 + ["half", "double", "cap", "over"])
TARGETS = ["newest", "open", "open", "open", "ejected", "ejected", "refused", "refused"]
TARGETS += ["settled", "overwritten", "swapped", "given"]  # BatchNotPending; BatchNotFound twice; what it names
slot_choice = st.tuples(st.sampled_from(["free"] * 5 + ["settled", "settled", "pending", "given"]), slot_index)
root_again = st.sampled_from([False] * 5 + [True])
batch_target = st.tuples(st.sampled_from(TARGETS), pool_index, node_index, slot_index, batch_index)
leaf_choice = st.tuples(
    st.integers(0, max(tree.count for tree in BATCH_TREES) - 1),  # the leaf, modulo the batch's count
    st.sampled_from([None] * 8 + ["refused", "refused", "outside", "short", "wrong"]),  # "refused": one refused before
)
reason = st.sampled_from([*range(1, MAX_REASON + 1)] * 2 + [0, MAX_REASON + 1])
spoiler = st.sampled_from(
    [None, None, None, "other_node", "settled", "unripe", "overwritten", "swapped", "repeat", "ejected"]
)
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
    (1, st.tuples(st.just("leave"), pick("member", "member", "node"))),
    (1, st.tuples(st.just("eject"), pick("member", "member", "node"), st.sampled_from([True] * 5 + [False]))),
    (1, st.tuples(st.just("release"), pick("held", "held", "held", "member", "node"))),
    (10, st.tuples(st.just("submit_batch"), submitter, batch_index, declared, slot_choice, root_again)),
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
    (5, st.tuples(st.just("claim_batches"), st.integers(0, 5), st.integers(1, 3), spoiler)),
    (1, st.tuples(st.just("claim_listed"), pool_index, node_index, st.lists(batch_index, max_size=3))),
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
    held: dict[SlotKey, int] = field(default_factory=dict)  # BatchSubmitted events per slot, less one: its record
    roots: dict[RecordId, int] = field(default_factory=dict)  # BatchSubmitted.root (an index into BATCH_TREES)
    declared: dict[RecordId, int] = field(default_factory=dict)  # BatchSubmitted.totalUnits
    refused_units: dict[RecordId, int] = field(default_factory=dict)  # LeafRefused.units, summed per record
    refused_leaves: set[tuple[BatchId, int]] = field(default_factory=set)  # LeafRefused events, per root and leaf
    invalidated_batches: set[RecordId] = field(default_factory=set)  # BatchInvalidated events
    claimed_batches: set[RecordId] = field(default_factory=set)  # BatchesClaimed events

    def record(self, key: SlotKey, root: bytes) -> RecordId:
        """The record the slot `key` holds now, which an event naming it with `root` must be."""
        assert key in self.held, f"an event names slot {key}, which no BatchSubmitted filled"
        record = (*key, self.held[key])
        assert ROOTS[self.roots[record]] == root, f"an event names slot {key} with a root it does not hold"
        return record


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
        self.node_of = {node.address: n for n, node in enumerate(self.nodes)}
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

    def send(
        self, expected: str | None, action: Callable[[], TxReceipt], what: str, *, named: SlotKey | None = None
    ) -> TxReceipt | None:
        """Runs `action` mined at the model's clock and checks it reverts exactly when the model says so; `named` is
        the batch slot a challenge names."""
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
        self._account(receipt, named)
        return receipt

    def _account(self, receipt: TxReceipt, named: SlotKey | None = None) -> None:
        """Adds the receipt's flows to the totals and checks, from the events alone, that a slot is written over only
        once its batch is settled, that no node ejected by an invalidation is paid, that nothing in an invalidated
        batch is paid, that a claim pays each batch its declared total less its refused leaves' units (never below
        zero), and that a refusal moves no token. `BatchInvalidated` and `LeafRefused` name the batch by its root
        alone, not its slot, so they are read as the record in the slot the call `named` (which holds that root)."""
        work, registry, pools, t = (
            self.owner.work.events,
            self.owner.registry.events,
            self.owner.pools.events,
            self.totals,
        )
        t.funded += sum(e["amount"] for e in events(work.RewardsFunded(), receipt))
        for e in events(work.BatchSubmitted(), receipt):
            key = (self.pool_of[e["poolId"]], self.node_of[e["node"]], e["slot"])
            if key in t.held:
                earlier = (*key, t.held[key])
                settled = t.invalidated_batches | t.claimed_batches
                assert earlier in settled, f"slot {key} written over while its batch {earlier} was pending"
                event("submitBatch over a settled batch")
            t.held[key] = t.held.get(key, -1) + 1
            record = (*key, t.held[key])
            t.roots[record], t.declared[record] = ROOTS.index(e["root"]), e["totalUnits"]
        for e in events(work.BatchInvalidated(), receipt):
            assert named is not None and named[:2] == (self.pool_of[e["poolId"]], self.node_of[e["node"]]), e
            record = t.record(named, e["root"])
            assert record not in t.invalidated_batches, f"batch {record} invalidated twice"
            assert record not in t.claimed_batches, f"batch {record} invalidated after its claim"
            t.invalidated_batches.add(record)
            t.slashed += e["slashed"]
        for e in events(registry.Slashed(), receipt):
            pair = (self.pool_of[e["poolId"]], self.node_of[e["node"]])
            p = self.model.node_provider[pair[1]]
            assert p is not None and e["provider"] == self.providers[p].address, f"slashed {e} of the wrong provider"
            t.slashed_by[pair] = t.slashed_by.get(pair, 0) + e["amount"]
        for e in events(work.BatchesClaimed(), receipt):
            pair = (self.pool_of[e["poolId"]], self.node_of[e["node"]])
            assert pair not in t.voided, f"node {pair[1]} was paid in pool {pair[0]} after an invalidation ejected it"
            claimed = {t.record((*pair, ref["slot"]), ref["root"]) for ref in e["batches"]}
            assert len(claimed) == len(e["batches"]), f"a batch paid twice in one claim: {e}"
            assert not claimed & t.invalidated_batches, f"paid an invalidated batch: {e}"
            assert not claimed & t.claimed_batches, f"paid a batch twice: {e}"
            units = sum(max(t.declared[b] - t.refused_units.get(b, 0), 0) for b in claimed)
            assert e["amount"] == units * POOLS[pair[0]].reward, f"claimed {e['amount']} for {units} payable units"
            t.claimed_batches |= claimed
            t.paid += e["amount"]
        for e in events(pools.NodeEjected(), receipt):
            pair = (self.pool_of[e["poolId"]], self.node_of[e["node"]])
            t.ejected.add(pair)
            if e["kind"] == Ejection.BY_INVALIDATION:
                t.voided.add(pair)
            else:
                assert pair not in t.voided, f"an owner's ejection undid the invalidation's of {pair}"
        leaves = events(work.LeafRefused(), receipt)
        for e in leaves:
            assert named is not None and named[:2] == (self.pool_of[e["poolId"]], self.node_of[e["node"]]), e
            record = t.record(named, e["root"])
            leaf = ((*named[:2], ROOTS.index(e["root"])), e["leafIndex"])
            assert leaf not in t.refused_leaves, f"leaf {leaf} of the root refused twice"
            assert record not in t.invalidated_batches | t.claimed_batches, f"leaf {leaf} refused in a settled batch"
            t.refused_leaves.add(leaf)
            t.refused_units[record] = t.refused_units.get(record, 0) + e["units"]
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
        elif how in ("busy", "reuser"):  # a member holding batches (a settled one, for "reuser"), else any member
            settled = {k[:2] for k, b in m.batches.items() if b.status != BatchStatus.PENDING}
            holding = {k[:2] for k in m.batches} & m.members
            found = sorted(holding & settled) if how == "reuser" else []
            found = found or sorted(holding) or sorted(m.members)
        return found[i % len(found)] if found else (pool, i)

    def pid(self, pool: int) -> int:
        return self.pool_ids[pool]

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

    def do_submit_batch(
        self, choice: tuple[str, int, int], b: int, declared: str, where: tuple[str, int], again: bool
    ) -> None:
        pair = self.pair(choice)
        m = self.model
        mine = sorted((k for k in m.batches if k[:2] == pair), key=lambda k: (m.batches[k].submitted_at, k))
        if again and mine:  # the root of the node's newest batch, into another slot or the same one
            b = m.batches[mine[-1]].b
        total = self.declared_total(BATCH_TREES[b], declared, POOLS[pair[0]].max_units)
        how, i = where
        slots = {
            "free": [],  # None: the client's choice, the lowest free slot
            "settled": [k[2] for k in mine if m.batches[k].status != BatchStatus.PENDING],
            "pending": [k[2] for k in mine if m.batches[k].status == BatchStatus.PENDING],  # SlotInUse
            "given": [i],
        }[how]
        self._submit_batch(pair, b, total, slots[i % len(slots)] if slots else None)

    def _submit_batch(self, pair: Pair, b: int, total: int, slot: int | None) -> None:
        """Submits batch `b` declaring `total` units from the node of `pair` into its slot `slot` (None: the client's
        choice, the lowest free one)."""
        (pool, n), m = pair, self.model
        tree, node = BATCH_TREES[b], self.nodes[n]
        key = (pool, n, m.free_slot(pair) if slot is None else slot)
        again = any(s.b == b for k, s in m.batches.items() if k[:2] == pair and k != key)
        action = lambda: node.submit_batch(self.pid(pool), tree.root, tree.count, total, slot=slot)  # noqa: E731
        what = f"submitBatch({pool}, node {n}, slot {slot}, batch {b}, {total} of {tree.total_units} units)"
        receipt = self.send(m.submit_batch(key, b, total), action, what)
        if receipt is not None:
            (submitted,) = events(self.owner.work.events.BatchSubmitted(), receipt)
            assert submitted["slot"] == key[2], f"{what} went into slot {submitted['slot']}, not {key[2]}"
            if again:
                event("submitBatch of a root the node holds in another slot")
        self.check_batches([key])

    def batch_target(self, target: tuple[str, int, int, int, int]) -> tuple[SlotKey, int]:
        """The batch slot a challenge names and the root it names there."""
        m = self.model
        how, pool, n, slot, b = target
        if how == "given":
            return (pool, n, slot), b
        if how == "settled":  # invalidated or claimed: BatchNotPending, the second slash a batch never takes
            settled = sorted(k for k, s in m.batches.items() if s.status != BatchStatus.PENDING)
            if settled:
                key = settled[b % len(settled)]
                return key, m.batches[key].b
        if how == "overwritten" and m.overwritten:  # its slot holds a newer batch: BatchNotFound
            return m.overwritten[b % len(m.overwritten)]
        open_ = m.pending_batches(lambda k, s: m.batch_window_open(k))
        candidates = (
            {
                "newest": m.pending_batches(),
                "open": open_,
                "ejected": [k for k in open_ if k[:2] in m.ejected],
                "refused": [k for k in open_ if m.refused.get((*k[:2], m.batches[k].b))],
                "swapped": open_,
            }.get(how, [])
            or open_
            or m.pending_batches()
        )
        if not candidates:  # none pending: BatchNotFound, or BatchNotPending of a settled one
            return (pool, n, slot), b
        key = candidates[-1]
        if how == "swapped":  # the slot, with a root it does not hold: BatchNotFound
            return key, (m.batches[key].b + 1 + b % (len(BATCH_TREES) - 1)) % len(BATCH_TREES)
        return key, m.batches[key].b

    def do_challenge_batch(
        self,
        target: tuple[str, int, int, int, int],
        leaf: tuple[int, str | None],
        by_validator: bool,
        reason: int,
        kind: str,
    ) -> None:
        key, b = self.batch_target(target)
        pool, n, slot = key
        tree, (pick_leaf, spoil) = BATCH_TREES[b], leaf
        index = pick_leaf % tree.count
        refused = self.model.refused.get((pool, n, b), set())
        if (
            spoil == "refused"
        ):  # a leaf of the root refused before, if there is one: a second refusal, or an invalidation
            index, spoil = (min(refused) if refused else index), None
        proof = self.spoiled(tree.proof(index), spoil)
        before = self.batch_statuses([key])
        expected, slashed = self.model.challenge_batch(key, b, index, spoil, by_validator, reason, kind=kind)
        sender = self.accounts[POOLS[pool].validator] if by_validator else self.funder
        node = self.nodes[n].address
        if kind == "unavailable":
            name, what = "invalidateUnavailableBatch", f"({pool}, node {n}, slot {slot}, batch {b}, {by_validator=})"
            action = lambda: sender.invalidate_unavailable_batch(self.pid(pool), node, tree.root, slot=slot)  # noqa: E731
        else:
            name, call = (
                ("refuseLeaf", sender.refuse_leaf) if kind == "refuse" else ("invalidateBatch", sender.invalidate_batch)
            )
            what = f"({pool}, node {n}, slot {slot}, batch {b}, leaf {proof.index}, {spoil}, {by_validator=}, {reason})"
            action = lambda: call(self.pid(pool), node, tree.root, proof, reason, slot=slot)  # noqa: E731
        receipt = self.send(expected, action, name + what, named=key)
        if receipt is not None:
            assert before[0] == BatchStatus.PENDING, f"{name} of batch {key} that was {before[0].name}"
            if kind != "refuse":
                (invalidated,) = events(self.owner.work.events.BatchInvalidated(), receipt)
                shown = (index, proof.leaf.work_key, reason) if kind == "invalidate" else (NO_LEAF, bytes(32), 8)
                assert invalidated["slashed"] == slashed
                assert (invalidated["leafIndex"], invalidated["workKey"], invalidated["reason"]) == shown
        self.check_batches([key])
        self.check_refusals([(pool, n, b)])

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
        ready = m.pending_batches(lambda k, s: not m.batch_window_open(k))
        # none ready: a node's batches still in their window (BatchChallengeWindowOpen)
        pairs = sorted({(pool, n) for pool, n, _ in ready or m.pending_batches()})
        if spoiler == "ejected":
            pairs = sorted({(pool, n) for pool, n, _ in m.pending_batches() if (pool, n) in m.ejected}) or pairs
        if not pairs:
            return
        pair = pairs[index % len(pairs)]
        own = [k for k in m.pending_batches() if k[:2] == pair]
        refs = [m.ref(k) for k in ([k for k in ready if k[:2] == pair][:count] or own[:count])]
        if spoiler == "other_node":  # another node's batch: under this node, its slot holds another root or none
            refs += [m.ref(k) for k in m.pending_batches() if k[:2] != pair][:1]
        elif spoiler == "settled":
            refs += [m.ref(k) for k in sorted(m.batches) if k[:2] == pair and k not in own][:1]
        elif spoiler == "unripe":
            refs += [m.ref(k) for k in m.pending_batches(lambda k, s: m.batch_window_open(k)) if k[:2] == pair][:1]
        elif spoiler == "overwritten":
            refs += [(key[2], b) for key, b in m.overwritten if key[:2] == pair][:1]
        elif spoiler == "swapped" and refs:  # the first batch's slot with another root
            refs.append((refs[0][0], (refs[0][1] + 1) % len(BATCH_TREES)))
        elif spoiler == "repeat" and refs:
            refs.append(refs[0])
        self._claim_batches(pair, refs)

    def do_claim_listed(self, pool: int, n: int, bs: list[int]) -> None:
        """A claim of roots alone: the client names each by the slot of the node's latest submission of it (slot 0
        when there is none)."""
        m = self.model
        self._claim_batches((pool, n), [(m.latest_slot.get((pool, n, b), 0), b) for b in bs], by_root=True)

    def _claim_batches(self, pair: Pair, refs: list[Ref], *, by_root: bool = False) -> None:
        pool, n = pair
        expected, amount = self.model.claim_batches(pair, refs)
        node = self.nodes[n].address
        roots = [ROOTS[b] for _, b in refs]
        slots = None if by_root else [slot for slot, _ in refs]
        action = lambda: self.funder.claim_batches(self.pid(pool), node, roots, slots=slots)  # noqa: E731
        receipt = self.send(expected, action, f"claimBatches({pool}, node {n}, {refs}{' by root' * by_root})")
        if receipt is not None:
            (claimed,) = events(self.owner.work.events.BatchesClaimed(), receipt)
            assert claimed["amount"] == amount
            assert [(ref["slot"], ref["root"]) for ref in claimed["batches"]] == [(s, ROOTS[b]) for s, b in refs]
        self.check_batches(sorted({(pool, n, slot) for slot, _ in refs}))

    def do_fund(self, pool: int, amount_tokens: int) -> None:
        self._fund(pool, amount_tokens * TOKEN)

    def _fund(self, pool: int, amount: int) -> None:
        expected = self.model.fund(pool, amount)
        self.send(expected, lambda: self.funder.fund_rewards(self.pid(pool), amount), f"fund({pool}, {amount})")

    def do_advance(self, delta: int) -> None:
        self._move_clock(self.model.now + delta)

    def do_advance_to(self, what: str, index: int, offset: int) -> None:
        m = self.model
        if what == "window":
            ends = sorted(m.batches[k].submitted_at + POOLS[k[0]].window for k in m.pending_batches())
        elif what == "release":
            ends = sorted(s.release_at for s in m.providers if s.unbonding > 0)
        else:
            ends = sorted(lock.release_at for lock in m.locks.values() if not lock.member)
        if ends and ends[index % len(ends)] + offset > m.now:
            self._move_clock(ends[index % len(ends)] + offset)

    def _claim_all(self) -> None:
        """Past every window, claims each pending batch on its own: all are paid but a voided node's and those the
        escrow cannot cover."""
        m = self.model
        self._move_clock(m.now + LONGEST_WINDOW)
        self.check_invariants()
        for key in m.pending_batches():
            self._claim_batches((key[0], key[1]), [m.ref(key)])
            self.check_invariants()
        for key in m.pending_batches():  # no earned reward is lost to an owner's ejection
            short = m.batches[key].payable * POOLS[key[0]].reward > m.escrow[key[0]]
            assert key[:2] in m.voided or short, f"batch {key} left unpaid; {' | '.join(self.log)}"

    def _fund_shortfall(self) -> None:
        """Tops up each pool's escrow to what its payable pending batches need, when the funder has that much."""
        m = self.model
        for pool, terms in enumerate(POOLS):
            payable = [m.batches[k].payable for k in m.pending_batches() if k[0] == pool and k[:2] not in m.voided]
            short = sum(payable) * terms.reward - m.escrow[pool]
            if 0 < short <= m.funder_wallet:
                self._fund(pool, short)
                self.check_invariants()

    def _move_clock(self, timestamp: int) -> None:
        """Mines an empty block at `timestamp`: later transactions are estimated and mined at that time."""
        self.log.append(f"time +{timestamp - self.model.now}")
        self.model.now = timestamp
        self.chain.set_next_timestamp(timestamp)
        self.chain.mine()

    def settle(self, unlock: bool) -> None:
        """Past every window, claims each pending batch on its own (a voided node's fail); then every member commits
        one more batch into its lowest free slot (a settled one, where it has any: the steady state of slot reuse),
        and those are claimed after their window too. With `unlock`, every node leaves, every lock is released after
        its window and all stake is unstaked, so that only the burned tokens remain in the registry; then each
        provider withdraws what unbonds."""
        m = self.model
        self._claim_all()
        self._fund_shortfall()  # what the escrows could not cover, where the funder's wallet can: now it is paid
        self._claim_all()
        for pool, n in sorted(m.members):
            cap = POOLS[pool].max_units
            fits = [b for b, tree in enumerate(BATCH_TREES) if tree.total_units <= tree.count * cap]
            b = fits[n % len(fits)]
            self._submit_batch((pool, n), b, BATCH_TREES[b].total_units, None)
            self.check_invariants()
        self._fund_shortfall()
        self._claim_all()
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
        for key in m.pending_batches(lambda k, b: m.batch_window_open(k)):
            pair = (key[0], key[1])
            amount, _, _, is_open = locks[pair]
            expected = POOLS[pair[0]].min_stake - t.slashed_by.get(pair, 0)
            assert is_open and amount == expected, f"open batch {key} backed by lock {locks[pair]}; {history}"

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

    def batch_records(self, keys: Sequence[SlotKey]) -> list[list[int]]:
        work = self.owner.work
        calls = [
            (work.address, work.encode_abi("getBatch", [self.pid(pool), self.nodes[n].address, slot]))
            for pool, n, slot in keys
        ]
        return self.reader.words(calls) if calls else []

    def batch_statuses(self, keys: Sequence[SlotKey]) -> list[BatchStatus]:
        return [BatchStatus(words[6]) for words in self.batch_records(keys)]

    def check_batches(self, keys: Sequence[SlotKey]) -> None:
        """What each batch slot holds as the model has it: root, provider, count, total, refused units, time and
        status, or nothing; no claim may ever pay more than a batch's units (refused <= total)."""
        history = " | ".join(self.log)
        for key, words in zip(keys, self.batch_records(keys), strict=True):
            root, provider, count, total, refused, submitted_at, status = words
            state = self.model.batches.get(key)
            if state is None:
                assert words == [0] * 7, f"slot {key} holds a batch on chain only; {history}"
                continue
            tree, p = BATCH_TREES[state.b], self.model.node_provider[key[1]]
            assert p is not None
            chain_view = (root, provider, count, total, refused, submitted_at, status)
            model_view = (
                int.from_bytes(tree.root, "big"),
                int(self.providers[p].address, 16),
                tree.count,
                state.total,
                state.refused_units,
                state.submitted_at,
                state.status,
            )
            assert chain_view == model_view, f"slot {key}: chain {chain_view}, model {model_view}; {history}"
            assert refused <= total

    def check_refusals(self, batch_ids: Sequence[BatchId]) -> None:
        """Which leaves of each node's root are refused (`isLeafRefused`, keyed by the root, whatever slot holds it)."""
        history = " | ".join(self.log)
        work = self.owner.work
        for pool, n, b in batch_ids:
            calls = [
                (work.address, work.encode_abi("isLeafRefused", [self.pid(pool), self.nodes[n].address, ROOTS[b], i]))
                for i in range(BATCH_TREES[b].count)
            ]
            refused_leaves = {i for i, (bit,) in enumerate(self.reader.words(calls)) if bit}
            expected = self.model.refused.get((pool, n, b), set())
            assert refused_leaves == expected, f"root {(pool, n, b)} refused leaves {refused_leaves}; {history}"


@pytest.mark.slow
@pytest.mark.timeout(900)  # passing takes ~60 s; a failure's shrinking may take minutes more
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
        used = max((slot for _, _, slot in harness.model.batches), default=0)
        pools_nodes = [(pool, n) for pool in range(len(POOLS)) for n in range(len(NODE_KEYS))]
        harness.check_batches([(pool, n, slot) for pool, n in pools_nodes for slot in range(max(used, SLOTS) + 1)])
        harness.check_refusals([(pool, n, b) for pool, n in pools_nodes for b in range(len(BATCH_TREES))])
    finally:
        base.restore(chain)
