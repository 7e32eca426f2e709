"""EventFollower on a real chain: the batch events' decoded fields, which events are followed, pool filter, paging,
cursor, confirmations, reorganisations."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from web3.types import TxReceipt

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.deployment import Deployment
from ledger.errors import LedgerError, RpcUnavailable
from ledger.events import (
    BatchesClaimed,
    BatchInvalidated,
    BatchSubmitted,
    CursorFile,
    EventFollower,
    EventPosition,
    LeafRefused,
    LedgerEvent,
    batch_invalidations,
    leaf_refusals,
)
from ledger.merkle import BatchTree
from ledger.types import BatchStatus, Reason
from tests.conftest import TOKEN
from tests.ledger.helpers import batch_of, commit_batch, make_pool, onboard, work_key

LedgerFor = Callable[[int], Ledger]
OWNER, PROVIDER, VALIDATOR = 0, 1, 9
NODE_A, NODE_B = 6, 7
WINDOW = 3600
REWARD_PER_UNIT = 10**15
SLASH = 50 * TOKEN


@dataclass
class Setup:
    owner: Ledger  # also funds the escrow
    provider: Ledger
    validator: Ledger
    node: Ledger
    pool_id: int
    reader: Ledger  # read-only, what a follower uses


@pytest.fixture
def reader(chain: LocalChain, deployment: Deployment) -> Ledger:
    """A read-only client, as a follower has."""
    return Ledger(chain.w3, deployment)


@pytest.fixture
def setup(ledger_for: LedgerFor, reader: Ledger) -> Setup:
    """A pool (window 1 h, slash 50) with a validator, 100 tokens of escrow, and one onboarded node."""
    owner, provider, validator = ledger_for(OWNER), ledger_for(PROVIDER), ledger_for(VALIDATOR)
    pool_id = make_pool(owner, challenge_window=WINDOW, reward_per_unit=REWARD_PER_UNIT, slash_amount=SLASH)
    owner.set_validator(pool_id, validator.address)
    owner.mint(owner.address, 100 * TOKEN)
    owner.fund_rewards(pool_id, 100 * TOKEN)
    node = onboard(owner, provider, dev_account(NODE_A), pool_id, stake_tokens=200)
    return Setup(owner, provider, validator, node, pool_id, reader)


def position(ledger: Ledger, receipt: TxReceipt) -> EventPosition:
    """Where the receipt's only WorkLedger log sits (block, log index, tx hash)."""
    (log,) = [entry for entry in receipt["logs"] if entry["address"] == ledger.work.address]
    return EventPosition(log["blockNumber"], log["logIndex"], "0x" + bytes(log["transactionHash"]).hex())


def roots(found: list[LedgerEvent]) -> list[bytes]:
    """The roots of `found`, which are all submissions."""
    assert all(isinstance(e, BatchSubmitted) for e in found), found
    return [e.root for e in found if isinstance(e, BatchSubmitted)]


def tree_of(label: str, units: list[int]) -> BatchTree:
    """A batch of files labelled `label-0`, `label-1` ... worth `units`."""
    return batch_of(*[(f"{label}-{i}", u) for i, u in enumerate(units)])


def submit_tree(node: Ledger, pool_id: int, tree: BatchTree) -> TxReceipt:
    return node.submit_batch(pool_id, tree.root, tree.count, tree.total_units)


def submit_many(s: Setup, count: int, label: str, *, empty_blocks: int = 0) -> list[bytes]:
    """`count` batches of one file each, one block each, with `empty_blocks` mined after each; their roots."""
    found = []
    for i in range(count):
        tree, _ = commit_batch(s.node, s.pool_id, (f"{label}-{i}", 1000 + i))
        found.append(tree.root)
        for _ in range(empty_blocks):
            s.node.w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    return found


# --- which events -----------------------------------------------------------------------------------------


def test_poll_with_no_new_blocks_returns_nothing(setup: Setup) -> None:
    s = setup
    commit_batch(s.node, s.pool_id, ("once", 100))
    follower = EventFollower(s.reader)
    assert len(follower.poll()) == 1
    assert follower.poll() == []


def test_following_only_some_events_skips_the_others(chain: LocalChain, setup: Setup) -> None:
    s = setup
    tree, _ = commit_batch(s.node, s.pool_id, ("claimed", 100))
    chain.increase_time(WINDOW)
    s.owner.claim_batches(s.pool_id, s.node.address, [tree.root])

    found = EventFollower(s.reader, events=("BatchesClaimed",)).poll()

    assert [type(e) for e in found] == [BatchesClaimed]


