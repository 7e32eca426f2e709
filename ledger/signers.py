"""The account a pair of key flags names (a keystore, or an anvil development key), and a ledger opened as it.

Used by the commands (through `ledger.cli.common`) and by the trainer's network mode, which takes the same choice
from its config. Importing it loads no web3: the helpers import what they need when called, so `--help` stays
instant. A wrong choice of flags is a `core.errors.InputError` (a command's `CommandError`) naming the flags.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import InputError

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from ledger.client import Ledger

Warn = Callable[[str], None]  # shows a person a warning (the command-line kit prints a yellow line on stderr)


def warn_on_stderr(message: str) -> None:
    """The default `Warn`: the message as a plain line on stderr."""
    print(message, file=sys.stderr)


@dataclass(frozen=True)
class KeyFlags:
    """The pair of flags that names one signer, for error messages, and where its password comes from."""

    keystore: str = "--keystore"
    dev_key: str = "--dev-key"
    password_env: str | None = None  # None: PRIME_KEYSTORE_PASSWORD


SIGNER_FLAGS = KeyFlags()


def check_key_flags(
    keystore: Path | None, dev_key: int | None, *, required: bool, flags: KeyFlags = SIGNER_FLAGS
) -> None:
    """At most one of the two flags, and exactly one when the command signs."""
    if keystore is not None and dev_key is not None:
        raise InputError(f"give {flags.keystore} or {flags.dev_key}, not both")
    if required and keystore is None and dev_key is None:
        raise InputError(
            f"this command signs a transaction: pass {flags.keystore} FILE "
            f"(or {flags.dev_key} N on a local anvil chain)"
        )


def check_dev_key_allowed(chain_id: int, flag: str = "--dev-key") -> None:
    """The anvil keys are public: anyone can spend from them on a real chain, so only chain 31337 accepts them."""
    from ledger.chain import LOCAL_CHAIN_ID

    if chain_id != LOCAL_CHAIN_ID:
        raise InputError(
            f"{flag} is refused on chain {chain_id}: anvil development keys are public and work only on a local "
            f"anvil chain (id {LOCAL_CHAIN_ID}); sign with a keystore instead"
        )


def load_signer(
    keystore: Path | None,
    dev_key: int | None,
    *,
    chain_id: int,
    flags: KeyFlags = SIGNER_FLAGS,
    warn: Warn = warn_on_stderr,
) -> LocalAccount | None:
    """The account the flags name (None when neither is given), decrypting a keystore with its password."""
    check_key_flags(keystore, dev_key, required=False, flags=flags)
    if dev_key is not None:
        check_dev_key_allowed(chain_id, flags.dev_key)
        from ledger.accounts import dev_account

        account = dev_account(dev_key)
        warn(f"using anvil development key {dev_key} ({account.address}): public, never use on a real chain")
        return account
    if keystore is None:
        return None
    from ledger import accounts

    env = flags.password_env if flags.password_env and flags.password_env in os.environ else accounts.PASSWORD_ENV_VAR
    return accounts.load_account(keystore.expanduser(), accounts.resolve_password(env))


def require_signer(
    keystore: Path | None,
    dev_key: int | None,
    *,
    chain_id: int,
    flags: KeyFlags = SIGNER_FLAGS,
    warn: Warn = warn_on_stderr,
) -> LocalAccount:
    check_key_flags(keystore, dev_key, required=True, flags=flags)
    account = load_signer(keystore, dev_key, chain_id=chain_id, flags=flags, warn=warn)
    assert account is not None  # check_key_flags(required=True) guarantees a flag
    return account


def open_ledger(
    deployment: Path,
    rpc_url: str | None,
    keystore: Path | None,
    dev_key: int | None,
    need_signer: bool = True,
    *,
    warn: Warn = warn_on_stderr,
) -> Ledger:
    """Loads the deployment, connects (checking the chain id), and signs as the account the flags name."""
    from ledger.client import Ledger
    from ledger.deployment import Deployment

    check_key_flags(keystore, dev_key, required=need_signer)
    loaded = Deployment.load(deployment)
    if rpc_url:
        loaded = replace(loaded, rpc_url=rpc_url)
    if dev_key is not None:  # refuse before touching the network
        check_dev_key_allowed(loaded.chain_id)
    ledger = Ledger.connect(loaded)
    account = load_signer(keystore, dev_key, chain_id=loaded.chain_id, warn=warn)
    return ledger if account is None else ledger.as_account(account)
