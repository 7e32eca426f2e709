"""Shared setup for ledger tests: a pool with sane defaults, an onboarded node, a work key, a committed batch, revert
checks."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from eth_account.signers.local import LocalAccount
from eth_utils import is_address, to_checksum_address
from web3.logs import DISCARD
from web3.types import TxReceipt

from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.errors import ContractRevert
from ledger.merkle import BatchTree, Leaf
from ledger.types import PoolConfig
from tests.conftest import TOKEN  # not `conftest`: a test folder with its own conftest.py shadows that name

DEFAULT_POOL = PoolConfig(
    name="test-pool",
    model_hash=hashlib.sha256(b"model").digest(),
    spec_uri="",  # no spec: its nodes are told where its parts are by flags, its terms are the defaults
    trainer="0x0000000000000000000000000000000000000000",  # replaced by the owner in make_pool
    min_stake_per_node=100 * TOKEN,
    challenge_window=3600,
    reward_per_unit=10**15,
    slash_amount=50 * TOKEN,
    max_nodes=0,
)


def pool_config(owner: Ledger, **overrides: Any) -> PoolConfig:
    """DEFAULT_POOL with `trainer = owner` and the given PoolConfig fields replaced."""
    return replace(DEFAULT_POOL, **{"trainer": owner.address, **overrides})


def make_pool(owner: Ledger, **overrides: Any) -> int:
    """Creates a pool owned by `owner` (defaults: window 3600 s, min stake 100, reward 1e15/unit, slash 50)."""
    return owner.create_pool(pool_config(owner, **overrides))


def fund_provider(minter: Ledger, provider: Ledger, stake_tokens: int) -> None:
    """Mints `stake_tokens` whole tokens to `provider` (minter is the StakeToken owner) and stakes them."""
    amount = stake_tokens * TOKEN
    minter.mint(provider.address, amount)
    provider.stake(amount)


def onboard(owner: Ledger, provider: Ledger, node: LocalAccount, pool_id: int, stake_tokens: int = 100) -> Ledger:
    """Mints and stakes `stake_tokens` for `provider`, binds `node` to it and joins `pool_id`.

    `owner` must be able to mint StakeToken (anvil account 0 on a local devnet). Pass
    `stake_tokens=0` to stake nothing more (a provider onboarding its second node).
    Returns a Ledger sending as the node.
    """
    if stake_tokens:
        fund_provider(owner, provider, stake_tokens)
    provider.add_node(node)
    node_ledger = provider.as_account(node)
    node_ledger.join(pool_id)
    return node_ledger


def work_key(label: str) -> bytes:
    """A deterministic 32-byte work key for a test label."""
    return hashlib.sha256(label.encode()).digest()


def batch_of(*leaves: tuple[str, int]) -> BatchTree:
    """The batch of the files `(label, units)`, in that order, each keyed `work_key(label)`."""
    return BatchTree([Leaf(work_key(label), units) for label, units in leaves])


def commit_batch(node: Ledger, pool_id: int, *leaves: tuple[str, int]) -> tuple[BatchTree, TxReceipt]:
    """Submits `batch_of(*leaves)` from `node`. Returns the batch's tree (its root, and the proofs a challenge takes)
    and the submission's receipt."""
    tree = batch_of(*leaves)
    return tree, node.submit_batch(pool_id, tree.root, tree.count, tree.total_units)


def _normalized(value: Any) -> Any:
    """Addresses compare checksummed: eth_abi decodes them in lower case."""
    if isinstance(value, str) and is_address(value):
        return to_checksum_address(value)
    if isinstance(value, list | tuple):
        return type(value)(_normalized(item) for item in value)
    return value


def assert_revert(error: ContractRevert, name: str, **values: Any) -> None:
    """`error` is the custom error `name` with exactly `values` (addresses in any case)."""
    assert error.name == name, f"expected {name}, got {error}"
    assert {key: _normalized(value) for key, value in error.values.items()} == {
        key: _normalized(value) for key, value in values.items()
    }


def transact_at(chain: LocalChain, sender: Ledger, call: Any, timestamp: int, *, gas: int = 500_000) -> TxReceipt:
    """Mines `call` (a bound contract function) from `sender` in a block stamped exactly `timestamp`.

    The gas is given, not estimated: anvil estimates against the latest block's timestamp, not the one
    `evm_setNextBlockTimestamp` set, so an estimate would judge a time boundary at the wrong second.
    A revert still raises `ContractRevert`, decoded by replaying the mined transaction.
    """
    chain.set_next_timestamp(timestamp)
    assert sender._sender is not None, "transact_at needs a Ledger with an account"
    try:
        receipt = sender._sender.send(call, description=f"{call.fn_name} at {timestamp}", gas=gas)
    except ContractRevert:
        assert sender.timestamp() == timestamp, "the failed transaction was not mined at the given time"
        raise
    assert sender.w3.eth.get_block(receipt["blockNumber"])["timestamp"] == timestamp
    return receipt


def events(contract_event: Any, receipt: TxReceipt) -> list[dict[str, Any]]:
    """The args of every `contract_event` log in `receipt` (e.g. `ledger.work.events.BatchSubmitted()`).

    Logs of other contracts and events in the same receipt are skipped.
    """
    return [dict(entry["args"]) for entry in contract_event.process_receipt(receipt, errors=DISCARD)]