def test_following_an_unknown_event_raises_ledger_error(reader: Ledger) -> None:
    with pytest.raises(LedgerError, match="WorkFunded"):
        EventFollower(reader, events=("BatchSubmitted", "WorkFunded"))


# --- decoding ---------------------------------------------------------------------------------------------


def test_poll_decodes_every_batch_event_with_its_fields(chain: LocalChain, setup: Setup) -> None:
    """A batch submitted, one of its leaves refused and the rest claimed; a cheater's batch invalidated with a proof
    and its other batch as unavailable (no leaf: leaf index and work key None)."""
    s = setup
    cheater = onboard(s.owner, s.provider, dev_account(NODE_B), s.pool_id, stake_tokens=0)
    honest, shown, hidden = tree_of("honest", [100, 200, 300]), tree_of("shown", [5, 6, 7]), tree_of("hidden", [9])
    submitted = submit_tree(s.node, s.pool_id, honest)
    shown_at = submit_tree(cheater, s.pool_id, shown)
    hidden_at = submit_tree(cheater, s.pool_id, hidden)
    refused = s.validator.refuse_leaf(s.pool_id, s.node.address, honest.root, honest.proof(1), Reason.PROOF_INVALID)
    proven = s.validator.invalidate_batch(s.pool_id, cheater.address, shown.root, shown.proof(2), Reason.BAD_FORMAT)
    unavailable = s.validator.invalidate_unavailable_batch(s.pool_id, cheater.address, hidden.root)
    chain.increase_time(WINDOW)
    claimed = s.owner.claim_batches(s.pool_id, s.node.address, [honest.root])

    found = EventFollower(s.reader).poll()

    node, validator, at = s.node.address, s.validator.address, lambda r: position(s.reader, r)
    assert found == [
        BatchSubmitted(s.pool_id, honest.root, node, 3, 600, at(submitted), slot=0),
        BatchSubmitted(s.pool_id, shown.root, cheater.address, 3, 18, at(shown_at), slot=0),
        BatchSubmitted(s.pool_id, hidden.root, cheater.address, 1, 9, at(hidden_at), slot=1),
        LeafRefused(
            s.pool_id, honest.root, node, validator, 1, work_key("honest-1"), 200, Reason.PROOF_INVALID, at(refused)
        ),
        BatchInvalidated(
            s.pool_id,
            shown.root,
            cheater.address,
            validator,
            2,
            work_key("shown-2"),
            Reason.BAD_FORMAT,
            SLASH,
            at(proven),
        ),
        BatchInvalidated(
            s.pool_id,
            hidden.root,
            cheater.address,
            validator,
            None,
            None,
            Reason.FILE_UNAVAILABLE,
            100 * TOKEN - SLASH,
            at(unavailable),
        ),  # slashed: what the first slash left of the cheater's lock
        BatchesClaimed(
            s.pool_id, s.provider.address, node, (600 - 200) * REWARD_PER_UNIT, (honest.root,), at(claimed), slots=(0,)
        ),
    ]


def test_submissions_and_claims_carry_the_slots_of_their_batches(chain: LocalChain, setup: Setup) -> None:
    """`BatchSubmitted.slot` is the slot the batch went into, reused ones included; `BatchesClaimed` pairs each root
    with its slot, in the claim's order."""
    s = setup
    first, second, third, fourth = (tree_of(label, [10, 20]) for label in ("first", "second", "third", "fourth"))
    submit_tree(s.node, s.pool_id, first)  # slot 0
    submit_tree(s.node, s.pool_id, second)  # slot 1
    chain.increase_time(WINDOW)
    s.owner.claim_batches(s.pool_id, s.node.address, [second.root, first.root], slots=[1, 0])
    s.node.submit_batch(s.pool_id, third.root, third.count, third.total_units, slot=1)  # a settled slot, named
    submit_tree(s.node, s.pool_id, fourth)  # the lowest free slot: 0, settled

    found = EventFollower(s.reader, events=("BatchSubmitted", "BatchesClaimed")).poll()

    submitted = [(e.root, e.slot) for e in found if isinstance(e, BatchSubmitted)]
    assert submitted == [(first.root, 0), (second.root, 1), (third.root, 1), (fourth.root, 0)]
    (claimed,) = [e for e in found if isinstance(e, BatchesClaimed)]
    assert (claimed.roots, claimed.slots) == ((second.root, first.root), (1, 0))
    assert claimed.amount == 60 * REWARD_PER_UNIT


