"""`prime-node register|join|leave|unstake|withdraw|claim|status` against the session's anvil."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from ledger.accounts import create_keystore, dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.deployment import Deployment
from ledger.merkle import BatchTree, Leaf
from ledger.types import BatchStatus, PoolConfig, Reason
from node.cli.main import app
from tests.conftest import TOKEN, UNBONDING_PERIOD

WINDOW = 3600
REWARD_PER_UNIT = 10**15  # 0.001 token
PROVIDER, NODE, SECOND_NODE, VALIDATOR = 1, 2, 3, 4
runner = CliRunner()


@pytest.fixture
def deployment_file(tmp_path: Path, deployment: Deployment, chain: LocalChain) -> Path:
    path = tmp_path / "deployment.json"
    deployment.save(path)
    return path


@pytest.fixture
def pool_id(ledger_for: Callable[[int], Ledger]) -> int:
    """Pool 1: min stake 100, window 1 h, 0.001 token per unit, 1000 tokens of escrow; the provider holds 1000."""
    owner = ledger_for(0)
    config = PoolConfig(
        name="worker-pool",
        model_hash=bytes(32),
        spec_uri="",
        trainer=owner.address,
        min_stake_per_node=100 * TOKEN,
        challenge_window=WINDOW,
        reward_per_unit=REWARD_PER_UNIT,
        slash_amount=50 * TOKEN,
    )
    pool = owner.create_pool(config)
    owner.mint(owner.address, 1000 * TOKEN)
    owner.fund_rewards(pool, 1000 * TOKEN)
    owner.mint(dev_account(PROVIDER).address, 1000 * TOKEN)
    owner.set_validator(pool, dev_account(VALIDATOR).address)
    return pool


def node_cli(deployment_file: Path, *args: str | Path | int, passwords: dict[str, str] | None = None) -> Result:
    env: dict[str, str | None] = {
        "PRIME_DEPLOYMENT": str(deployment_file),
        "PRIME_KEYSTORE": None,
        "PRIME_KEYSTORE_PASSWORD": None,
        "PRIME_NODE_KEYSTORE_PASSWORD": None,
        "PRIME_DEBUG": None,
        "COLUMNS": "300",  # a table's row on one line, as the assertions read it
        **(passwords or {}),
    }
    return runner.invoke(app, [str(arg) for arg in args], env=env)


def ok(result: Result) -> Result:
    assert result.exit_code == 0, result.output
    return result


def assert_one_line_error(result: Result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def key(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


def onboarded(deployment_file: Path, pool: int) -> None:
    """Provider 1 stakes 200 and binds node 2, which joins `pool`, all through the CLI."""
    ok(node_cli(deployment_file, "register", "--stake", "200", "--dev-key", PROVIDER, "--node-dev-key", NODE))
    ok(node_cli(deployment_file, "join", pool, "--dev-key", NODE))


# --- register, join, leave ---------------------------------------------------------------------------


def test_register_stakes_binds_and_is_idempotent(
    deployment_file: Path, pool_id: int, ledger_for: Callable[[int], Ledger]
) -> None:
    provider, node = dev_account(PROVIDER).address, dev_account(NODE).address
    first = ok(node_cli(deployment_file, "register", "--stake", "200", "--dev-key", PROVIDER, "--node-dev-key", NODE))
    assert f"bound node {node} to provider {provider}" in first.stdout
    assert f"using anvil development key {NODE} ({node})" in first.stderr
    reader = ledger_for(0)
    assert reader.stake_of(provider).active == 200 * TOKEN
    assert reader.provider_of(node) == provider and reader.is_active_node(node)

    again = ok(node_cli(deployment_file, "register", "--stake", "0", "--dev-key", PROVIDER, "--node-dev-key", NODE))
    assert f"node {node} is already bound to provider {provider}" in again.stdout
    assert "staked" not in again.stdout
    assert reader.stake_of(provider).active == 200 * TOKEN


def test_register_without_node_flags_binds_the_provider_key_itself(
    deployment_file: Path, pool_id: int, ledger_for: Callable[[int], Ledger]
) -> None:
    ok(node_cli(deployment_file, "register", "--stake", "100", "--dev-key", PROVIDER))
    provider = dev_account(PROVIDER).address
    assert ledger_for(0).nodes_of(provider) == [provider]


def test_register_with_keystores_reads_each_password(
    deployment_file: Path, pool_id: int, tmp_path: Path, ledger_for: Callable[[int], Ledger]
) -> None:
    provider_file = create_keystore(tmp_path, "provider pw", private_key=dev_account(PROVIDER).key, iterations=2**10)
    node_file = create_keystore(tmp_path, "node pw", private_key=dev_account(NODE).key, iterations=2**10)
    passwords = {"PRIME_KEYSTORE_PASSWORD": "provider pw", "PRIME_NODE_KEYSTORE_PASSWORD": "node pw"}
    args = ("register", "--stake", "10", "--keystore", provider_file, "--node-keystore", node_file)
    result = ok(node_cli(deployment_file, *args, passwords=passwords))
    assert "anvil development key" not in result.output
    assert ledger_for(0).provider_of(dev_account(NODE).address) == dev_account(PROVIDER).address


def test_register_more_than_the_balance_is_one_line(deployment_file: Path, pool_id: int) -> None:
    result = node_cli(deployment_file, "register", "--stake", "5000", "--dev-key", PROVIDER)
    assert_one_line_error(result, "--stake 5000: provider", "holds only 1,000 tokens")


@pytest.mark.parametrize(
    ("amount", "message"),
    [
        ("abc", "--stake: not a token amount: 'abc'"),
        ("-1", "--stake: token amount must be a non-negative number"),
        ("1.0000000000000000001", "has more than 18 decimal places"),
    ],
)
def test_bad_stake_amount_is_one_line(deployment_file: Path, amount: str, message: str) -> None:
    assert_one_line_error(node_cli(deployment_file, "register", "--stake", amount, "--dev-key", PROVIDER), message)


def test_join_and_leave_as_the_node(deployment_file: Path, pool_id: int, ledger_for: Callable[[int], Ledger]) -> None:
    node = dev_account(NODE).address
    onboarded(deployment_file, pool_id)
    reader = ledger_for(0)
    assert reader.is_member(pool_id, node)
    assert reader.stake_of(dev_account(PROVIDER).address).locked == 100 * TOKEN
    left = ok(node_cli(deployment_file, "leave", pool_id, "--dev-key", NODE))
    assert f"node {node} left pool {pool_id}; 100 tokens stay locked until " in left.stdout
    assert not reader.is_member(pool_id, node)


def test_the_lock_of_a_node_that_left_is_released_after_one_challenge_window(
    deployment_file: Path, pool_id: int, chain: LocalChain, ledger_for: Callable[[int], Ledger]
) -> None:
    """Work submitted just before leaving is still slashable for its whole window, so the stake stays locked."""
    node, provider = dev_account(NODE).address, dev_account(PROVIDER).address
    onboarded(deployment_file, pool_id)
    submit(ledger_for, NODE, pool_id, ("last", 100))
    ok(node_cli(deployment_file, "leave", pool_id, "--dev-key", NODE))
    reader = ledger_for(0)
    early = ok(node_cli(deployment_file, "release", pool_id, "--dev-key", PROVIDER))
    assert f"node {node}: 100 tokens locked until " in early.stdout
    assert reader.stake_of(provider).locked == 100 * TOKEN
    assert_one_line_error(
        node_cli(deployment_file, "unstake", "150", "--dev-key", PROVIDER),
        "only 100 tokens of stake are free: pools lock 100",
    )  # 200 staked, 100 still locked
    chain.increase_time(WINDOW)
    done = ok(node_cli(deployment_file, "release", pool_id, "--dev-key", PROVIDER))
    assert f"node {node}: released 100 tokens" in done.stdout and "100 tokens free again" in done.stdout
    assert reader.stake_of(provider).locked == 0
    assert not reader.lock_of(pool_id, node).open
    again = ok(node_cli(deployment_file, "release", pool_id, "--dev-key", NODE))  # any key may ask
    assert f"node {node}: no lock in pool {pool_id}" in again.stdout


def test_join_without_a_key_is_one_line(deployment_file: Path, pool_id: int) -> None:
    assert_one_line_error(node_cli(deployment_file, "join", pool_id), "pass --keystore FILE (or --dev-key N")


def test_join_of_an_unbound_node_shows_the_revert(deployment_file: Path, pool_id: int) -> None:
    assert_one_line_error(node_cli(deployment_file, "join", pool_id, "--dev-key", 7), "join reverted:")


# --- unstake, withdraw -------------------------------------------------------------------------------


def test_withdraw_early_says_when_then_succeeds(
    deployment_file: Path, pool_id: int, chain: LocalChain, ledger_for: Callable[[int], Ledger]
) -> None:
    provider = dev_account(PROVIDER).address
    ok(node_cli(deployment_file, "register", "--stake", "200", "--dev-key", PROVIDER))
    unstaked = ok(node_cli(deployment_file, "unstake", "50", "--dev-key", PROVIDER))
    release = ledger_for(0).stake_of(provider).release_at
    assert "50 tokens unbonding" in unstaked.stdout

    early = node_cli(deployment_file, "withdraw", "--dev-key", PROVIDER)
    assert_one_line_error(early, "50 tokens are still unbonding: released at")
    shown = re.search(r"released at (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC)", early.stderr)
    assert shown is not None
    assert shown.group(1) == datetime.fromtimestamp(release, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

    chain.increase_time(UNBONDING_PERIOD)
    done = ok(node_cli(deployment_file, "withdraw", "--dev-key", PROVIDER))
    assert "withdrew 50 tokens" in done.stdout
    assert ledger_for(0).balance_of(provider) == 850 * TOKEN


def test_withdraw_with_nothing_unbonding_is_one_line(deployment_file: Path, pool_id: int) -> None:
    result = node_cli(deployment_file, "withdraw", "--dev-key", PROVIDER)
    assert_one_line_error(result, "nothing to withdraw")


# --- claim -------------------------------------------------------------------------------------------


def submit(ledger_for: Callable[[int], Ledger], node_index: int, pool: int, *works: tuple[str, int]) -> BatchTree:
    """Submits `works` (label, units) as one batch of node `node_index`'s; its tree."""
    tree = BatchTree([Leaf(key(label), units) for label, units in works])
    ledger_for(node_index).submit_batch(pool, tree.root, tree.count, tree.total_units)
    return tree


