"""Transaction sending against a real anvil: nonces, reverts, receipts, retries."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import requests
from eth_utils import to_checksum_address

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.errors import ContractRevert, RpcUnavailable
from ledger.tx import Transactor, with_retries

TOKEN = 10**18


def test_two_senders_sharing_a_key_resynchronise_their_nonce(ledger_for: Callable[[int], Ledger]) -> None:
    first, second = ledger_for(0), ledger_for(0)
    first.mint(first.address, TOKEN)  # both now think nonce n+1 is next ...
    second.mint(second.address, TOKEN)  # ... second used it; first must notice and resync
    first.mint(first.address, TOKEN)
    assert first.balance_of(first.address) >= 3 * TOKEN


def test_back_to_back_transactions_use_consecutive_nonces(
    chain: LocalChain, ledger_for: Callable[[int], Ledger]
) -> None:
    owner = ledger_for(0)
    start = chain.w3.eth.get_transaction_count(to_checksum_address(owner.address))
    receipts = [owner.mint(dev_account(5).address, TOKEN) for _ in range(3)]
    nonces = [chain.w3.eth.get_transaction(r["transactionHash"])["nonce"] for r in receipts]
    assert nonces == [start, start + 1, start + 2]


def test_revert_at_estimation_names_the_custom_error_and_its_values(ledger_for: Callable[[int], Ledger]) -> None:
    stranger = ledger_for(7)
    with pytest.raises(ContractRevert) as caught:
        stranger.mint(stranger.address, TOKEN)
    assert caught.value.name == "OwnableUnauthorizedAccount"
    assert caught.value.values == {"account": stranger.address}
    assert str(caught.value).startswith("mint reverted: OwnableUnauthorizedAccount(account=0x")


def test_mined_failure_is_replayed_to_recover_the_reason(ledger_for: Callable[[int], Ledger]) -> None:
    """With gas given, nothing is estimated: the transaction is mined, fails, and its reason is recovered."""
    provider = ledger_for(6)
    sender = Transactor(provider.w3, dev_account(6))
    with pytest.raises(ContractRevert) as caught:
        sender.send(provider.registry.functions.withdraw(), description="withdraw", gas=200_000)
    assert caught.value.name == "NothingToWithdraw"
    assert caught.value.tx_hash is not None and caught.value.tx_hash.startswith("0x")


def test_fees_follow_the_base_fee(chain: LocalChain, ledger_for: Callable[[int], Ledger]) -> None:
    owner = ledger_for(0)
    receipt = owner.mint(owner.address, TOKEN)
    tx = chain.w3.eth.get_transaction(receipt["transactionHash"])
    block = chain.w3.eth.get_block(receipt["blockNumber"])
    assert tx["type"] == 2
    assert tx["maxFeePerGas"] >= block["baseFeePerGas"]
    assert tx["gas"] > receipt["gasUsed"]  # estimate plus margin


def test_transport_failures_are_retried_then_reported() -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise requests.exceptions.ConnectionError("connection reset")
        return "ok"

    assert with_retries(flaky, what="flaky call", url="http://x", delay=0) == "ok"
    assert len(calls) == 3

    def down() -> str:
        raise requests.exceptions.ConnectionError("refused")

    with pytest.raises(RpcUnavailable, match="chain RPC http://x unreachable: down call"):
        with_retries(down, what="down call", url="http://x", attempts=2, delay=0)


def test_non_transport_errors_are_not_retried() -> None:
    calls: list[int] = []

    def broken() -> str:
        calls.append(1)
        raise ValueError("bad argument")

    with pytest.raises(ValueError):
        with_retries(broken, what="broken", url="http://x", delay=0)
    assert len(calls) == 1


def test_a_stopped_chain_is_reported_as_unreachable() -> None:
    chain = LocalChain().start()
    deployment = chain.deploy()
    ledger = Ledger(chain.w3, deployment, dev_account(0))
    chain.stop()
    with pytest.raises(RpcUnavailable, match=f"127.0.0.1:{chain.port}"):
        ledger.balance_of(deployment.address("StakeToken"))