def test_a_follower_of_some_events_returns_only_those_in_chain_order(chain: LocalChain, setup: Setup) -> None:
    s = setup
    other = onboard(s.owner, s.provider, dev_account(NODE_B), s.pool_id, stake_tokens=0)
    first, second, paid = tree_of("first", [10, 20]), tree_of("second", [1, 2]), tree_of("paid", [5])
    first_at = submit_tree(s.node, s.pool_id, first)
    submit_tree(other, s.pool_id, paid)
    submit_tree(s.node, s.pool_id, second)
    s.validator.refuse_leaf(s.pool_id, s.node.address, first.root, first.proof(0), Reason.PROOF_INVALID)  # not followed
    s.validator.invalidate_unavailable_batch(s.pool_id, s.node.address, first.root)
    chain.increase_time(WINDOW)
    s.owner.claim_batches(s.pool_id, other.address, [paid.root])  # not followed

    found = EventFollower(s.reader, events=("BatchSubmitted", "BatchInvalidated")).poll()

    assert [type(e).__name__ for e in found] == [
        "BatchSubmitted", "BatchSubmitted", "BatchSubmitted", "BatchInvalidated",
    ]  # fmt: skip
    named = [e.root for e in found if isinstance(e, BatchSubmitted | BatchInvalidated)]
    assert named == [first.root, paid.root, second.root, first.root]
    assert found[0] == BatchSubmitted(s.pool_id, first.root, s.node.address, 2, 30, position(s.reader, first_at))
    assert [e.at.block_number for e in found] == sorted(e.at.block_number for e in found)


def test_batch_invalidations_and_leaf_refusals_are_keyed_by_node_root_and_leaf(setup: Setup) -> None:
    s = setup
    other = onboard(s.owner, s.provider, dev_account(NODE_B), s.pool_id, stake_tokens=0)
    tree = tree_of("one root, two records", [1, 2, 3])
    for node in (s.node, other):
        submit_tree(node, s.pool_id, tree)
    s.validator.refuse_leaf(s.pool_id, s.node.address, tree.root, tree.proof(0), Reason.PROOF_INVALID)
    s.validator.refuse_leaf(s.pool_id, s.node.address, tree.root, tree.proof(2), Reason.REWARD_MISMATCH)
    s.validator.refuse_leaf(s.pool_id, other.address, tree.root, tree.proof(2), Reason.PROOF_INVALID)
    s.validator.invalidate_batch(s.pool_id, s.node.address, tree.root, tree.proof(1), Reason.BAD_FORMAT)
    s.validator.invalidate_unavailable_batch(s.pool_id, other.address, tree.root)

    every = batch_invalidations(s.reader, s.pool_id)
    refused = leaf_refusals(s.reader, s.pool_id)

    assert {index: (e.leaf_index, e.reason) for index, e in every.items()} == {
        (s.node.address, tree.root): (1, Reason.BAD_FORMAT),
        (other.address, tree.root): (None, Reason.FILE_UNAVAILABLE),
    }
    assert {index: e.reason for index, e in refused.items()} == {
        (s.node.address, tree.root, 0): Reason.PROOF_INVALID,
        (s.node.address, tree.root, 2): Reason.REWARD_MISMATCH,
        (other.address, tree.root, 2): Reason.PROOF_INVALID,
    }
    assert list(batch_invalidations(s.reader, s.pool_id, other.address.lower())) == [(other.address, tree.root)]
    assert list(leaf_refusals(s.reader, s.pool_id, other.address.lower())) == [(other.address, tree.root, 2)]
    assert batch_invalidations(s.reader, s.pool_id + 1) == leaf_refusals(s.reader, s.pool_id + 1) == {}


# --- filtering and paging ----------------------------------------------------------------------------------