def short(tree: BatchTree) -> str:
    return f"0x{tree.root.hex()[:12]}"


def test_claim_before_the_window_shows_challenge_window_open(
    deployment_file: Path, pool_id: int, ledger_for: Callable[[int], Ledger]
) -> None:
    onboarded(deployment_file, pool_id)
    tree = submit(ledger_for, NODE, pool_id, ("a", 100))
    result = node_cli(deployment_file, "claim", pool_id, "--batch", tree.root.hex(), "--dev-key", PROVIDER)
    node = dev_account(NODE).address
    assert_one_line_error(
        result, f"claimBatches reverted: BatchChallengeWindowOpen(poolId=1, node={node}, root=0x" + tree.root.hex()
    )


def test_claim_without_roots_before_the_window_says_when(
    deployment_file: Path, pool_id: int, ledger_for: Callable[[int], Ledger]
) -> None:
    onboarded(deployment_file, pool_id)
    submit(ledger_for, NODE, pool_id, ("a", 100))
    result = ok(node_cli(deployment_file, "claim", pool_id, "--dev-key", PROVIDER))
    assert "nothing to claim yet: 1 pending batches" in result.stdout
    assert "closes at" in result.stdout


def test_claim_finds_and_pays_this_providers_claimable_batches_less_their_refused_leaves(
    deployment_file: Path, pool_id: int, chain: LocalChain, ledger_for: Callable[[int], Ledger]
) -> None:
    onboarded(deployment_file, pool_id)
    submit(ledger_for, NODE, pool_id, ("a", 100), ("b", 400))
    refused = submit(ledger_for, NODE, pool_id, ("c", 250), ("d", 250), ("e", 300))
    ledger_for(VALIDATOR).refuse_leaf(pool_id, dev_account(NODE).address, refused.root, refused.proof(2), 7)
    # another provider's batch in the same pool is not this provider's to claim
    other = ledger_for(5)
    ledger_for(0).mint(other.address, 100 * TOKEN)
    other.stake(100 * TOKEN)
    other.add_node(other.account)  # type: ignore[arg-type]
    other.join(pool_id)
    theirs = submit(ledger_for, 5, pool_id, ("other", 999))
    chain.increase_time(WINDOW)

    reader = ledger_for(0)
    before = reader.balance_of(dev_account(PROVIDER).address)
    result = ok(node_cli(deployment_file, "claim", pool_id, "--dev-key", PROVIDER))
    assert (
        f"claimed 2 batches (5 files) in pool {pool_id}: 1 tokens paid to {dev_account(PROVIDER).address}"
        in result.stdout
    )  # 100 + 400 + 250 + 250 units: the refused leaf's 300 are not paid
    assert reader.balance_of(dev_account(PROVIDER).address) - before == 1000 * REWARD_PER_UNIT
    assert reader.get_batch(pool_id, other.address, theirs.root).status == BatchStatus.PENDING
    again = ok(node_cli(deployment_file, "claim", pool_id, "--dev-key", PROVIDER))
    assert "nothing to claim" in again.stdout


