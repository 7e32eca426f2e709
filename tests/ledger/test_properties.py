"""Random operation sequences against the contracts, checked step by step against a Python model.

Three providers (one or two nodes each) share one pool: challenge window 1 h, unbonding 2 days, 100 tokens
locked per node, 60 tokens slashed per invalidated work. A funder tops up the escrow and a validator
invalidates work. Each operation is first applied to `Model`, which says whether it must revert and with
which custom error; the chain must agree. After every step the conservation invariants are read back from
the chain: no token is created or lost, the registry holds exactly the stake, the work ledger exactly the
escrow, payouts stay within funding plus slashes, and the model's view of every balance matches.

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
from ledger.types import WorkStatus
from tests.conftest import TOKEN, UNBONDING_PERIOD
from tests.ledger.helpers import events, make_pool, onboard, work_key

MIN_STAKE = 100 * TOKEN
SLASH = 60 * TOKEN
WINDOW = 3600
REWARD_PER_UNIT = 10**14  # 4,000 units earn 0.4 tokens
WALLET = 1_000 * TOKEN  # minted to each provider and to the funder, besides the initial stake
MAX_UNITS = 2**48 - 1  # the Work struct's units field
MAX_ALLOWANCE = 2**256 - 1

OWNER, PROVIDERS, FUNDER, VALIDATOR = 0, (1, 2, 3), 4, 5
NODES_PER_PROVIDER = 2
NODE_KEYS: list[LocalAccount] = [
    Account.from_key(hashlib.sha256(f"property-node-{i}".encode()).digest())
    for i in range(len(PROVIDERS) * NODES_PER_PROVIDER)
]  # node slot i belongs to provider i // 2; a slot is unused when that provider drew one node
WORK_KEYS = [work_key(f"property-work-{i}") for i in range(10)]


# --- the model ---------------------------------------------------------------------------------------------
@dataclass
class ProviderState:
    wallet: int
    active: int = 0
    unbonding: int = 0
    locked: int = 0
    release_at: int = 0


@dataclass
class NodeState:
    provider: int | None  # provider index; None for an unused slot (never bound)
    member: bool = False
    ejected: bool = False


@dataclass
class WorkState:
    node: int
    units: int
    submitted_at: int
    status: WorkStatus = WorkStatus.PENDING


@dataclass
class Model:
    """What the contracts should hold. Each operation returns the custom error it must revert with, or None
    after applying its effects; a reverting operation changes nothing."""

    now: int
    providers: list[ProviderState]
    nodes: list[NodeState]
    funder_wallet: int
    escrow: int = 0
    works: dict[int, WorkState] = field(default_factory=dict)  # by index into WORK_KEYS

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

    def join(self, n: int) -> str | None:
        node = self.nodes[n]
        if node.ejected:
            return "EjectedFromPool"
        if node.member:
            return "AlreadyMember"
        if node.provider is None:
            return "NodeNotActive"
        s = self.providers[node.provider]
        if s.active < s.locked + MIN_STAKE:
            return "InsufficientActiveStake"
        node.member = True
        s.locked += MIN_STAKE
        return None

    def leave(self, n: int) -> str | None:
        node = self.nodes[n]
        if not node.member:
            return "NotMember"
        assert node.provider is not None
        node.member = False
        self.providers[node.provider].locked -= MIN_STAKE
        return None

    def submit(self, n: int, keys: Sequence[int], units: Sequence[int], *, batch: bool) -> str | None:
        if batch and not keys:
            return "EmptyBatch"
        if len(keys) != len(units):
            return "LengthMismatch"
        node = self.nodes[n]
        if not node.member:
            return "NotPoolMember"
        assert node.provider is not None
        s = self.providers[node.provider]
        if s.active < s.locked:
            return "ProviderUndercollateralized"
        recorded: set[int] = set()
        for key, amount in zip(keys, units, strict=True):
            if not 0 < amount <= MAX_UNITS:
                return "UnitsOutOfRange"
            if key in self.works or key in recorded:
                return "WorkExists"
            recorded.add(key)
        for key, amount in zip(keys, units, strict=True):
            self.works[key] = WorkState(n, amount, self.now)
        return None

    def invalidate(self, key: int, by_validator: bool, reason: int) -> tuple[str | None, int]:
        """The expected error, and on success the amount slashed."""
        if reason == 0:
            return "InvalidReason", 0
        work = self.works.get(key)
        if work is None:
            return "WorkNotFound", 0
        if work.status != WorkStatus.PENDING:
            return "WorkNotPending", 0
        if not by_validator:
            return "NotValidator", 0
        if self.now >= work.submitted_at + WINDOW:
            return "ChallengeWindowClosed", 0
        work.status = WorkStatus.INVALIDATED
        node = self.nodes[work.node]
        assert node.provider is not None
        s = self.providers[node.provider]
        from_active = min(SLASH, s.active)
        from_unbonding = min(SLASH - from_active, s.unbonding)
        s.active -= from_active
        s.unbonding -= from_unbonding
        self.escrow += from_active + from_unbonding
        if node.member:
            node.member = False
            s.locked -= MIN_STAKE
        node.ejected = True
        return None, from_active + from_unbonding

    def claim(self, keys: Sequence[int]) -> tuple[str | None, int | None, int]:
        """The expected error, and on success the provider paid and the amount."""
        if not keys:
            return "EmptyBatch", None, 0
        provider: int | None = None
        last_node: int | None = None
        units = 0
        seen: set[int] = set()
        for key in keys:  # the contract's loop, in its order of checks
            work = self.works.get(key)
            if work is None:
                return "WorkNotFound", None, 0
            if work.status != WorkStatus.PENDING or key in seen:
                return "WorkNotPending", None, 0
            if self.now < work.submitted_at + WINDOW:
                return "ChallengeWindowOpen", None, 0
            if work.node != last_node:
                owner = self.nodes[work.node].provider
                if provider is None:
                    provider = owner
                elif owner != provider:
                    return "MixedProviders", None, 0
                last_node = work.node
            units += work.units
            seen.add(key)
        amount = units * REWARD_PER_UNIT
        if amount > self.escrow:
            return "InsufficientEscrow", None, 0
        assert provider is not None
        for key in keys:
            self.works[key].status = WorkStatus.CLAIMED
        self.escrow -= amount
        self.providers[provider].wallet += amount
        return None, provider, amount

    def fund(self, amount: int) -> str | None:
        if amount == 0:
            return "ZeroAmount"
        if self.funder_wallet < amount:
            return "ERC20InsufficientBalance"
        self.funder_wallet -= amount
        self.escrow += amount
        return None

    def owner_of(self, work: WorkState) -> int | None:
        return self.nodes[work.node].provider


# --- the operations ----------------------------------------------------------------------------------------
# Operations name accounts and works by index or by a selector that resolves against the model when the step
# runs (deterministically, so shrinking still works), so that most of them reach the interesting checks:
# ("member", i) is the i-th current member node, ("ejected", i) the i-th ejected one; an invalidation targets the
# newest pending work, or one of an already ejected node; claim_ready claims a provider's oldest pending works,
# optionally spoiled by another provider's work, a settled work or a repeated key.
provider_choice = st.tuples(st.sampled_from(["index", "index", "unbonding"]), st.integers(0, len(PROVIDERS) - 1))
slot_index = st.integers(0, len(NODE_KEYS) - 1)
submitter = st.tuples(st.sampled_from(["member", "member", "member", "member", "slot", "ejected"]), slot_index)
joiner = st.tuples(st.sampled_from(["slot", "slot", "ejected"]), slot_index)
key_index = st.integers(0, len(WORK_KEYS) - 1)
target = st.sampled_from(["newest", "newest", "ejected", "ejected"]) | key_index
spoiler = st.sampled_from([None, None, None, "other_provider", "settled", "repeat"])
tokens = st.sampled_from([0, 1, 10, 40, 60, 100, 150])
units = st.sampled_from(
    [512, 1024, 2000, 2048, 2500, 3000, 3333, 4096, 5000, 8192] * 2 + [1, MAX_UNITS, 0, MAX_UNITS + 1]
)
seconds = st.sampled_from([1, 600, WINDOW - 1, WINDOW, WINDOW, WINDOW + 1, 86_400, UNBONDING_PERIOD])

# Every example ends by settling: past every window and release time, each provider claims and withdraws.
SETTLE: list[tuple[Any, ...]] = [
    ("advance", WINDOW),
    ("claim_each",),
    ("advance", UNBONDING_PERIOD),
    *[("withdraw", ("index", p)) for p in range(len(PROVIDERS))],
]


def weighted(*choices: tuple[int, st.SearchStrategy[tuple[Any, ...]]]) -> st.SearchStrategy[tuple[Any, ...]]:
    """Picks a strategy with probability proportional to its weight (`one_of` would ignore repeats)."""
    picks = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(picks) - 1).flatmap(lambda i: picks[i])


operation = weighted(
    (1, st.tuples(st.just("stake"), provider_choice, tokens)),
    (2, st.tuples(st.just("unstake"), provider_choice, tokens)),
    (2, st.tuples(st.just("withdraw"), provider_choice)),
    (1, st.tuples(st.just("join"), joiner)),
    (1, st.tuples(st.just("leave"), slot_index)),
    (4, st.tuples(st.just("submit"), submitter, key_index, units)),
    (
        2,
        st.tuples(
            st.just("batch"),
            submitter,
            st.lists(st.tuples(key_index, units), max_size=4),
            st.sampled_from([False] * 7 + [True]),  # drop one units entry: a length mismatch
        ),
    ),
    (3, st.tuples(st.just("invalidate"), target, st.sampled_from([True] * 5 + [False]), st.integers(0, 8))),
    (4, st.tuples(st.just("claim_ready"), st.integers(0, len(PROVIDERS) - 1), st.integers(1, 3), spoiler)),
    (1, st.tuples(st.just("claim"), st.lists(key_index, max_size=3))),
    (1, st.tuples(st.just("fund"), st.sampled_from([0, 1, 5, 20]))),
    (5, st.tuples(st.just("advance"), seconds)),
    # to a pending work's window end, or a provider's release time, give or take a second
    (
        2,
        st.tuples(
            st.just("advance_to"),
            st.sampled_from(["window", "release"]),
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
    slashed: int = 0
    paid: int = 0


class Harness:
    """Sets up one example's chain state, applies operations to chain and model, and checks invariants."""

    def __init__(
        self, chain: LocalChain, ledger_for: Callable[[int], Ledger], node_counts: Sequence[int], extra: int
    ) -> None:
        self.chain = chain
        self.owner = ledger_for(OWNER)
        self.providers = [ledger_for(i) for i in PROVIDERS]
        self.funder = ledger_for(FUNDER)
        self.validator = ledger_for(VALIDATOR)
        self.pool_id = make_pool(
            self.owner,
            min_stake_per_node=MIN_STAKE,
            challenge_window=WINDOW,
            reward_per_unit=REWARD_PER_UNIT,
            slash_amount=SLASH,
        )
        self.owner.set_validator(self.pool_id, self.validator.address)
        self.owner.mint(self.funder.address, WALLET)
        self.funder.approve(self.funder.work.address, MAX_ALLOWANCE)

        self.nodes: list[Ledger] = []
        node_states: list[NodeState] = []
        for p, provider in enumerate(self.providers):
            self.owner.mint(provider.address, WALLET)
            provider.approve(provider.registry.address, MAX_ALLOWANCE)
            for j in range(NODES_PER_PROVIDER):
                key = NODE_KEYS[p * NODES_PER_PROVIDER + j]
                chain.w3.provider.make_request("anvil_setBalance", [key.address, hex(10**20)])  # type: ignore[arg-type]
                if j < node_counts[p]:
                    stake_tokens = (node_counts[p] * MIN_STAKE + extra) // TOKEN if j == 0 else 0
                    self.nodes.append(onboard(self.owner, provider, key, self.pool_id, stake_tokens=stake_tokens))
                    node_states.append(NodeState(p, member=True))
                else:
                    self.nodes.append(provider.as_account(key))
                    node_states.append(NodeState(None))

        stakes = [ProviderState(WALLET, active=n * MIN_STAKE + extra, locked=n * MIN_STAKE) for n in node_counts]
        self.model = Model(now=self.owner.timestamp(), providers=stakes, nodes=node_states, funder_wallet=WALLET)
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
        work = self.owner.work.events
        self.totals.funded += sum(e["amount"] for e in events(work.RewardsFunded(), receipt))
        self.totals.slashed += sum(e["slashed"] for e in events(work.WorkInvalidated(), receipt))
        self.totals.paid += sum(e["amount"] for e in events(work.RewardsClaimed(), receipt))
        return receipt

    # selectors
    def provider(self, choice: tuple[str, int]) -> int:
        how, p = choice
        unbonding = [q for q, s in enumerate(self.model.providers) if s.unbonding > 0]
        return unbonding[p % len(unbonding)] if how == "unbonding" and unbonding else p

    def node(self, choice: tuple[str, int]) -> int:
        how, i = choice
        found = [n for n, node in enumerate(self.model.nodes) if getattr(node, how, False)]  # member or ejected
        return found[i % len(found)] if found else i

    def pending(self, where: Callable[[WorkState], bool] = lambda work: True) -> list[int]:
        """Pending works, oldest first."""
        works = self.model.works
        keys = [k for k, w in works.items() if w.status == WorkStatus.PENDING and where(w)]
        return sorted(keys, key=lambda k: (works[k].submitted_at, k))

    def ready_first(self, keys: list[int]) -> list[int]:
        """`keys` with the works whose window has passed first, in their order."""
        return sorted(keys, key=lambda k: self.model.works[k].submitted_at + WINDOW > self.model.now)

    # operations
    def do_stake(self, choice: tuple[str, int], amount_tokens: int) -> None:
        p, amount = self.provider(choice), amount_tokens * TOKEN
        self.send(self.model.stake(p, amount), lambda: self.providers[p].stake(amount), f"stake({p}, {amount_tokens})")

    def do_unstake(self, choice: tuple[str, int], amount_tokens: int) -> None:
        p, amount = self.provider(choice), amount_tokens * TOKEN
        expected = self.model.request_unstake(p, amount)
        self.send(expected, lambda: self.providers[p].request_unstake(amount), f"requestUnstake({p}, {amount_tokens})")

    def do_withdraw(self, choice: tuple[str, int]) -> None:
        p = self.provider(choice)
        provider = self.providers[p]
        release_at = provider.stake_of(provider.address).release_at  # from the chain, before the model moves
        receipt = self.send(self.model.withdraw(p), provider.withdraw, f"withdraw({p})")
        if receipt is not None:
            assert self.model.now >= release_at, f"stake left at {self.model.now}, before its release at {release_at}"

    def do_join(self, choice: tuple[str, int]) -> None:
        n = self.node(choice)
        self.send(self.model.join(n), lambda: self.nodes[n].join(self.pool_id), f"join(node {n})")

    def do_leave(self, n: int) -> None:
        self.send(self.model.leave(n), lambda: self.nodes[n].leave(self.pool_id), f"leave(node {n})")

    def do_submit(self, choice: tuple[str, int], key: int, amount: int) -> None:
        n = self.node(choice)
        expected = self.model.submit(n, [key], [amount], batch=False)
        node = self.nodes[n]
        self.send(
            expected, lambda: node.submit_work(self.pool_id, WORK_KEYS[key], amount), f"submit({n}, {key}, {amount})"
        )
        self.check_works([key])

    def do_batch(self, choice: tuple[str, int], entries: list[tuple[int, int]], mismatch: bool) -> None:
        n = self.node(choice)
        keys = [k for k, _ in entries]
        amounts = [u for _, u in entries][: len(entries) - 1 if mismatch and entries else None]
        expected = self.model.submit(n, keys, amounts, batch=True)
        node = self.nodes[n]
        action = lambda: node.submit_work_batch(self.pool_id, [WORK_KEYS[k] for k in keys], amounts)  # noqa: E731
        self.send(expected, action, f"submitBatch({n}, {keys}, {amounts})")
        self.check_works(keys)

    def do_invalidate(self, target: str | int, by_validator: bool, reason: int) -> None:
        if isinstance(target, int):
            key = target
        else:
            ejected = self.pending(lambda work: self.model.nodes[work.node].ejected) if target == "ejected" else []
            candidates = ejected or self.pending()
            if not candidates:
                return
            key = candidates[-1]
        before = self.statuses([key])
        expected, slashed = self.model.invalidate(key, by_validator, reason)
        sender = self.validator if by_validator else self.funder
        receipt = self.send(
            expected,
            lambda: sender.invalidate_work(self.pool_id, WORK_KEYS[key], reason),
            f"invalidate({key}, validator={by_validator}, reason={reason})",
        )
        if receipt is not None:
            assert before == [WorkStatus.PENDING], f"invalidated work {key} that was {before[0].name}"
            (event,) = events(self.owner.work.events.WorkInvalidated(), receipt)
            assert event["slashed"] == slashed
        self.check_works([key])

    def do_claim_ready(self, p: int, count: int, spoiler: str | None) -> None:
        """Claims up to `count` of the oldest pending works of the first provider from `p` on that has any, then
        adds the spoiler, if any and if there is one to add."""
        works, owner = self.model.works, self.model.owner_of
        pending = self.ready_first(self.pending())
        providers = {owner(works[k]) for k in pending}
        q = next((q for q in [*range(p, len(PROVIDERS)), *range(p)] if q in providers), None)
        if q is None:
            return
        keys = [k for k in pending if owner(works[k]) == q][:count]
        if spoiler == "other_provider":
            keys += [k for k in pending if owner(works[k]) != q][:1]
        elif spoiler == "settled":
            keys += sorted(k for k, w in self.model.works.items() if w.status != WorkStatus.PENDING)[:1]
        elif spoiler == "repeat":
            keys.append(keys[0])
        self.do_claim(keys)

    def do_claim_each(self) -> None:
        """Claims every pending work on its own (a huge one fails alone, for want of escrow)."""
        for key in self.pending():
            self.do_claim([key])

    def do_claim(self, keys: list[int]) -> None:
        before = self.statuses(keys)
        expected, provider, amount = self.model.claim(keys)
        caller = self.funder  # anyone may claim; the provider is paid
        receipt = self.send(
            expected, lambda: caller.claim_rewards(self.pool_id, [WORK_KEYS[k] for k in keys]), f"claim({keys})"
        )
        if receipt is not None:
            assert all(s == WorkStatus.PENDING for s in before), f"claimed {keys} that were {before}"
            (event,) = events(self.owner.work.events.RewardsClaimed(), receipt)
            assert provider is not None
            assert event["provider"] == self.providers[provider].address
            assert (event["amount"], event["count"]) == (amount, len(keys))
        self.check_works(keys)

    def do_fund(self, amount_tokens: int) -> None:
        amount = amount_tokens * TOKEN
        expected = self.model.fund(amount)
        self.send(expected, lambda: self.funder.fund_rewards(self.pool_id, amount), f"fund({amount_tokens})")

    def do_advance(self, delta: int) -> None:
        self._move_clock(self.model.now + delta)

    def do_advance_to(self, what: str, index: int, offset: int) -> None:
        if what == "window":
            ends = sorted(w.submitted_at + WINDOW for w in self.model.works.values() if w.status == WorkStatus.PENDING)
        else:
            ends = sorted(s.release_at for s in self.model.providers if s.unbonding > 0)
        if ends and ends[index % len(ends)] + offset > self.model.now:
            self._move_clock(ends[index % len(ends)] + offset)

    def _move_clock(self, timestamp: int) -> None:
        """Mines an empty block at `timestamp`: later transactions are estimated and mined at that time."""
        self.log.append(f"time +{timestamp - self.model.now}")
        self.model.now = timestamp
        self.chain.set_next_timestamp(timestamp)
        self.chain.mine()

    # --- checks ----------------------------------------------------------------------------------------------
    def _prepare_reads(self) -> None:
        token, registry, work = self.owner.token, self.owner.registry, self.owner.work
        pools = self.owner.pools
        self.holders = [
            self.owner.address,
            *(p.address for p in self.providers),
            self.funder.address,
            self.validator.address,
            *(n.address for n in self.nodes),
            registry.address,
            work.address,
        ]
        calls = [(token.address, token.encode_abi("totalSupply", []))]
        calls += [(token.address, token.encode_abi("balanceOf", [a])) for a in self.holders]
        for p in self.providers:
            calls.append((registry.address, registry.encode_abi("stakeOf", [p.address])))
            calls.append((registry.address, registry.encode_abi("lockedOf", [p.address])))
            calls.append((registry.address, registry.encode_abi("releaseAt", [p.address])))
        calls.append((work.address, work.encode_abi("escrowOf", [self.pool_id])))
        for n in self.nodes:
            calls.append((pools.address, pools.encode_abi("isMember", [self.pool_id, n.address])))
            calls.append((pools.address, pools.encode_abi("isEjected", [self.pool_id, n.address])))
        self.invariant_calls = calls

    def check_invariants(self) -> None:
        words = iter(self.reader.words(self.invariant_calls))
        (supply,) = next(words)
        balances = {address: next(words)[0] for address in self.holders}
        stakes = [(next(words), next(words)[0], next(words)[0]) for _ in self.providers]
        (escrow,) = next(words)
        membership = [(bool(next(words)[0]), bool(next(words)[0])) for _ in self.nodes]
        registry, work = self.owner.registry.address, self.owner.work.address
        history = " | ".join(self.log)

        # conservation: every token is in some account we track, the registry or the work ledger
        assert supply == sum(balances.values()), f"token supply {supply} != sum of balances; after {history}"
        staked = sum(active + unbonding for (active, unbonding), _, _ in stakes)
        assert balances[registry] == staked, f"registry holds {balances[registry]}, stake is {staked}; {history}"
        assert balances[work] == escrow, f"work ledger holds {balances[work]}, escrow is {escrow}; {history}"
        t = self.totals
        assert t.paid <= t.funded + t.slashed, f"paid {t.paid} > funded {t.funded} + slashed {t.slashed}"
        assert escrow == t.funded + t.slashed - t.paid, f"escrow {escrow} != funded + slashed - paid; {history}"

        # and the chain is where the model says it is
        m = self.model
        assert escrow == m.escrow, f"escrow {escrow}, model {m.escrow}; {history}"
        assert balances[self.funder.address] == m.funder_wallet, history
        for p, ((active, unbonding), locked, release_at) in enumerate(stakes):
            s = m.providers[p]
            chain_view = (balances[self.providers[p].address], active, unbonding, locked, release_at)
            model_view = (s.wallet, s.active, s.unbonding, s.locked, s.release_at)
            assert chain_view == model_view, f"provider {p}: chain {chain_view}, model {model_view}; {history}"
        for n, (member, ejected) in enumerate(membership):
            node = m.nodes[n]
            assert (member, ejected) == (node.member, node.ejected), f"node {n} membership; {history}"

    def statuses(self, keys: Sequence[int]) -> list[WorkStatus]:
        if not keys:
            return []
        work = self.owner.work
        calls = [(work.address, work.encode_abi("getWork", [self.pool_id, WORK_KEYS[k]])) for k in keys]
        return [WorkStatus(words[4]) for words in self.reader.words(calls)]

    def check_works(self, keys: Sequence[int]) -> None:
        expected = [self.model.works[k].status if k in self.model.works else WorkStatus.NONE for k in keys]
        assert self.statuses(keys) == expected, f"work statuses of {keys}; after {' | '.join(self.log)}"

    def check_all_works(self) -> None:
        keys = list(range(len(WORK_KEYS)))
        self.check_works(keys)
        for k, w in self.model.works.items():
            record = self.owner.get_work(self.pool_id, WORK_KEYS[k])
            assert (record.node, record.units, record.submitted_at) == (
                self.nodes[w.node].address,
                w.units,
                w.submitted_at,
            )


@pytest.mark.timeout(900)  # passing takes ~30 s; a failure's shrinking may take minutes more
@settings(
    max_examples=25,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    node_counts=st.lists(st.integers(1, NODES_PER_PROVIDER), min_size=len(PROVIDERS), max_size=len(PROVIDERS)),
    extra_tokens=st.sampled_from([0, 0, 60, 150]),
    funding_tokens=st.sampled_from([0, 50, 50, 50]),
    operations=st.lists(operation, min_size=10, max_size=25),
)
def test_random_operations_match_the_model_and_keep_the_invariants(
    chain: LocalChain,
    ledger_for: Callable[[int], Ledger],
    node_counts: list[int],
    extra_tokens: int,
    funding_tokens: int,
    operations: list[tuple[Any, ...]],
) -> None:
    snapshot = chain.snapshot()
    try:
        harness = Harness(chain, ledger_for, node_counts, extra_tokens * TOKEN)  # fresh clients: fresh nonces
        if funding_tokens:
            harness.do_fund(funding_tokens)
        harness.check_invariants()
        for op in [*operations, *SETTLE]:
            harness.step(op)
        harness.check_all_works()
    finally:
        chain.revert(snapshot)
