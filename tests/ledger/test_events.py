"""EventFollower on a real chain: decoded fields, batch expansion, pool filter, paging, cursor, confirmations."""

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
    CursorFile,
    EventFollower,
    EventPosition,
    LedgerEvent,
    RewardsClaimed,
    WorkInvalidated,
    WorkSubmitted,
    invalidations,
)
from ledger.types import Reason, WorkStatus
from tests.conftest import TOKEN
from tests.ledger.helpers import make_pool, onboard, work_key

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


def work_keys(found: list[LedgerEvent]) -> list[bytes]:
    """The work keys of `found`, which are all submissions."""
    assert all(isinstance(e, WorkSubmitted) for e in found), found
    return [e.work_key for e in found if isinstance(e, WorkSubmitted)]


def submit_many(s: Setup, count: int, label: str, *, empty_blocks: int = 0) -> list[bytes]:
    """`count` single submissions, one block each, with `empty_blocks` mined after each."""
    keys = []
    for i in range(count):
        key = work_key(f"{label}-{i}")
        s.node.submit_work(s.pool_id, key, 1000 + i)
        keys.append(key)
        for _ in range(empty_blocks):
            s.node.w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    return keys


# --- decoding ----------------------------------------------------------------------------------------------


def test_poll_returns_submitted_invalidated_and_claimed_events_in_chain_order(chain: LocalChain, setup: Setup) -> None:
    s = setup
    cheater = onboard(s.owner, s.provider, dev_account(NODE_B), s.pool_id, stake_tokens=0)
    a, b, c = work_key("a"), work_key("b"), work_key("c")
    single = s.node.submit_work(s.pool_id, a, 2500)
    batch = s.node.submit_work_batch(s.pool_id, [b, c], [4096, 3000])
    forged = cheater.submit_work(s.pool_id, b, 999)  # the same key, the cheater's own record
    invalidated = s.validator.invalidate_work(s.pool_id, cheater.address, b, Reason.HASH_MISMATCH)
    chain.increase_time(WINDOW)
    claimed = s.owner.claim_rewards(s.pool_id, s.node.address, [a, c])

    found = EventFollower(s.reader).poll()

    node, provider = s.node.address, s.provider.address
    batch_at = position(s.reader, batch)
    assert found == [
        WorkSubmitted(s.pool_id, a, node, provider, 2500, position(s.reader, single)),
        WorkSubmitted(s.pool_id, b, node, provider, 4096, batch_at),  # a batch expands in key order
        WorkSubmitted(s.pool_id, c, node, provider, 3000, batch_at),
        WorkSubmitted(s.pool_id, b, cheater.address, provider, 999, position(s.reader, forged)),
        WorkInvalidated(
            s.pool_id,
            b,
            cheater.address,
            s.validator.address,
            Reason.HASH_MISMATCH,
            SLASH,
            position(s.reader, invalidated),
        ),
        RewardsClaimed(s.pool_id, provider, node, (2500 + 3000) * REWARD_PER_UNIT, 2, position(s.reader, claimed)),
    ]
    assert [e.at.block_number for e in found] == sorted(e.at.block_number for e in found)


def test_poll_with_no_new_blocks_returns_nothing(setup: Setup) -> None:
    s = setup
    s.node.submit_work(s.pool_id, work_key("once"), 100)
    follower = EventFollower(s.reader)
    assert len(follower.poll()) == 1
    assert follower.poll() == []


def test_following_only_some_events_skips_the_others(chain: LocalChain, setup: Setup) -> None:
    s = setup
    key = work_key("claimed")
    s.node.submit_work(s.pool_id, key, 100)
    chain.increase_time(WINDOW)
    s.owner.claim_rewards(s.pool_id, s.node.address, [key])

    found = EventFollower(s.reader, events=("RewardsClaimed",)).poll()

    assert [type(e) for e in found] == [RewardsClaimed]


def test_following_an_unknown_event_raises_ledger_error(reader: Ledger) -> None:
    with pytest.raises(LedgerError, match="WorkFunded"):
        EventFollower(reader, events=("WorkSubmitted", "WorkFunded"))