def test_pool_filter_ignores_another_pools_events(setup: Setup) -> None:
    s = setup
    other_pool = make_pool(s.owner, challenge_window=WINDOW, slash_amount=SLASH)
    s.owner.set_validator(other_pool, s.validator.address)
    other_node = onboard(s.owner, s.provider, dev_account(NODE_B), other_pool, stake_tokens=100)
    mine, _ = commit_batch(s.node, s.pool_id, ("mine", 100))
    theirs, _ = commit_batch(other_node, other_pool, ("theirs", 200))
    commit_batch(other_node, other_pool, ("theirs-1", 1), ("theirs-2", 2))
    s.validator.invalidate_batch(other_pool, other_node.address, theirs.root, theirs.proof(0), Reason.BAD_FORMAT)
    mine_too, _ = commit_batch(s.node, s.pool_id, ("mine-1", 300))

    ours = EventFollower(s.reader, pool_id=s.pool_id).poll()
    everything = EventFollower(s.reader).poll()

    assert roots(ours) == [mine.root, mine_too.root]
    assert {e.pool_id for e in ours} == {s.pool_id}
    assert len(everything) == 5
    assert [e for e in everything if e.pool_id == s.pool_id] == ours


def test_small_pages_return_the_same_events_as_one_big_page(setup: Setup) -> None:
    s = setup
    submitted = submit_many(setup, 7, "paged", empty_blocks=2)  # 21 blocks, events in every third
    last, _ = commit_batch(s.node, s.pool_id, ("paged-batch-0", 5), ("paged-batch-1", 6))

    one_page = EventFollower(s.reader, page_size=100_000).poll()
    small_pages = EventFollower(s.reader, page_size=2).poll()
    single_blocks = EventFollower(s.reader, page_size=1).poll()

    assert roots(one_page) == [*submitted, last.root]
    assert small_pages == one_page
    assert single_blocks == one_page


def test_small_pages_resume_between_polls_without_gaps(setup: Setup) -> None:
    s = setup
    follower = EventFollower(s.reader, page_size=2)
    seen = []
    for round_ in range(4):
        submit_many(s, 3, f"round-{round_}", empty_blocks=1)
        seen += follower.poll()

    assert seen == EventFollower(s.reader).poll()
    assert len(seen) == 12


# --- the cursor --------------------------------------------------------------------------------------------


def test_cursor_file_lets_a_restarted_follower_resume_exactly_after_the_first(tmp_path: Path, setup: Setup) -> None:
    s = setup
    cursor_path = tmp_path / "state" / "cursor.json"  # the folder does not exist yet
    submitted = submit_many(s, 3, "before")
    first = EventFollower(s.reader, cursor=CursorFile(cursor_path), page_size=2)
    before = first.poll()
    submit_many(s, 2, "between", empty_blocks=1)
    del first  # the process stops; only the file survives

    second = EventFollower(s.reader, cursor=CursorFile(cursor_path), start_block=0)  # the cursor wins
    after = second.poll()
    again = second.poll()
    submit_many(s, 1, "later")
    third = EventFollower(s.reader, cursor=CursorFile(cursor_path))
    last = third.poll()

    everything = EventFollower(s.reader).poll()
    assert roots(before) == submitted
    assert before + after + last == everything  # none skipped
    assert len(set(everything)) == len(everything) == 6  # none twice
    assert again == []
    assert CursorFile(cursor_path).load(default=0) == s.reader.w3.eth.block_number + 1


def test_cursor_file_missing_starts_at_the_default(tmp_path: Path) -> None:
    assert CursorFile(tmp_path / "absent.json").load(default=42) == 42


def test_cursor_file_round_trips_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    cursor = CursorFile(tmp_path / "cursor.json")
    cursor.save(17)
    cursor.save(18)
    assert cursor.load(default=0) == 18
    assert [p.name for p in tmp_path.iterdir()] == ["cursor.json"]


@pytest.mark.parametrize(
    "content",
    ["", "not json", "[]", "{}", '{"block": 3}', '{"next_block": "soon"}', '{"next_block": null}', '"7"'],
    ids=["empty", "not-json", "list", "no-key", "wrong-key", "text-value", "null-value", "json-string"],
)
def test_corrupt_cursor_file_raises_ledger_error(tmp_path: Path, reader: Ledger, content: str) -> None:
    path = tmp_path / "cursor.json"
    path.write_text(content)
    with pytest.raises(LedgerError, match="corrupt"):
        EventFollower(reader, cursor=CursorFile(path))


def test_cursor_file_with_invalid_utf8_raises_ledger_error(tmp_path: Path, reader: Ledger) -> None:
    path = tmp_path / "cursor.json"
    path.write_bytes(b"\xff\xfe{")
    with pytest.raises(LedgerError, match="corrupt"):
        EventFollower(reader, cursor=CursorFile(path))


