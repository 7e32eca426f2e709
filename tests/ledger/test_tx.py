"""Transaction sending against a real anvil: nonces, reverts, receipts, retries, repricing, legacy fees."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
import requests
from eth_typing import ChecksumAddress
from eth_utils import to_checksum_address
from web3 import Web3
from web3.contract.contract import ContractConstructor
from web3.exceptions import Web3RPCError
from web3.types import TxReceipt

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.errors import ContractRevert, RpcUnavailable, TransactionFailed
from ledger.tx import FeePolicy, Fees, Market, Transactor, first_fees, replacement_fees, with_retries

T = TypeVar("T")
TOKEN = 10**18
GWEI = 10**9
NO_MINING = ["--no-mining"]  # blocks come only from the test's `chain.mine()`, so a broadcast stays pending

# The project's contracts target cancun; this handwritten one deploys on any hardfork. Its code returns 42.
RUNTIME = "602a60005260206000f3"  # PUSH1 42, PUSH1 0, MSTORE, PUSH1 32, PUSH1 0, RETURN
INIT_CODE = "0x600a600c600039600a6000f3" + RUNTIME  # CODECOPY the 10 runtime bytes at offset 12, RETURN them


def deploy_42(w3: Web3) -> ContractConstructor:
    return w3.eth.contract(abi=[], bytecode=INIT_CODE).constructor()


@pytest.fixture
def paused_chain() -> Iterator[LocalChain]:
    """A fresh anvil of the newest hardfork that mines only when the test says so."""
    with LocalChain(extra_args=NO_MINING) as chain:
        yield chain


@pytest.fixture
def paused_legacy_chain() -> Iterator[LocalChain]:
    """A fresh pre-London anvil (no base fee, no type-2 transactions) that mines only when the test says so."""
    with LocalChain(hardfork="berlin", extra_args=NO_MINING) as chain:
        yield chain


def pooled(w3: Web3, sender: str) -> dict[str, Any] | None:
    """The pending pool's transaction from `sender` (these tests keep one at a time), numbers as ints."""
    pending = w3.provider.make_request("txpool_content", [])["result"]["pending"]  # type: ignore[arg-type]
    entries = list(pending.get(sender.lower(), {}).values())
    if not entries:
        return None
    (tx,) = entries
    return {key: int(value, 16) if key in ("nonce", "gasPrice", "maxFeePerGas", "maxPriorityFeePerGas") else value
            for key, value in tx.items()}  # fmt: skip


def wait_until(condition: Callable[[], T | None], what: str, timeout: float = 30) -> T:
    """Polls `condition` until it gives something; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found is not None:
            return found
        time.sleep(0.02)
    pytest.fail(f"no {what} within {timeout:.0f} s")


def wait_for_pool(w3: Web3, sender: str, wanted: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    def match() -> dict[str, Any] | None:
        tx = pooled(w3, sender)
        return tx if tx is not None and wanted(tx) else None

    return wait_until(match, f"{what} in the pool")


def offer(tx: Any) -> int:
    """What a transaction offers per gas: its max fee, or a legacy transaction's gasPrice."""
    return int(tx["maxFeePerGas"]) if "maxFeePerGas" in tx else int(tx["gasPrice"])


def contract_address(receipt: TxReceipt) -> ChecksumAddress:
    address = receipt["contractAddress"]
    assert address is not None, "the transaction created no contract"
    return address


def rpc(chain: LocalChain, method: str, *params: Any) -> Any:
    return chain.w3.provider.make_request(method, list(params))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Repriced:
    """A broadcast that the chain's price left stuck, and the replacement that was mined in its place."""

    sender: Transactor
    first: dict[str, Any]  # the first broadcast, as the pool held it
    high: int  # the price per gas that left it stuck
    receipt: TxReceipt
    mined: dict[str, Any]  # the mined transaction


def send_stuck_then_repriced(
    chain: LocalChain, make_stuck: Callable[[dict[str, Any]], int], price: Callable[[dict[str, Any]], int]
) -> Repriced:
    """Sends deploy 42 from dev account 3, repricing after 0.5 s. Once its first broadcast is in the pool,
    `make_stuck(first)` raises what the chain asks past it and returns that price; the replacement whose `price` is
    at least that is mined. The mined transaction is that replacement, with the first's nonce."""
    w3, account = chain.w3, dev_account(3)
    sender = Transactor(w3, account, fees=FeePolicy(replace_after=0.5), receipt_timeout=60)
    with ThreadPoolExecutor(1) as pool:
        sending = pool.submit(sender.send, deploy_42(w3), description="deploy 42")
        first = wait_for_pool(w3, account.address, lambda tx: True, "first broadcast")
        high = make_stuck(first)
        replacement = wait_for_pool(w3, account.address, lambda tx: price(tx) >= high, "repriced replacement")
        chain.mine()
        receipt = sending.result(timeout=60)

    mined = dict(w3.eth.get_transaction(receipt["transactionHash"]))
    assert mined["nonce"] == first["nonce"]
    assert mined["hash"].to_0x_hex() == replacement["hash"] != first["hash"]
    return Repriced(sender, first, high, receipt, mined)