def test_invalidations_are_keyed_by_node_and_work_key(setup: Setup) -> None:
    s = setup
    other = onboard(s.owner, s.provider, dev_account(NODE_B), s.pool_id, stake_tokens=0)
    key = work_key("one key, two records")
    s.node.submit_work(s.pool_id, key, 100)
    other.submit_work(s.pool_id, key, 100)
    s.validator.invalidate_work(s.pool_id, s.node.address, key, Reason.BAD_FORMAT)
    s.validator.invalidate_work(s.pool_id, other.address, key, Reason.PROOF_INVALID)

    every = invalidations(s.reader, s.pool_id)
    only_other = invalidations(s.reader, s.pool_id, other.address.lower())

    assert {index: (e.node, e.reason, e.slashed) for index, e in every.items()} == {
        (s.node.address, key): (s.node.address, Reason.BAD_FORMAT, SLASH),
        (other.address, key): (other.address, Reason.PROOF_INVALID, SLASH),
    }
    assert list(only_other) == [(other.address, key)]
    assert invalidations(s.reader, s.pool_id + 1) == {}


# --- filtering and paging ----------------------------------------------------------------------------------


def test_pool_filter_ignores_another_pools_events(setup: Setup) -> None:
    s = setup
    other_pool = make_pool(s.owner, challenge_window=WINDOW, slash_amount=SLASH)
    s.owner.set_validator(other_pool, s.validator.address)
    other_node = onboard(s.owner, s.provider, dev_account(NODE_B), other_pool, stake_tokens=100)
    mine, theirs = work_key("mine"), work_key("theirs")
    s.node.submit_work(s.pool_id, mine, 100)
    other_node.submit_work(other_pool, theirs, 200)
    other_node.submit_work_batch(other_pool, [work_key("theirs-1"), work_key("theirs-2")], [1, 2])
    s.validator.invalidate_work(other_pool, other_node.address, theirs, Reason.BAD_FORMAT)
    s.node.submit_work_batch(s.pool_id, [work_key("mine-1")], [300])

    ours = EventFollower(s.reader, pool_id=s.pool_id).poll()
    everything = EventFollower(s.reader).poll()

    assert work_keys(ours) == [mine, work_key("mine-1")]
    assert {e.pool_id for e in ours} == {s.pool_id}
    assert len(everything) == 6
    assert [e for e in everything if e.pool_id == s.pool_id] == ours


def test_small_pages_return_the_same_events_as_one_big_page(setup: Setup) -> None:
    s = setup
    keys = submit_many(setup, 7, "paged", empty_blocks=2)  # 21 blocks, events in every third
    s.node.submit_work_batch(s.pool_id, [work_key("paged-batch-0"), work_key("paged-batch-1")], [5, 6])

    one_page = EventFollower(s.reader, page_size=100_000).poll()
    small_pages = EventFollower(s.reader, page_size=2).poll()
    single_blocks = EventFollower(s.reader, page_size=1).poll()

    assert work_keys(one_page) == [*keys, work_key("paged-batch-0"), work_key("paged-batch-1")]
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
    submit_many(s, 3, "before")
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
    assert work_keys(before) == [work_key(f"before-{i}") for i in range(3)]
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
    keys = submit_many(s, 6, "flaky")  # pages of two blocks: the third read fails
    read_logs, reads = follower._logs, []

    def flaky_logs(first: int, last: int) -> list[Any]:
        reads.append(first)
        if len(reads) == 3:
            raise RpcUnavailable(s.reader.deployment.rpc_url, "read logs: connection reset")
        return read_logs(first, last)

    monkeypatch.setattr(follower, "_logs", flaky_logs)
    with pytest.raises(RpcUnavailable):
        follower.poll()

    assert work_keys(follower.poll()) == keys


# --- confirmations -----------------------------------------------------------------------------------------


def test_confirmations_hold_back_the_newest_blocks(chain: LocalChain, setup: Setup) -> None:
    s = setup
    keys = submit_many(s, 3, "confirm")  # blocks h-2, h-1, h
    follower = EventFollower(s.reader, confirmations=2)

    assert work_keys(follower.poll()) == keys[:1]
    chain.mine()
    assert work_keys(follower.poll()) == keys[1:2]
    assert follower.poll() == []
    chain.mine()
    chain.mine()
    assert work_keys(follower.poll()) == keys[2:]


