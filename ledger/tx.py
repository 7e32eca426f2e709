"""Sending transactions: nonces, gas estimation, EIP-1559 fees, receipts, retries, decoded reverts."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import requests
from eth_account.signers.local import LocalAccount
from hexbytes import HexBytes
from web3 import Web3
from web3.exceptions import ContractLogicError, TimeExhausted, Web3RPCError
from web3.types import Nonce, TxParams, TxReceipt, Wei

from ledger.artifacts import decode_revert
from ledger.errors import ContractRevert, RpcUnavailable, TransactionFailed

log = logging.getLogger(__name__)

T = TypeVar("T")

# Failures of the transport, not of the request: worth another try.
TRANSIENT = (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError, TimeoutError)
_TRANSIENT_RPC_HINTS = ("rate limit", "too many requests", "timeout", "temporarily unavailable", "try again")


class Buildable(Protocol):
    """A bound contract function or constructor call, as web3 builds them."""

    def estimate_gas(self, transaction: TxParams | None = None) -> int: ...

    def build_transaction(self, transaction: TxParams | None = None) -> TxParams: ...


@dataclass(frozen=True)
class FeePolicy:
    """EIP-1559 fee choice: max fee = base fee x `base_multiplier` + tip, so a few full blocks do not strand us."""

    base_multiplier: int = 2
    min_priority_fee: int = 1_000_000  # 0.001 gwei
    gas_margin: float = 1.2  # estimates are exact on the state they ran against; state moves


def revert_from_exception(exc: ContractLogicError, function: str | None, tx_hash: str | None = None) -> ContractRevert:
    """Decodes web3's revert exception into our `ContractRevert` with the custom error's name and values."""
    data = exc.data
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


class Transactor:
    """Signs and sends one account's transactions, keeping its nonce locally.

    The nonce is read once from the chain's pending count and then incremented locally, so that several
    transactions can be sent back to back; any nonce complaint from the node resynchronises it.
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
            params.update(self._fee_fields())
            params["gas"] = gas
            for attempt in range(3):
                params["nonce"] = Nonce(self._next_nonce())
                tx = call.build_transaction(params)
                signed = self.account.sign_transaction(dict(tx))  # type: ignore[arg-type]
                try:
                    tx_hash = self._broadcast(signed.raw_transaction)
                except Web3RPCError as exc:
                    if "nonce" in str(exc).lower() and attempt < 2:
                        log.warning("nonce %s rejected (%s); resynchronising", params["nonce"], exc)
                        self._nonce = None
                        continue
                    raise TransactionFailed(f"{description}: node refused the transaction: {exc}") from exc
                self._nonce = int(params["nonce"]) + 1
                break
        return self._wait(tx_hash, tx, description)

    def _estimate(self, call: Buildable, params: TxParams, description: str) -> int:
        try:
            estimate = with_retries(lambda: call.estimate_gas(params), what=f"estimate {description}", url=self._url)
        except ContractLogicError as exc:
            raise revert_from_exception(exc, description) from exc
        return int(estimate * self.fees.gas_margin) + 10_000

    def _fee_fields(self) -> TxParams:
        block = with_retries(lambda: self.w3.eth.get_block("latest"), what="read latest block", url=self._url)
        base = int(block.get("baseFeePerGas", 0))
        try:
            tip = max(int(self.w3.eth.max_priority_fee), self.fees.min_priority_fee)
        except Web3RPCError:  # not every node implements eth_maxPriorityFeePerGas
            tip = self.fees.min_priority_fee
        return {"maxFeePerGas": Wei(base * self.fees.base_multiplier + tip), "maxPriorityFeePerGas": Wei(tip)}

    def _next_nonce(self) -> int:
        if self._nonce is None:
            self._nonce = with_retries(
                lambda: self.w3.eth.get_transaction_count(self.account.address, "pending"),
                what="read nonce",
                url=self._url,
            )
        return self._nonce

    def _broadcast(self, raw: HexBytes | bytes) -> HexBytes:
        tx_hash = HexBytes(Web3.keccak(raw))

        def send() -> HexBytes:
            try:
                return HexBytes(self.w3.eth.send_raw_transaction(raw))
            except Web3RPCError as exc:
                # a retry after a lost response: the first attempt got through
                if "already known" in str(exc).lower() or "already imported" in str(exc).lower():
                    return tx_hash
                raise

        return with_retries(send, what="send transaction", url=self._url)

    def _wait(self, tx_hash: HexBytes, tx: TxParams, description: str) -> TxReceipt:
        shown = "0x" + bytes(tx_hash).hex()
        try:
            receipt = with_retries(
                lambda: self.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=self.receipt_timeout),
                what=f"receipt of {description}",
                url=self._url,
            )
        except TimeExhausted as exc:
            raise TransactionFailed(
                f"{description} not mined within {self.receipt_timeout:.0f} s", tx_hash=shown
            ) from exc
        if receipt["status"] != 1:
            raise self._failure(tx, receipt, description, shown)
        return receipt

    def _failure(self, tx: TxParams, receipt: TxReceipt, description: str, shown: str) -> Exception:
        """Replays a failed transaction as a call at its block to recover the revert reason."""
        replay: dict[str, Any] = {key: tx[key] for key in ("from", "to", "data", "value", "gas") if key in tx}  # type: ignore[literal-required]
        try:
            self.w3.eth.call(replay, block_identifier=receipt["blockNumber"])  # type: ignore[arg-type]
        except ContractLogicError as exc:
            return revert_from_exception(exc, description, tx_hash=shown)
        return TransactionFailed(f"{description} failed on chain (out of gas?)", tx_hash=shown)
