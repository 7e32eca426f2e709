"""Gas used by the hot paths of the contracts, next to Prime Intellect's contracts and our goals.

Run: `.venv/bin/python benchmarks/gas.py [--json PATH]` (or `make gas`). It starts its own anvil, deploys
the four contracts, performs each operation as a real transaction and reads `gasUsed` from the receipt.
A batch's leaves are work keys (sha256 of random bytes) worth a few thousand units each, as a worker submits them;
the provider being onboarded is a new one (its stake slots start empty), as is each submitting node.
Batches (issue 37): one Merkle root per batch of 1, 32, 256 and 1,024 files (`ledger.merkle`), submitted into one of
the node's numbered batch slots, two words whatever the count. The goals are the steady state: a slot reused, the
node's earlier batch in it claimed, so its two words are rewritten (5,000 gas each); the first use of a slot, two
fresh words (22,100 each), is reported apart ("new slot"). Then one leaf challenged with its proof at 1,024 leaves,
one batch invalidated because its leaf list was never made available (no proof), one leaf refused, an owner's
ejection and a leave, and batches claimed after the window (an owner-ejected node's too). Then where submitBatch(32)'s
gas goes in the steady state, from anvil's step trace (`--steps-tracing`): the transaction, its calldata, the record's
two words, the membership lookup, the event.

A benchmark, not a test: missing a goal prints "no" and still exits 0. Only a failure to run at all
(no anvil, a revert) exits 1: then there is nothing to report.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3.types import TxReceipt

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.errors import LedgerError
from ledger.merkle import BatchTree, Leaf
from ledger.types import BatchStatus, PoolConfig, Reason

TOKEN = 10**18
MIN_STAKE = 100 * TOKEN
WINDOW = 3600
LEAF_COUNTS = (1, 32, 256, 1024)  # files per batch root
CLAIMED_BATCHES = 16  # batches claimed in one claimBatches, reported per batch
NEW_SLOT = ", new slot"  # the rows of a batch in a slot never used before: two fresh storage words

# Prime Intellect's protocol contracts measured on anvil, for the same jobs: onboarding a node; recording one file
# of work in one transaction (their one-key submission); invalidating a node's submission for one bad file, which
# slashes and ejects it (their one-key invalidation).
ANCHOR = {"onboarding": 1_055_839, "submitBatch(1)": 239_442, "invalidateBatch(1024) with proof": 406_000}
GOAL = {
    "onboarding": 400_000,
    # issue 37: one root per batch, challenged file by file; a node's batch reuses a settled slot
    "submitBatch(32) per file": 1_500,
    "submitBatch(1024) per file": 150,
    "invalidateBatch(1024) with proof": 150_000,
    "invalidateUnavailableBatch": 150_000,  # a challenge too, with no proof to check
}


@dataclass(frozen=True)
class Row:
    operation: str
    gas: int
    anchor: int | None = None
    goal: int | None = None

    @property
    def ratio(self) -> float | None:
        return self.anchor / self.gas if self.anchor else None

    @property
    def goal_met(self) -> bool | None:
        return None if self.goal is None else self.gas <= self.goal


def row(operation: str, gas: int) -> Row:
    return Row(operation, gas, ANCHOR.get(operation), GOAL.get(operation))


def gas(receipt: TxReceipt) -> int:
    return int(receipt["gasUsed"])


def random_key() -> bytes:
    return hashlib.sha256(os.urandom(64)).digest()  # what a worker submits: the sha256 of a rollout file


def random_units() -> int:
    return random.randint(2_000, 6_000)  # output tokens of one rollout file


def new_node(chain: LocalChain) -> LocalAccount:
    """A fresh node key with gas money."""
    node: LocalAccount = Account.create()
    chain.w3.provider.make_request("anvil_setBalance", [node.address, hex(10**20)])  # type: ignore[arg-type]
    return node


def random_batch(count: int) -> BatchTree:
    return BatchTree([Leaf(random_key(), random_units()) for _ in range(count)])


def onboard(chain: LocalChain, owner: Ledger, provider: Ledger, pool_id: int) -> tuple[Ledger, list[Row]]:
    """A new provider brings a new node into the pool: approve + stake + addNode + join."""
    node = new_node(chain)
    owner.mint(provider.address, 1_000 * TOKEN)  # the provider keeps a balance after staking
    steps = [
        ("approve", provider.approve(provider.registry.address, MIN_STAKE)),
        ("stake", provider.stake(MIN_STAKE)),  # the allowance is there: one transaction
        ("addNode", provider.add_node(node)),
    ]
    node_ledger = provider.as_account(node)
    steps.append(("join", node_ledger.join(pool_id)))
    rows = [row(f"  {name}", gas(receipt)) for name, receipt in steps]
    return node_ledger, [*rows, row("onboarding", sum(r.gas for r in rows))]


def where_it_goes(chain: LocalChain, receipt: TxReceipt) -> dict[str, int]:
    """A transaction's gas by what pays for it, from anvil's step trace: the transaction's base cost, its calldata,
    storage reads and writes, the calls it makes (the call and everything the callee runs: submitBatch's one call is
    the membership lookup), its events, and the rest of the execution (dispatch, checks, mapping hashes, encoding)."""
    tx_hash = receipt["transactionHash"]
    data = bytes(chain.w3.eth.get_transaction(tx_hash)["input"])
    options = {"disableStack": True, "disableStorage": True}
    response = chain.w3.provider.make_request("debug_traceTransaction", ["0x" + bytes(tx_hash).hex(), options])  # type: ignore[arg-type]
    steps = response["result"]["structLogs"]
    if not steps:
        raise LedgerError("anvil returned no steps: it must run with --steps-tracing")
    parts = {
        "transaction": 21_000,
        f"calldata ({len(data)} bytes)": sum(16 if byte else 4 for byte in data),
        "storage": 0,
        "calls": 0,
        "event": 0,
    }
    for i, step in enumerate(steps):
        op, depth = step["op"], step["depth"]
        if depth > 1:
            parts["calls"] += step["gasCost"]
        elif op in ("CALL", "STATICCALL", "DELEGATECALL"):
            # gasCost counts the gas forwarded: the call's own cost is what was gone by its return less what ran inside
            back = next(j for j in range(i + 1, len(steps)) if steps[j]["depth"] == depth)
            inside = sum(inner["gasCost"] for inner in steps[i + 1 : back])
            parts["calls"] += step["gas"] - steps[back]["gas"] - inside
        elif op in ("SLOAD", "SSTORE"):
            parts["storage"] += step["gasCost"]
        elif op.startswith("LOG"):
            parts["event"] += step["gasCost"]
    parts["the rest of the execution"] = gas(receipt) - sum(parts.values())
    return parts


def measure(chain: LocalChain) -> tuple[list[Row], dict[str, int]]:
    deployment = chain.deploy()
    owner = Ledger(chain.w3, deployment, dev_account(0))
    validator = dev_account(9)
    pool_id = owner.create_pool(
        PoolConfig(
            name="gas-benchmark",
            model_hash=random_key(),
            spec_uri="ipfs://bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi",
            trainer=owner.address,
            min_stake_per_node=MIN_STAKE,
            challenge_window=WINDOW,
            reward_per_unit=10**12,
            slash_amount=50 * TOKEN,
        )
    )
    owner.set_validator(pool_id, validator.address)
    owner.mint(owner.address, 10_000 * TOKEN)
    owner.fund_rewards(pool_id, 10_000 * TOKEN)

    # A first provider warms the registry's own token balance, so the measured one is a typical newcomer; a second
    # one's node is slashed, which warms the registry's burned total, so the measured invalidations are typical ones.
    judge = owner.as_account(validator)
    onboard(chain, owner, Ledger(chain.w3, deployment, dev_account(1)), pool_id)
    slashed, _ = onboard(chain, owner, Ledger(chain.w3, deployment, dev_account(3)), pool_id)
    unlisted = random_batch(1)
    slashed.submit_batch(pool_id, unlisted.root, unlisted.count, unlisted.total_units)
    judge.invalidate_unavailable_batch(pool_id, slashed.address, unlisted.root)
    provider = Ledger(chain.w3, deployment, dev_account(2))
    node, rows = onboard(chain, owner, provider, pool_id)

    # Batches: one root per batch, whatever its count, each in a slot of its own that the node never used (slots 0 to
    # 3): two fresh words. The node is paid for them below, which settles their slots for the steady state.
    trees = {count: random_batch(count) for count in LEAF_COUNTS}
    first_use = {
        count: node.submit_batch(pool_id, tree.root, tree.count, tree.total_units, slot=slot)
        for slot, (count, tree) in enumerate(trees.items())
    }
    claimable = [random_batch(32) for _ in range(CLAIMED_BATCHES)]
    for slot, tree in enumerate(claimable, start=len(LEAF_COUNTS)):
        node.submit_batch(pool_id, tree.root, tree.count, tree.total_units, slot=slot)
    largest = trees[max(LEAF_COUNTS)]
    refused = judge.refuse_leaf(
        pool_id, node.address, largest.root, largest.proof(largest.count // 3), Reason.PROOF_INVALID
    )
    # A leaf shown bad, with its proof of log2(1,024) = 10 siblings: the batch void, the node slashed and ejected.
    cheater, _ = onboard(chain, owner, Ledger(chain.w3, deployment, dev_account(7)), pool_id)
    bad = random_batch(max(LEAF_COUNTS))
    cheater.submit_batch(pool_id, bad.root, bad.count, bad.total_units)
    shown = judge.invalidate_batch(pool_id, cheater.address, bad.root, bad.proof(bad.count - 1), Reason.BAD_FORMAT)
    # A batch whose leaf list never reached the coordinator: no leaf to prove, the same slash and ejection.
    hidden_node, _ = onboard(chain, owner, Ledger(chain.w3, deployment, dev_account(8)), pool_id)
    hidden = random_batch(max(LEAF_COUNTS))
    hidden_node.submit_batch(pool_id, hidden.root, hidden.count, hidden.total_units)
    unavailable = judge.invalidate_unavailable_batch(pool_id, hidden_node.address, hidden.root)

    # The owner's ejection: no new work, the earlier batches stay claimable after their window.
    dismissed, _ = onboard(chain, owner, Ledger(chain.w3, deployment, dev_account(6)), pool_id)
    kept = random_batch(32)
    dismissed.submit_batch(pool_id, kept.root, kept.count, kept.total_units)
    ejected = owner.eject(pool_id, dismissed.address)

    # Leaving: the lock is held one challenge window, then anyone releases it.
    leaver, _ = onboard(chain, owner, Ledger(chain.w3, deployment, dev_account(4)), pool_id)
    last = random_batch(32)
    leaver.submit_batch(pool_id, last.root, last.count, last.total_units)
    left = leaver.leave(pool_id)

    # Claiming, after the window: one batch, then sixteen, then the rest of the first batches (not measured). Anyone
    # may claim; the provider is paid.
    chain.increase_time(WINDOW)
    claimer = owner.as_account(validator)
    released = claimer.release_stake(pool_id, leaver.address)
    slot_of_largest = len(LEAF_COUNTS) - 1
    claimed_one = claimer.claim_batches(pool_id, node.address, [largest.root], slots=[slot_of_largest])
    claimed_many = claimer.claim_batches(
        pool_id,
        node.address,
        [tree.root for tree in claimable],
        slots=list(range(len(LEAF_COUNTS), len(LEAF_COUNTS) + CLAIMED_BATCHES)),
    )
    claimer.claim_batches(pool_id, node.address, [trees[c].root for c in LEAF_COUNTS[:-1]], slots=[0, 1, 2])
    ejected_claim = claimer.claim_batches(pool_id, dismissed.address, [kept.root])

    # The steady state: the node's next batches go into the slots it was paid for, rewriting their two words.
    steady: dict[int, TxReceipt] = {}
    for slot, count in enumerate(LEAF_COUNTS):
        if node.get_slot(pool_id, node.address, slot).status != BatchStatus.CLAIMED:
            raise LedgerError(f"slot {slot} is not settled: the steady state would not be measured")
        tree = random_batch(count)
        steady[count] = node.submit_batch(pool_id, tree.root, tree.count, tree.total_units, slot=slot)

    for suffix, receipts in (("", steady), (NEW_SLOT, first_use)):
        for count, receipt in receipts.items():
            used = gas(receipt)
            rows += [
                row(f"submitBatch({count}){suffix}", used),
                row(f"submitBatch({count}) per file{suffix}", used // count),
            ]
    rows += [
        row(f"refuseLeaf({largest.count}) with proof", gas(refused)),
        row(f"invalidateBatch({bad.count}) with proof", gas(shown)),
        row("invalidateUnavailableBatch", gas(unavailable)),
        row("eject (owner)", gas(ejected)),
        row("leave", gas(left)),
        row("releaseStake", gas(released)),
        row("claimBatches(1)", gas(claimed_one)),
        row(f"claimBatches({CLAIMED_BATCHES})", gas(claimed_many)),
        row(f"claimBatches({CLAIMED_BATCHES}) per batch", gas(claimed_many) // CLAIMED_BATCHES),
        row("claimBatches(1), owner-ejected", gas(ejected_claim)),
    ]
    breakdown = where_it_goes(chain, steady[32])
    return rows, breakdown


def print_table(rows: list[Row]) -> None:
    header = f"{'operation':<38}{'ours':>11}{'anchor':>12}{'goal':>11}{'anchor/ours':>13}  goal met"
    print(header)
    print("-" * len(header))
    for r in rows:
        anchor = f"{r.anchor:,}" if r.anchor else "-"
        goal = f"<= {r.goal:,}" if r.goal else "-"
        ratio = f"{r.ratio:.1f}x" if r.ratio else "-"
        met = {True: "yes", False: "NO", None: "-"}[r.goal_met]
        print(f"{r.operation:<38}{r.gas:>11,}{anchor:>12}{goal:>11}{ratio:>13}  {met}")
    missed = [r.operation.strip() for r in rows if r.goal_met is False]
    print()
    print(f"goals missed: {', '.join(missed)}" if missed else "all goals met")


def print_breakdown(parts: dict[str, int]) -> None:
    total = sum(parts.values())
    print()
    print(f"where submitBatch(32)'s {total:,} gas goes in a reused slot (calls: the ComputePool's membership lookup)")
    for name, used in parts.items():
        print(f"  {name:<30}{used:>9,}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to PATH as JSON")
    args = parser.parse_args()
    try:
        with LocalChain(extra_args=("--steps-tracing",)) as chain:  # steps for where_it_goes; gas is the same
            rows, breakdown = measure(chain)
    except LedgerError as exc:
        print(f"gas benchmark could not run: {exc}", file=sys.stderr)
        return 1
    print_table(rows)
    print_breakdown(breakdown)
    if args.json:
        figures = [
            {**asdict(r), "operation": r.operation.strip(), "ratio": r.ratio, "goal_met": r.goal_met} for r in rows
        ]
        record = {"unit": "gas", "operations": figures, "submitBatch(32) breakdown": breakdown}
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