@pytest.mark.parametrize("content", ['{"next_block": -3}', '{"next_block": 2.7}', '{"next_block": true}'])
def test_cursor_file_with_a_value_that_is_no_block_number_raises_ledger_error(
    tmp_path: Path, reader: Ledger, content: str
) -> None:
    path = tmp_path / "cursor.json"
    path.write_text(content)
    with pytest.raises(LedgerError, match="corrupt"):
        EventFollower(reader, cursor=CursorFile(path))


def test_a_poll_that_fails_partway_loses_no_events(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    s = setup
    follower = EventFollower(s.reader, page_size=2, start_block=s.reader.w3.eth.block_number + 1)
    submitted = submit_many(s, 6, "flaky")  # pages of two blocks: the third read fails
    read_logs, reads = follower._logs, []

    def flaky_logs(first: int, last: int) -> list[Any]:
        reads.append(first)
        if len(reads) == 3:
            raise RpcUnavailable(s.reader.deployment.rpc_url, "read logs: connection reset")
        return read_logs(first, last)

    monkeypatch.setattr(follower, "_logs", flaky_logs)
    with pytest.raises(RpcUnavailable):
        follower.poll()

    assert roots(follower.poll()) == submitted


# --- confirmations -----------------------------------------------------------------------------------------


def test_confirmations_hold_back_the_newest_blocks(chain: LocalChain, setup: Setup) -> None:
    s = setup
    submitted = submit_many(s, 3, "confirm")  # blocks h-2, h-1, h
    follower = EventFollower(s.reader, confirmations=2)

    assert roots(follower.poll()) == submitted[:1]
    chain.mine()
    assert roots(follower.poll()) == submitted[1:2]
    assert follower.poll() == []
    chain.mine()
    chain.mine()
    assert roots(follower.poll()) == submitted[2:]


def test_confirmations_beyond_the_chain_height_return_nothing(setup: Setup) -> None:
    submit_many(setup, 1, "deep")
    follower = EventFollower(setup.reader, confirmations=10_000)
    assert follower.poll() == []
    assert follower.next_block == setup.reader.deployment.block


# --- reorganisations ---------------------------------------------------------------------------------------


def signed_batch(s: Setup, tree: BatchTree, *, nonce: int | None = None, slot: int = 0) -> str:
    """A raw signed submitBatch of the node into its slot `slot` (its next nonce), for anvil to place into blocks of
    a reorganisation."""
    return signed_call(
        s, s.node.work.functions.submitBatch(s.pool_id, slot, tree.root, tree.count, tree.total_units), nonce=nonce
    )


def signed_call(s: Setup, call: Any, *, nonce: int | None) -> str:
    """`call` (a bound WorkLedger function) signed by the node with `nonce` (None: its next)."""
    account = dev_account(NODE_A)
    w3 = s.reader.w3
    tx = call.build_transaction(
        {
            "from": account.address,
            "nonce": w3.eth.get_transaction_count(account.address) if nonce is None else nonce,
            "gas": 300_000,
            "maxFeePerGas": 10 * 10**9,
            "maxPriorityFeePerGas": 10**9,
            "chainId": w3.eth.chain_id,
        }
    )
    return "0x" + bytes(account.sign_transaction(tx).raw_transaction).hex()


def reorg(chain: LocalChain, depth: int, transactions: list[tuple[str, int]]) -> None:
    """anvil replaces the newest `depth` blocks with as many new ones, holding `transactions` (raw, block offset)."""
    response = chain.w3.provider.make_request("anvil_reorg", [depth, [list(t) for t in transactions]])  # type: ignore[arg-type]
    assert "error" not in response, response


def test_a_batch_a_reorganisation_puts_into_blocks_already_read_is_still_returned(
    chain: LocalChain, setup: Setup
) -> None:
    """The attack of issue 19 (item 9): a submission lands behind the cursor, in a block the follower has passed.
    It is still seen, once."""
    s = setup
    follower = EventFollower(s.reader, events=("BatchSubmitted",))
    for _ in range(4):
        chain.mine()
    assert follower.poll() == []
    head = chain.w3.eth.block_number
    tree = tree_of("behind", [3, 4, 5])
    reorg(chain, 3, [(signed_batch(s, tree), 1)])  # into block head - 1, already read
    assert chain.w3.eth.block_number == head  # no new block: a follower without reorg checks sees nothing

    found = follower.poll()

    assert [(type(e), e.at.block_number) for e in found] == [(BatchSubmitted, head - 1)]
    assert found[0] == BatchSubmitted(s.pool_id, tree.root, s.node.address, 3, 12, found[0].at, slot=0)
    assert follower.rewound_to is not None and follower.rewound_to <= head - 1
    assert follower.reorgs == 1
    assert follower.poll() == []  # and read once


def test_a_batch_a_reorganisation_removed_is_not_returned_again_and_its_replacement_is(
    chain: LocalChain, setup: Setup
) -> None:
    s = setup
    follower = EventFollower(s.reader, events=("BatchSubmitted",))
    follower.poll()
    nonce = chain.w3.eth.get_transaction_count(dev_account(NODE_A).address)
    orphan, replacement = tree_of("orphan", [1]), tree_of("replacement", [2, 2])
    submit_tree(s.node, s.pool_id, orphan)
    chain.mine()
    assert [e.root for e in follower.poll() if isinstance(e, BatchSubmitted)] == [orphan.root]
    reorg(chain, 2, [(signed_batch(s, replacement, nonce=nonce), 0)])  # the same nonce and slot: the orphan is gone

    found = follower.poll()

    assert [e.root for e in found if isinstance(e, BatchSubmitted)] == [replacement.root]
    assert follower.rewound_to is not None
    assert s.reader.get_batch(s.pool_id, s.node.address, orphan.root).status == BatchStatus.NONE
    assert s.reader.get_batch(s.pool_id, s.node.address, orphan.root, slot=0).status == BatchStatus.NONE
    assert s.reader.get_slot(s.pool_id, s.node.address, 0).root == replacement.root
    assert s.reader.get_batch(s.pool_id, s.node.address, replacement.root).status == BatchStatus.PENDING


def test_a_chain_reverted_to_a_snapshot_and_built_again_is_read_again(chain: LocalChain, setup: Setup) -> None:
    """evm_revert is the other way a local chain reorganises: the blocks read are gone and new ones take their
    numbers."""
    s = setup
    snapshot = chain.snapshot()
    for _ in range(3):
        chain.mine()
    follower = EventFollower(s.reader)
    assert follower.poll() == []
    passed = follower.next_block
    chain.revert(snapshot)
    submitted = submit_many(s, 2, "rebuilt")  # blocks the follower already passed, by number
    assert s.reader.w3.eth.block_number < passed

    found = follower.poll()

    assert roots(found) == submitted


def test_a_follower_restarted_from_its_cursor_file_notices_a_reorganisation_made_while_it_was_down(
    tmp_path: Path, chain: LocalChain, setup: Setup
) -> None:
    s = setup
    path = tmp_path / "cursor.json"
    first = EventFollower(s.reader, cursor=CursorFile(path))
    for _ in range(3):
        chain.mine()
    first.poll()
    del first
    while_down = tree_of("while-down", [9])
    reorg(chain, 2, [(signed_batch(s, while_down), 0)])

    found = EventFollower(s.reader, cursor=CursorFile(path)).poll()

    assert roots(found) == [while_down.root]


def test_a_reorganisation_deeper_than_the_remembered_blocks_is_read_from_the_oldest_remembered(
    chain: LocalChain, setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    """Below the remembered blocks nothing can be compared: what changed there is missed, and said so. The hashes
    kept (256 by default) and the confirmations waited for are what make that depth out of reach."""
    s = setup
    for _ in range(4):
        chain.mine()
    follower = EventFollower(s.reader, remember=2)
    follower.poll()
    oldest = chain.w3.eth.block_number - 1
    assert sorted(follower.hashes) == [oldest, oldest + 1]
    deep = tree_of("deep", [3])
    reorg(chain, 3, [(signed_batch(s, deep), 1)])  # three blocks, deeper than the two remembered

    found = follower.poll()

    assert roots(found) == [deep.root]  # in the oldest remembered block: read again
    assert follower.rewound_to == oldest
    assert "deeper than the 2 remembered blocks" in caplog.text


def test_cursor_file_keeps_the_remembered_block_hashes(tmp_path: Path) -> None:
    cursor = CursorFile(tmp_path / "cursor.json")
    cursor.save(18, {16: b"\x01" * 32, 17: b"\x02" * 32})
    assert cursor.load_all(default=0) == (18, {16: b"\x01" * 32, 17: b"\x02" * 32})
    cursor.save(18, {18: b"\x02" * 32})  # not before next_block: not a cursor this code wrote
    with pytest.raises(LedgerError, match="corrupt"):
        cursor.load_all(default=0)
