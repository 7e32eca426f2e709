"""The ledger package's exception tree; every error it raises derives from `LedgerError`."""

from __future__ import annotations

from typing import Any


class LedgerError(Exception):
    """Base of every error raised by the ledger package."""


class ArtifactError(LedgerError):
    """A compiled contract artifact is missing or malformed."""


class DeploymentError(LedgerError):
    """A deployment file is missing, malformed, or does not match the chain it names."""


class RpcUnavailable(LedgerError):
    """The JSON-RPC endpoint could not be reached (after retries)."""

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(f"chain RPC {url} unreachable: {detail}")
        self.url = url


class ContractRevert(LedgerError):
    """A call or transaction reverted; `name` and `values` are the decoded custom error when known."""

    def __init__(
        self,
        name: str,
        values: dict[str, Any],
        *,
        function: str | None = None,
        tx_hash: str | None = None,
        raw: str | None = None,
    ) -> None:
        self.name = name
        self.values = values  # not `args`: Exception.args is the message tuple
        self.function = function
        self.tx_hash = tx_hash
        self.raw = raw
        shown = ", ".join(f"{key}={_show(value)}" for key, value in values.items())
        where = f"{function} reverted" if function else "reverted"
        suffix = f" (tx {tx_hash})" if tx_hash else ""
        super().__init__(f"{where}: {name}({shown}){suffix}")


class TransactionFailed(LedgerError):
    """A transaction was mined but failed, or was never mined in time."""

    def __init__(self, message: str, *, tx_hash: str | None = None) -> None:
        super().__init__(f"{message} (tx {tx_hash})" if tx_hash else message)
        self.tx_hash = tx_hash


class ChainError(LedgerError):
    """The local chain (anvil, or Hardhat beside it) could not be started or stopped."""


class AmountError(LedgerError, ValueError):
    """A token amount given by a person could not be understood."""


def _show(value: Any) -> str:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return str(value)