def test_two_senders_sharing_a_key_resynchronise_their_nonce(
    chain: LocalChain, ledger_for: Callable[[int], Ledger]
) -> None:
    """Also when both make byte-identical transactions: once the base fee has fallen to its floor (7 wei on anvil)
    the same call at the same nonce signs to the same bytes, and the node calls first's "nonce too low" or "already
    known" although first's call never ran. It must resynchronise and send it again, not take the other's as its own
    (a third of the mints went missing that way)."""
    for _ in range(300):
        chain.mine()
    assert chain.w3.eth.get_block("latest")["baseFeePerGas"] == 7
    first, second = ledger_for(0), ledger_for(0)
    before = first.balance_of(first.address)
    first.mint(first.address, TOKEN)  # both now think nonce n+1 is next ...
    second.mint(second.address, TOKEN)  # ... second used it; first must notice and resync
    first.mint(first.address, TOKEN)
    assert first.balance_of(first.address) - before == 3 * TOKEN


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


def test_a_stuck_transaction_is_replaced_with_the_same_nonce_and_fees_for_the_new_base_fee(
    paused_chain: LocalChain, caplog: pytest.LogCaptureFixture
) -> None:
    def base_fee_past(first: dict[str, Any]) -> int:
        high = 20 * offer(first)  # the base fee jumps past what the first broadcast offers: it cannot be mined
        rpc(paused_chain, "anvil_setNextBlockBaseFeePerGas", hex(high))
        paused_chain.mine()
        return high

    w3, account = paused_chain.w3, dev_account(3)
    stuck = send_stuck_then_repriced(paused_chain, base_fee_past, offer)
    sender, first, high, receipt, mined = stuck.sender, stuck.first, stuck.high, stuck.receipt, stuck.mined
    assert mined["type"] == 2
    assert mined["maxFeePerGas"] >= high > first["maxFeePerGas"]
    assert mined["maxPriorityFeePerGas"] >= first["maxPriorityFeePerGas"] * 9 / 8
    assert w3.eth.get_code(contract_address(receipt)) == bytes.fromhex(RUNTIME)
    assert f"deploy 42 (nonce {first['nonce']}) not mined after" in caplog.text
    assert "repricing from max fee" in caplog.text
    assert bytes(account.key).hex() not in caplog.text.lower()  # the key is never logged

    rpc(paused_chain, "evm_setAutomine", True)
    following = sender.send(deploy_42(w3), description="deploy 42 again")
    assert w3.eth.get_transaction(following["transactionHash"])["nonce"] == first["nonce"] + 1


def test_the_fee_ceiling_stops_repricing_and_the_last_broadcast_is_the_one_mined(
    paused_chain: LocalChain, caplog: pytest.LogCaptureFixture
) -> None:
    w3, account = paused_chain.w3, dev_account(3)
    ceiling = 10 * GWEI  # a fresh anvil asks about 3 gwei (base fee 1 x 2 + tip 1): room for several raises
    sender = Transactor(w3, account, fees=FeePolicy(replace_after=0.1, max_fee_per_gas=ceiling), receipt_timeout=60)
    with ThreadPoolExecutor(1) as pool:
        sending = pool.submit(sender.send, deploy_42(w3), description="deploy 42")
        first = wait_for_pool(w3, account.address, lambda tx: True, "first broadcast")
        assert first["maxFeePerGas"] * 9 / 8 < ceiling  # room for a raise at least
        wait_until(lambda: True if "leaves no room to reprice" in caplog.text else None, "word of the ceiling")
        last = pooled(w3, account.address)
        time.sleep(0.5)  # five more replace_after periods: nothing more is sent
        assert pooled(w3, account.address) == last
        paused_chain.mine()
        receipt = sending.result(timeout=60)

    assert last is not None and last["hash"] != first["hash"]
    assert ceiling * 8 / 9 < last["maxFeePerGas"] <= ceiling  # it raised as far as the ceiling allows a raise
    assert receipt["transactionHash"].to_0x_hex() == last["hash"]
    assert w3.eth.get_transaction(receipt["transactionHash"])["nonce"] == first["nonce"]


def test_the_original_broadcast_is_the_receipt_when_it_is_mined_after_a_replacement(paused_chain: LocalChain) -> None:
    w3, account = paused_chain.w3, dev_account(3)
    sender = Transactor(w3, account, fees=FeePolicy(replace_after=0.5), receipt_timeout=60)
    with ThreadPoolExecutor(1) as pool:
        sending = pool.submit(sender.send, deploy_42(w3), description="deploy 42")
        first = wait_for_pool(w3, account.address, lambda tx: True, "first broadcast")
        original = rpc(paused_chain, "eth_getRawTransactionByHash", first["hash"])["result"]
        wait_for_pool(w3, account.address, lambda tx: tx["hash"] != first["hash"], "replacement")
        # the node forgets the replacement and mines the original, as one that never saw the replacement would
        for _ in range(10):
            rpc(paused_chain, "anvil_dropAllTransactions")
            try:
                w3.eth.send_raw_transaction(original)
                break
            except Web3RPCError:  # a further replacement came in between: drop it too
                continue
        paused_chain.mine()
        receipt = sending.result(timeout=60)

    assert receipt["transactionHash"].to_0x_hex() == first["hash"]
    assert receipt["status"] == 1