def test_claim_signed_by_a_node_key_pays_its_provider(
    deployment_file: Path, pool_id: int, chain: LocalChain, ledger_for: Callable[[int], Ledger]
) -> None:
    onboarded(deployment_file, pool_id)
    submit(ledger_for, NODE, pool_id, ("a", 2000))
    chain.increase_time(WINDOW)
    result = ok(node_cli(deployment_file, "claim", pool_id, "--dev-key", NODE))
    assert (
        f"claimed 1 batches (1 files) in pool {pool_id}: 2 tokens paid to {dev_account(PROVIDER).address}"
        in result.stdout
    )
    reader = ledger_for(0)
    assert reader.balance_of(dev_account(PROVIDER).address) == 802 * TOKEN  # 1000 minted, 200 staked, 2 earned
    assert reader.balance_of(dev_account(NODE).address) == 0


def test_claim_of_a_claimed_batch_whose_slot_took_a_later_one_says_it_is_claimed(
    deployment_file: Path, pool_id: int, chain: LocalChain, ledger_for: Callable[[int], Ledger]
) -> None:
    onboarded(deployment_file, pool_id)
    first = submit(ledger_for, NODE, pool_id, ("first", 1000))
    chain.increase_time(WINDOW)
    ok(node_cli(deployment_file, "claim", pool_id, "--batch", first.root.hex(), "--dev-key", PROVIDER))
    later = submit(ledger_for, NODE, pool_id, ("later", 500))
    assert ledger_for(0).get_slot(pool_id, dev_account(NODE).address, 0).root == later.root  # written over the first
    result = node_cli(deployment_file, "claim", pool_id, "--batch", first.root.hex(), "--dev-key", PROVIDER)
    assert_one_line_error(result, f"batch 0x{first.root.hex()} is claimed already: nothing to claim")
    chain.increase_time(WINDOW)
    paid = ok(node_cli(deployment_file, "claim", pool_id, "--batch", later.root.hex(), "--dev-key", PROVIDER))
    assert "claimed 1 batches (1 files)" in paid.stdout  # the later one, in the same slot


