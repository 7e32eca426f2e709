"""Sending transactions: nonces, gas estimation, fees (EIP-1559 or legacy), repricing, receipts, retries, reverts."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar, cast

import requests
from eth_account.signers.local import LocalAccount
from hexbytes import HexBytes
from web3 import Web3
from web3.exceptions import ContractLogicError, TransactionIndexingInProgress, TransactionNotFound, Web3RPCError
from web3.types import Nonce, TxParams, TxReceipt, Wei

from ledger.artifacts import decode_revert
from ledger.errors import ContractRevert, RpcUnavailable, TransactionFailed
from ledger.units import format_amount

log = logging.getLogger(__name__)

T = TypeVar("T")

# Failures of the transport, not of the request: worth another try.
TRANSIENT = (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError, TimeoutError)
_TRANSIENT_RPC_HINTS = ("rate limit", "too many requests", "timeout", "temporarily unavailable", "try again")


class Buildable(Protocol):
    """A bound contract function or constructor call, as web3 builds them."""

    def estimate_gas(self, transaction: TxParams | None = None) -> int: ...

    def build_transaction(self, transaction: TxParams | None = None) -> TxParams: ...


# A replacement must outbid the transaction it replaces on both fees: geth's pool wants 10% more, anvil's less.
# 9/8 clears both, and is also the most a base fee can rise in one block.
BUMP = (9, 8)
POLL_SECONDS = 0.1  # between receipt checks


@dataclass(frozen=True)
class FeePolicy:
    """How fees are offered, and raised for a transaction that is not mined.

    EIP-1559 chains: max fee = latest base fee x `base_multiplier` + tip, so a few full blocks do not strand us.
    Legacy chains (the latest block has no base fee): gasPrice = the node's `eth_gasPrice` x `gas_price_multiplier`,
    at least `min_gas_price`. A transaction still not mined `replace_after` seconds after its last broadcast is signed
    again with the same nonce and both fees raised by 12.5% or more, to at least what the chain asks then.
    `max_fee_per_gas` caps every offer (the max fee, or the gasPrice); None means no ceiling.
    """

    base_multiplier: int = 2  # >= 1
    min_priority_fee: int = 1_000_000  # 0.001 gwei; >= 0
    gas_price_multiplier: float = 1.2  # >= 1.0
    min_gas_price: int = 1_000_000  # 0.001 gwei; >= 0
    gas_margin: float = 1.2  # >= 1.0; estimates are exact on the state they ran against; state moves
    replace_after: float = 30.0  # seconds, > 0
    max_fee_per_gas: int | None = None  # wei per gas, > 0

    def __post_init__(self) -> None:
        if self.base_multiplier < 1:
            raise ValueError(f"FeePolicy.base_multiplier must be >= 1, got {self.base_multiplier}")
        if self.gas_price_multiplier < 1 or self.gas_margin < 1:
            raise ValueError(
                f"FeePolicy.gas_price_multiplier and gas_margin must be >= 1, "
                f"got {self.gas_price_multiplier} and {self.gas_margin}"
            )
        if self.min_priority_fee < 0 or self.min_gas_price < 0:
            raise ValueError(f"FeePolicy minimum fees must be >= 0, got {self.min_priority_fee}, {self.min_gas_price}")
        if not self.replace_after > 0:
            raise ValueError(f"FeePolicy.replace_after must be > 0 seconds, got {self.replace_after}")
        if self.max_fee_per_gas is not None and self.max_fee_per_gas < 1:
            raise ValueError(f"FeePolicy.max_fee_per_gas must be > 0 or None, got {self.max_fee_per_gas}")


@dataclass(frozen=True)
class Market:
    """What the chain asks now: the latest base fee (None on a legacy chain) and the node's suggestion.

    `suggested` is the node's priority fee on an EIP-1559 chain and its gas price on a legacy one.
    """

    base_fee: int | None
    suggested: int


@dataclass(frozen=True)
class Fees:
    """One broadcast's offer per gas: EIP-1559's max fee and tip, or a legacy gasPrice (`tip` is None)."""

    max_fee: int
    tip: int | None = None

    def fields(self) -> TxParams:
        if self.tip is None:
            return {"gasPrice": Wei(self.max_fee)}
        return {"maxFeePerGas": Wei(self.max_fee), "maxPriorityFeePerGas": Wei(self.tip)}

    def __str__(self) -> str:
        if self.tip is None:
            return f"gas price {_gwei(self.max_fee)}"
        return f"max fee {_gwei(self.max_fee)}, tip {_gwei(self.tip)}"


def first_fees(policy: FeePolicy, market: Market) -> Fees:
    """The fees of a transaction's first broadcast: what `market` asks, with the policy's margins, under the ceiling."""
    return _capped(policy, _asked(policy, market))


def replacement_fees(policy: FeePolicy, previous: Fees, market: Market) -> Fees | None:
    """Fees that replace `previous`: each raised by BUMP or more, and at least what `market` asks.

    None when the ceiling leaves no room for a raise that large: the last broadcast is then the one to wait for.
    """
    asked = _asked(policy, market)
    if previous.tip is None:
        wanted = Fees(max(_bumped(previous.max_fee), asked.max_fee))
    else:
        tip = max(_bumped(previous.tip), asked.tip or 0)
        wanted = Fees(max(_bumped(previous.max_fee), (market.base_fee or 0) * policy.base_multiplier + tip), tip)
    fees = _capped(policy, wanted)
    if fees.max_fee < _bumped(previous.max_fee):
        return None
    if previous.tip is not None and (fees.tip or 0) < _bumped(previous.tip):
        return None
    return fees


def _asked(policy: FeePolicy, market: Market) -> Fees:
    if market.base_fee is None:
        return Fees(max(int(market.suggested * policy.gas_price_multiplier), policy.min_gas_price))
    tip = max(market.suggested, policy.min_priority_fee)
    return Fees(market.base_fee * policy.base_multiplier + tip, tip)


def _capped(policy: FeePolicy, fees: Fees) -> Fees:
    ceiling = policy.max_fee_per_gas
    if ceiling is None or fees.max_fee <= ceiling:
        return fees
    return Fees(ceiling, None if fees.tip is None else min(fees.tip, ceiling))


def _bumped(fee: int) -> int:
    return -(-fee * BUMP[0] // BUMP[1])  # rounded up: a raise of 12.5% or more, never less


def _gwei(wei: int) -> str:
    return f"{format_amount(wei, 9, places=9)} gwei"


def revert_from_exception(exc: ContractLogicError, function: str | None, tx_hash: str | None = None) -> ContractRevert:
    """Decodes web3's revert exception into our `ContractRevert` with the custom error's name and values."""
    data = exc.data
    if isinstance(data, dict):  # Hardhat nests it: {"message": ..., "data": "0x..."}; anvil gives the hex string
        data = data.get("data")
    if isinstance(data, str) and data.startswith("0x"):
        name, args = decode_revert(bytes.fromhex(data[2:]))
        return ContractRevert(name, args, function=function, tx_hash=tx_hash, raw=data)
    message = exc.message or str(exc)
    return ContractRevert("Revert", {"message": message}, function=function, tx_hash=tx_hash)


def with_retries(action: Callable[[], T], *, what: str, url: str, attempts: int = 4, delay: float = 0.25) -> T:
    """Runs `action`, retrying transport failures with exponential backoff."""
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except TRANSIENT as exc:
            failure: Exception = exc
        except Web3RPCError as exc:
            if not any(hint in str(exc).lower() for hint in _TRANSIENT_RPC_HINTS):
                raise
            failure = exc
        if attempt == attempts:
            raise RpcUnavailable(url, f"{what}: {failure}") from failure
        log.warning("%s failed (%s); retry %d/%d", what, failure, attempt, attempts - 1)
        time.sleep(delay * 2 ** (attempt - 1))
    raise AssertionError("unreachable")


@dataclass
class _Pending:
    """One nonce's broadcasts so far; whichever of `hashes` is mined is the transaction's receipt."""

    tx: TxParams  # the last one signed
    fees: Fees  # its fees, or the higher ones a node last refused as underpriced
    hashes: list[HexBytes]
    sent_at: float  # time.monotonic() of the last broadcast
    repricing: bool = True  # False once no replacement can be sent (the ceiling, or a node's refusal)

    @property
    def nonce(self) -> int:
        return int(self.tx["nonce"])

    @property
    def shown(self) -> str:
        return "0x" + bytes(self.hashes[-1]).hex()


class Transactor:
    """Signs and sends one account's transactions, keeping its nonce locally.

    The nonce is read once from the chain's pending count and then incremented locally, so that several
    transactions can be sent back to back; any nonce complaint from the node resynchronises it. A transaction
    that is not mined in time is replaced by one with the same nonce and higher fees (see `FeePolicy`).
    """

    def __init__(
        self,
        w3: Web3,
        account: LocalAccount,
        *,
        fees: FeePolicy | None = None,
        receipt_timeout: float = 120.0,
    ) -> None:
        self.w3 = w3
        self.account = account
        self.fees = fees or FeePolicy()
        self.receipt_timeout = receipt_timeout
        self._nonce: int | None = None
        self._lock = threading.Lock()
        self._url = str(getattr(w3.provider, "endpoint_uri", "rpc"))

    @property
    def address(self) -> str:
        return str(self.account.address)

    def send(self, call: Buildable, *, description: str, value: int = 0, gas: int | None = None) -> TxReceipt:
        """Estimates, signs, sends and waits for `call`; a revert raises `ContractRevert` with decoded values."""
        with self._lock:
            params: TxParams = {"from": self.account.address, "value": value}  # type: ignore[typeddict-item]
            if gas is None:
                gas = self._estimate(call, params, description)
            market = self._market()
            fees = first_fees(self.fees, market)
            if market.base_fee is not None and fees.max_fee < market.base_fee:
                log.warning(
                    "%s: the fee ceiling holds the offer at %s, below the base fee %s; it waits for the base fee",
                    description, fees, _gwei(market.base_fee),
                )  # fmt: skip
            params.update(fees.fields())
            params["gas"] = gas
            for attempt in range(3):
                params["nonce"] = Nonce(self._next_nonce())
                tx = call.build_transaction(params)
                try:
                    tx_hash = self._broadcast(self._sign(tx))
                except Web3RPCError as exc:
                    said = str(exc).lower()
                    if ("nonce" in said or "already known" in said or "already imported" in said) and attempt < 2:
                        log.warning("nonce %s rejected (%s); resynchronising", params["nonce"], exc)
                        self._nonce = None
                        continue
                    raise TransactionFailed(f"{description}: node refused the transaction: {exc}") from exc
                self._nonce = int(params["nonce"]) + 1
                break
        return self._wait(_Pending(tx, fees, [tx_hash], time.monotonic()), description)

    def _estimate(self, call: Buildable, params: TxParams, description: str) -> int:
        try:
            estimate = with_retries(lambda: call.estimate_gas(params), what=f"estimate {description}", url=self._url)
        except ContractLogicError as exc:
            raise revert_from_exception(exc, description) from exc
        return int(estimate * self.fees.gas_margin) + 10_000

    def _market(self) -> Market:
        block = with_retries(lambda: self.w3.eth.get_block("latest"), what="read latest block", url=self._url)
        base = block.get("baseFeePerGas")
        if base is None:  # before London: no base fee, and type-2 transactions are refused
            price = with_retries(lambda: self.w3.eth.gas_price, what="read gas price", url=self._url)
            return Market(None, int(price))
        try:
            tip = int(with_retries(lambda: self.w3.eth.max_priority_fee, what="read priority fee", url=self._url))
        except Web3RPCError:  # not every node implements eth_maxPriorityFeePerGas (or eth_feeHistory)
            tip = 0
        return Market(int(base), tip)

    def _next_nonce(self) -> int:
        if self._nonce is None:
            self._nonce = with_retries(
                lambda: self.w3.eth.get_transaction_count(self.account.address, "pending"),
                what="read nonce",
                url=self._url,
            )
        return self._nonce

    def _forget_nonce(self) -> None:
        """The next send reads the nonce from the chain again (a nonce of ours was taken, or may be dropped)."""
        with self._lock:
            self._nonce = None

    def _sign(self, tx: TxParams) -> HexBytes:
        return HexBytes(self.account.sign_transaction(cast(dict[str, Any], tx)).raw_transaction)

    def _broadcast(self, raw: HexBytes) -> HexBytes:
        tx_hash = HexBytes(Web3.keccak(raw))

        attempts = 0

        def send() -> HexBytes:
            nonlocal attempts
            attempts += 1
            try:
                return HexBytes(self.w3.eth.send_raw_transaction(raw))
            except Web3RPCError as exc:
                # A retry after a lost response: the first attempt got through, and is pending ("already known")
                # or mined already ("nonce too low"), which only a lookup by its hash tells from a nonce another
                # transaction took. Only on a retry: on a first attempt the same bytes known to the node were sent
                # by another holder of the key making the same call, and this call has not run; the caller
                # resynchronises its nonce and sends it again.
                said = str(exc).lower()
                ours = "already known" in said or "already imported" in said or "nonce too low" in said
                if attempts > 1 and ours and self._known(tx_hash):
                    return tx_hash
                raise

        return with_retries(send, what="send transaction", url=self._url)

    def _known(self, tx_hash: HexBytes) -> bool:
        """Whether the node has the transaction (pending or mined)."""
        try:
            self.w3.eth.get_transaction(tx_hash)
        except TransactionNotFound:
            return False
        return True

    def _wait(self, pending: _Pending, description: str) -> TxReceipt:
        """Waits for any of `pending`'s broadcasts to be mined, replacing the last one when it waits too long."""
        deadline = time.monotonic() + self.receipt_timeout
        receipt = self._mined(pending, description)
        while receipt is None:
            now = time.monotonic()
            if now >= deadline:
                self._forget_nonce()  # if the node drops it, the next send reuses its nonce instead of queueing
                raise TransactionFailed(
                    f"{description} not mined within {self.receipt_timeout:.0f} s "
                    f"({len(pending.hashes)} broadcasts of nonce {pending.nonce}, the last at {pending.fees})",
                    tx_hash=pending.shown,
                )
            if pending.repricing and now - pending.sent_at >= self.fees.replace_after:
                receipt = self._replace(pending, description)
                if receipt is not None:
                    break
            time.sleep(POLL_SECONDS)
            receipt = self._mined(pending, description)
        if receipt["status"] != 1:
            raise self._failure(pending.tx, receipt, description, "0x" + bytes(receipt["transactionHash"]).hex())
        return receipt

    def _mined(self, pending: _Pending, description: str) -> TxReceipt | None:
        for tx_hash in pending.hashes:
            receipt = with_retries(partial(self._receipt, tx_hash), what=f"receipt of {description}", url=self._url)
            if receipt is not None:
                return receipt
        return None

    def _receipt(self, tx_hash: HexBytes) -> TxReceipt | None:
        try:
            return self.w3.eth.get_transaction_receipt(tx_hash)
        except (TransactionNotFound, TransactionIndexingInProgress):
            return None

    def _replace(self, pending: _Pending, description: str) -> TxReceipt | None:
        """Broadcasts `pending` again with higher fees; a receipt when the node says one of ours was mined meanwhile."""
        waited = time.monotonic() - pending.sent_at
        fees = replacement_fees(self.fees, pending.fees, self._market())
        if fees is None:
            pending.repricing = False
            log.warning(
                "%s (nonce %d) not mined after %.1f s at %s: the fee ceiling %s leaves no room to reprice; waiting",
                description, pending.nonce, waited, pending.fees, _gwei(self.fees.max_fee_per_gas or 0),
            )  # fmt: skip
            return None
        log.warning(
            "%s (nonce %d) not mined after %.1f s: repricing from %s to %s",
            description, pending.nonce, waited, pending.fees, fees,
        )  # fmt: skip
        tx: TxParams = {**pending.tx, **fees.fields()}  # type: ignore[typeddict-item]
        try:
            tx_hash = self._broadcast(self._sign(tx))
        except Web3RPCError as exc:
            reason = str(exc).lower()
            if "nonce too low" in reason:
                return self._nonce_used(pending, description)
            pending.sent_at = time.monotonic()
            if "underpriced" in reason:  # this node wants a larger step: the next raise starts from the refused fees
                pending.fees = fees
                log.warning("%s: replacement at %s refused as underpriced", description, fees)
            else:  # insufficient funds for the higher fees, for instance
                pending.repricing = False
                log.warning("%s: replacement refused (%s); waiting for the last broadcast", description, exc)
            return None
        pending.tx, pending.fees, pending.sent_at = tx, fees, time.monotonic()
        pending.hashes.append(tx_hash)
        return None

    def _nonce_used(self, pending: _Pending, description: str) -> TxReceipt:
        """The nonce is spent: one of our broadcasts was mined since the last look, or another sender's took it."""
        receipt = self._mined(pending, description)
        if receipt is not None:
            return receipt
        self._forget_nonce()
        raise TransactionFailed(
            f"{description}: nonce {pending.nonce} was used by another transaction; "
            f"none of its {len(pending.hashes)} broadcasts was mined",
            tx_hash=pending.shown,
        )

    def _failure(self, tx: TxParams, receipt: TxReceipt, description: str, shown: str) -> Exception:
        """Replays a failed transaction as a call at its block to recover the revert reason."""
        replay: dict[str, Any] = {key: tx[key] for key in ("from", "to", "data", "value", "gas") if key in tx}  # type: ignore[literal-required]
        try:
            self.w3.eth.call(replay, block_identifier=receipt["blockNumber"])  # type: ignore[arg-type]
        except ContractLogicError as exc:
            return revert_from_exception(exc, description, tx_hash=shown)
        return TransactionFailed(f"{description} failed on chain (out of gas?)", tx_hash=shown)