def test_a_nonce_taken_by_another_transaction_fails_the_send_and_the_next_send_resynchronises(
    paused_chain: LocalChain,
) -> None:
    w3, account = paused_chain.w3, dev_account(3)
    sender = Transactor(w3, account, fees=FeePolicy(replace_after=0.5), receipt_timeout=60)
    with ThreadPoolExecutor(1) as pool:
        sending = pool.submit(sender.send, deploy_42(w3), description="deploy 42")
        first = wait_for_pool(w3, account.address, lambda tx: True, "first broadcast")
        # another process holding the key spends the nonce, at fees no repricing reaches within this test
        fee = 100 * offer(first)
        other = {"to": account.address, "value": 0, "gas": 21_000, "nonce": first["nonce"], "chainId": w3.eth.chain_id,
                 "maxFeePerGas": fee, "maxPriorityFeePerGas": fee}  # fmt: skip
        other_hash = w3.eth.send_raw_transaction(account.sign_transaction(other).raw_transaction)
        paused_chain.mine()
        assert w3.eth.get_transaction_receipt(other_hash)["status"] == 1
        with pytest.raises(TransactionFailed, match=f"nonce {first['nonce']} was used by another transaction"):
            sending.result(timeout=60)

    rpc(paused_chain, "evm_setAutomine", True)
    following = sender.send(deploy_42(w3), description="deploy 42 again")
    assert w3.eth.get_transaction(following["transactionHash"])["nonce"] == first["nonce"] + 1


def test_a_chain_without_a_base_fee_gets_legacy_transactions_at_the_node_gas_price() -> None:
    with LocalChain(hardfork="berlin") as chain:
        w3 = chain.w3
        assert "baseFeePerGas" not in w3.eth.get_block("latest")
        receipt = Transactor(w3, dev_account(3)).send(deploy_42(w3), description="deploy 42")
        tx = w3.eth.get_transaction(receipt["transactionHash"])
        assert tx["type"] == 0
        assert "maxFeePerGas" not in tx
        assert tx["gasPrice"] >= w3.eth.gas_price
        assert w3.eth.call({"to": contract_address(receipt)}) == (42).to_bytes(32, "big")


def test_a_stuck_legacy_transaction_is_repriced_to_the_node_gas_price(paused_legacy_chain: LocalChain) -> None:
    def min_gas_price_past(first: dict[str, Any]) -> int:
        high = 20 * int(first["gasPrice"])
        rpc(paused_legacy_chain, "anvil_setMinGasPrice", hex(high))  # eth_gasPrice now answers `high`
        return high

    stuck = send_stuck_then_repriced(paused_legacy_chain, min_gas_price_past, lambda tx: int(tx["gasPrice"]))
    assert stuck.mined["type"] == 0
    assert stuck.mined["gasPrice"] >= stuck.high


def test_replacement_fees_raise_both_fees_by_an_eighth_and_follow_the_base_fee() -> None:
    policy = FeePolicy(min_priority_fee=0, min_gas_price=0)
    assert replacement_fees(policy, Fees(100, 10), Market(base_fee=10, suggested=1)) == Fees(113, 12)
    assert replacement_fees(policy, Fees(100, 10), Market(base_fee=1_000, suggested=1)) == Fees(2_012, 12)
    assert replacement_fees(policy, Fees(100, 10), Market(base_fee=10, suggested=50)) == Fees(113, 50)
    assert replacement_fees(policy, Fees(100), Market(base_fee=None, suggested=50)) == Fees(113)
    assert replacement_fees(policy, Fees(100), Market(base_fee=None, suggested=200)) == Fees(240)  # x 1.2


def test_the_ceiling_caps_offers_and_refuses_a_raise_it_cannot_fit() -> None:
    policy = FeePolicy(min_priority_fee=0, min_gas_price=0, max_fee_per_gas=120)
    assert first_fees(policy, Market(base_fee=100, suggested=30)) == Fees(120, 30)
    assert first_fees(policy, Market(base_fee=None, suggested=500)) == Fees(120)
    assert replacement_fees(policy, Fees(100, 10), Market(base_fee=10, suggested=1)) == Fees(113, 12)
    assert replacement_fees(policy, Fees(100, 10), Market(base_fee=1_000, suggested=1)) == Fees(120, 12)
    assert replacement_fees(policy, Fees(113, 12), Market(base_fee=10, suggested=1)) is None  # 128 > 120
    assert replacement_fees(policy, Fees(110, 110), Market(base_fee=0, suggested=0)) is None  # the tip cannot rise


@pytest.mark.parametrize(
    "field, value",
    [("replace_after", 0), ("max_fee_per_gas", 0), ("base_multiplier", 0), ("gas_price_multiplier", 0.9)],
)
def test_fee_policy_refuses_values_out_of_bounds(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        FeePolicy(**{field: value})