def test_claim_with_a_malformed_root_is_one_line(deployment_file: Path, pool_id: int) -> None:
    result = node_cli(deployment_file, "claim", pool_id, "--batch", "0x1234", "--dev-key", PROVIDER)
    assert_one_line_error(result, "--batch: expected 32 bytes as 64 hex digits")


def test_claim_of_a_root_the_provider_never_submitted_is_one_line(deployment_file: Path, pool_id: int) -> None:
    onboarded(deployment_file, pool_id)
    result = node_cli(deployment_file, "claim", pool_id, "--batch", "ab" * 32, "--dev-key", PROVIDER)
    assert_one_line_error(result, f"no batch of provider {dev_account(PROVIDER).address}'s nodes in pool {pool_id}")


# --- status ------------------------------------------------------------------------------------------


def test_status_by_address_shows_stake_nodes_and_every_batch_state(
    deployment_file: Path, pool_id: int, chain: LocalChain, ledger_for: Callable[[int], Ledger]
) -> None:
    provider, node, second = dev_account(PROVIDER).address, dev_account(NODE).address, dev_account(SECOND_NODE).address
    onboarded(deployment_file, pool_id)
    claimed = submit(ledger_for, NODE, pool_id, ("claimed", 100))
    claimable = submit(ledger_for, NODE, pool_id, ("claimable", 200))
    # a second node of the same provider cheats: one file invalidated voids its batch and its other pending batch
    ledger_for(PROVIDER).add_node(dev_account(SECOND_NODE))
    ledger_for(SECOND_NODE).join(pool_id)
    invalid = submit(ledger_for, SECOND_NODE, pool_id, ("invalid", 300), ("its neighbour", 200))
    void = submit(ledger_for, SECOND_NODE, pool_id, ("void", 500))
    ledger_for(VALIDATOR).invalidate_batch(pool_id, second, invalid.root, invalid.proof(0), Reason.PROOF_INVALID)
    borderline = submit(ledger_for, NODE, pool_id, ("borderline", 600), ("fine", 50))
    ledger_for(VALIDATOR).refuse_leaf(pool_id, node, borderline.root, borderline.proof(0), Reason.PROOF_INVALID)
    chain.increase_time(WINDOW)
    ledger_for(PROVIDER).claim_batches(pool_id, node, [claimed.root])
    pending = submit(ledger_for, NODE, pool_id, ("pending", 400))  # still inside its window
    # written over the claimed batch, in its slot: status reads the claimed one from the events
    assert ledger_for(0).get_slot(pool_id, node, 0).root == pending.root

    result = ok(node_cli(deployment_file, "status", "--pool", pool_id, "--address", node.lower()))
    out = result.stdout
    assert provider in out and f"{node} (member of pool {pool_id}, locking 100 tokens)" in out
    ejection = f"ejected from pool {pool_id} by an invalidation; its pending work is void"
    assert f"{second} ({ejection}; 50 tokens locked until " in out  # what the slash left of its lock
    assert "150 tokens" in out  # active stake: 200 staked, 50 slashed
    for tree, state in [(claimed, "claimed"), (claimable, "claimable"), (void, "void"), (borderline, "claimable")]:
        assert re.search(rf"{short(tree)}.*\b{state}\b", out), (state, out)
    assert re.search(rf"{short(pending)}.*pending until", out)
    assert re.search(
        rf"{short(invalid)}.*invalidated: leaf 0 \(0x{key('invalid').hex()[:12]}…\): proof_invalid \(7\), 50 tokens "
        r"slashed \(burned\)",
        out,
    ), out
    assert re.search(
        rf"{short(borderline)}.*claimable; refused leaves \(never paid, not slashed\): 1, 600 units, "
        r"proof_invalid \(7\)",
        out,
    ), out
    # claimed 100, claimable 200 + 50 (the refused leaf's 600 units are not), pending 400, lost 500 + 500
    assert "earned 0.35 tokens (claimed 0.1 tokens, claimable 0.25 tokens); at risk 0.4 tokens" in out
    assert "lost 1 tokens" in out
    assert "refused 0.6 tokens of rewards: borderline files, not paid and not slashed" in out
    assert result.stderr == ""  # read-only: no key, no warning