def test_confirmations_beyond_the_chain_height_return_nothing(setup: Setup) -> None:
    submit_many(setup, 1, "deep")
    follower = EventFollower(setup.reader, confirmations=10_000)
    assert follower.poll() == []
    assert follower.next_block == setup.reader.deployment.block


# --- reorganisations ---------------------------------------------------------------------------------------


def signed_submission(s: Setup, label: str, units: int, *, nonce: int | None = None) -> str:
    """A raw signed submitWork of the node (its next nonce), for anvil to place into blocks of a reorganisation."""
    account = dev_account(NODE_A)
    w3 = s.reader.w3
    tx = s.node.work.functions.submitWork(s.pool_id, work_key(label), units).build_transaction(
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


def test_a_submission_a_reorganisation_puts_into_blocks_already_read_is_still_returned(
    chain: LocalChain, setup: Setup
) -> None:
    """The attack of issue 19 (item 9): a submission lands behind the cursor, in a block the follower has passed."""
    s = setup
    follower = EventFollower(s.reader)
    for _ in range(4):
        chain.mine()
    assert follower.poll() == []
    head = chain.w3.eth.block_number
    reorg(chain, 3, [(signed_submission(s, "behind", 777), 1)])  # into block head - 1, already read
    assert chain.w3.eth.block_number == head  # no new block: a follower without reorg checks sees nothing

    found = follower.poll()

    assert [(e.work_key, e.units, e.at.block_number) for e in found if isinstance(e, WorkSubmitted)] == [
        (work_key("behind"), 777, head - 1)
    ]
    assert follower.rewound_to is not None and follower.rewound_to <= head - 1
    assert follower.reorgs == 1
    assert follower.poll() == []  # and read once


def test_a_submission_a_reorganisation_removed_is_not_returned_again_and_its_replacement_is(
    chain: LocalChain, setup: Setup
) -> None:
    s = setup
    follower = EventFollower(s.reader)
    follower.poll()
    nonce = chain.w3.eth.get_transaction_count(dev_account(NODE_A).address)
    (orphan,) = submit_many(s, 1, "orphan")
    chain.mine()
    assert work_keys(follower.poll()) == [orphan]
    # the same nonce again: the new blocks drop the first submission and carry another one
    reorg(chain, 2, [(signed_submission(s, "replacement", 55, nonce=nonce), 0)])

    found = follower.poll()

    assert work_keys(found) == [work_key("replacement")]
    assert follower.rewound_to is not None
    assert s.reader.get_work(s.pool_id, dev_account(NODE_A).address, orphan).status == WorkStatus.NONE


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
    keys = submit_many(s, 2, "rebuilt")  # blocks the follower already passed, by number
    assert s.reader.w3.eth.block_number < passed

    found = follower.poll()

    assert work_keys(found) == keys


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
    reorg(chain, 2, [(signed_submission(s, "while-down", 9), 0)])

    found = EventFollower(s.reader, cursor=CursorFile(path)).poll()

    assert work_keys(found) == [work_key("while-down")]


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
    reorg(chain, 3, [(signed_submission(s, "deep", 3), 1)])  # three blocks, deeper than the two remembered

    found = follower.poll()

    assert work_keys(found) == [work_key("deep")]  # in the oldest remembered block: read again
    assert follower.rewound_to == oldest
    assert "deeper than the 2 remembered blocks" in caplog.text


def test_cursor_file_keeps_the_remembered_block_hashes(tmp_path: Path) -> None:
    cursor = CursorFile(tmp_path / "cursor.json")
    cursor.save(18, {16: b"\x01" * 32, 17: b"\x02" * 32})
    assert cursor.load_all(default=0) == (18, {16: b"\x01" * 32, 17: b"\x02" * 32})
    cursor.save(18, {18: b"\x02" * 32})  # not before next_block: not a cursor this code wrote
    with pytest.raises(LedgerError, match="corrupt"):
        cursor.load_all(default=0)