def test_an_owner_ejected_node_still_shows_and_claims_its_earlier_batches(
    deployment_file: Path, pool_id: int, chain: LocalChain, ledger_for: Callable[[int], Ledger]
) -> None:
    node = dev_account(NODE).address
    onboarded(deployment_file, pool_id)
    before = submit(ledger_for, NODE, pool_id, ("before", 300))
    ledger_for(0).eject(pool_id, node)  # the pool's owner: no evidence, so nothing is voided
    chain.increase_time(WINDOW)

    out = ok(node_cli(deployment_file, "status", "--pool", pool_id, "--address", node)).stdout
    assert f"ejected from pool {pool_id} by its owner; earlier work is still paid unless invalidated" in out
    assert re.search(rf"{short(before)}.*\bclaimable\b", out), out
    result = ok(node_cli(deployment_file, "claim", pool_id, "--dev-key", PROVIDER))
    assert (
        f"claimed 1 batches (1 files) in pool {pool_id}: 0.3 tokens paid to {dev_account(PROVIDER).address}"
        in result.stdout
    )


def test_status_with_a_state_folder_shows_the_journals_files_and_batches_by_stage(
    deployment_file: Path, pool_id: int, tmp_path: Path, ledger_for: Callable[[int], Ledger]
) -> None:
    from node.daemon.state import WorkerState

    node = dev_account(NODE).address
    onboarded(deployment_file, pool_id)
    state = WorkerState(tmp_path / "state", chain_id=31337, pool_id=pool_id, node=node)
    keys = []
    for label in ("a", "b", "c"):
        state.path_of(key(label)).write_bytes(label.encode())
        state.add(key(label), step=0, counter=len(keys), units=100)
        keys.append(key(label))
    state.move(keys[:2], "uploaded")
    batch = state.form_batch(state.unbatched())
    state.move_batch(batch.root, "submitted", tx="0x01", files="submitted")
    state.note_verdict(keys[0], f"accepted by {dev_account(VALIDATOR).address}")
    state.close()
    ledger_for(NODE).submit_batch(pool_id, batch.root, batch.count, batch.total_units, slot=batch.slot)

    args = ("status", "--pool", pool_id, "--address", node, "--state", tmp_path / "state")
    out = ok(node_cli(deployment_file, *args)).stdout
    assert f"journal {tmp_path / 'state'}: files 1 written, 2 submitted; batches 1 submitted" in out
    assert re.search(rf"0x{batch.root.hex()[:12]}….*pending until", out), out  # the chain's word on the batch
    first = rf"0x{keys[0].hex()[:12]}… +│ 0x{batch.root.hex()[:12]}… leaf 0, slot 0 │ 100 +│ submitted +│ accepted by "
    assert re.search(first, out), out
    assert re.search(rf"0x{keys[2].hex()[:12]}… +│ - +│ 100 +│ written", out), out


def test_status_with_a_key_and_no_pool(deployment_file: Path, pool_id: int) -> None:
    onboarded(deployment_file, pool_id)
    result = ok(node_cli(deployment_file, "status", "--dev-key", PROVIDER))
    assert dev_account(NODE).address in result.stdout
    assert "200 tokens" in result.stdout and "batches in pool" not in result.stdout


def test_status_needs_an_address_or_a_key(deployment_file: Path) -> None:
    assert_one_line_error(node_cli(deployment_file, "status"), "pass --address ADDR")
    both = node_cli(deployment_file, "status", "--address", dev_account(1).address, "--dev-key", 1)
    assert_one_line_error(both, "not both")
    assert_one_line_error(node_cli(deployment_file, "status", "--address", "0xnope"), "--address: not an address")
