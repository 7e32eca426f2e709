"""Encrypted Ethereum keystore files (v3, scrypt) and the public anvil development keys.

Keys live only in keystore files (DESIGN.md section 11): this module writes them atomically with
mode 0600, lists them without a password (the address is stored in clear), and decrypts them on
request. Neither a private key nor a password is ever logged or put into an exception message.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import getpass
import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils.address import to_checksum_address

from ledger.errors import LedgerError

log = logging.getLogger(__name__)

PASSWORD_ENV_VAR = "PRIME_KEYSTORE_PASSWORD"
DEV_KEY_LABEL = "anvil development key (public, never use on a real chain)"
ANVIL_MNEMONIC = "test test test test test test test test test test test junk"
ANVIL_DEV_KEY_COUNT = 10

# A v3 keystore is about 500 bytes; anything far larger is not one, so list_keystores never reads it.
_MAX_KEYSTORE_BYTES = 64 * 1024
_ADDRESS_RE = re.compile(r"^(0x)?[0-9a-fA-F]{40}$")
_LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_LABELLED_NAME_RE = re.compile(r"^(?P<label>[A-Za-z0-9][A-Za-z0-9_.-]*)--(0x)?[0-9a-fA-F]{40}\.json$")


class AccountError(LedgerError):
    """A keystore could not be created, read or decrypted; `path` names the file when there is one."""

    def __init__(self, message: str, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


class KeystoreNotFoundError(AccountError):
    """The keystore file does not exist."""


class KeystoreFormatError(AccountError):
    """The file exists but is not a readable v3 keystore."""


class WrongPasswordError(AccountError):
    """The keystore's MAC did not match: the password is wrong (or the file was tampered with)."""


class KeystoreExistsError(AccountError):
    """A keystore with the target name exists; keys are never overwritten."""


class PasswordError(AccountError):
    """No usable password: empty, mismatched confirmation, or none available without a prompt."""


@dataclass(frozen=True)
class KeystoreInfo:
    """What a keystore file reveals without its password."""

    path: Path
    address: str  # checksummed
    label: str | None


# --- reading ---------------------------------------------------------------------------------------


def _read_keystore_json(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > _MAX_KEYSTORE_BYTES:
            raise KeystoreFormatError(f"{path} is too large to be a keystore file", path)
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise KeystoreNotFoundError(f"keystore file not found: {path}", path) from exc
    except UnicodeDecodeError as exc:
        raise KeystoreFormatError(f"{path} is not a keystore file (not UTF-8 text)", path) from exc
    except OSError as exc:
        raise AccountError(f"cannot read keystore {path}: {exc.strerror or exc}", path) from exc
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise KeystoreFormatError(f"{path} is not a keystore file (invalid JSON: {exc.msg})", path) from exc
    # Geth writes "crypto"; some old v3 writers used "Crypto".
    if not isinstance(data, dict) or not isinstance(data.get("crypto", data.get("Crypto")), dict):
        raise KeystoreFormatError(f"{path} is not a keystore file (no 'crypto' section)", path)
    return data


def _label_from_name(name: str) -> str | None:
    match = _LABELLED_NAME_RE.match(name)
    if match is None or name.startswith("UTC--"):
        return None
    return match.group("label")


def read_keystore(path: Path) -> KeystoreInfo:
    """Address and label of one keystore, from the clear-text `address` field; no password needed."""
    return _info_from(path, _read_keystore_json(path))


def _info_from(path: Path, data: dict[str, Any]) -> KeystoreInfo:
    address = data.get("address")
    if not isinstance(address, str) or not _ADDRESS_RE.match(address):
        raise KeystoreFormatError(f"{path} has no valid 'address' field", path)
    return KeystoreInfo(path=path, address=to_checksum_address(address), label=_label_from_name(path.name))


def list_keystores(directory: Path) -> list[KeystoreInfo]:
    """Every keystore in `directory`, sorted by file name; other files are skipped (logged at debug)."""
    if not directory.is_dir():
        return []
    found: list[KeystoreInfo] = []
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue  # hidden files include our own half-written temporaries
        try:
            found.append(read_keystore(path))
        except AccountError as exc:
            log.debug("skipping %s: %s", path, exc)
    return found


def load_account(path: Path, password: str) -> LocalAccount:
    """Decrypt a keystore. Raises `WrongPasswordError`, `KeystoreNotFoundError` or `KeystoreFormatError`."""
    data = _read_keystore_json(path)
    info = _info_from(path, data)
    try:
        key = Account.decrypt(data, password)
    except ValueError as exc:
        # eth-keyfile signals a wrong password only through this message; any other ValueError
        # (bad hex, unknown cipher) means the file itself is broken.
        if "MAC mismatch" in str(exc):
            raise WrongPasswordError(f"wrong password for keystore {path}", path) from None
        raise KeystoreFormatError(f"{path} is a malformed keystore: {exc}", path) from None
    except (KeyError, TypeError, NotImplementedError) as exc:
        raise KeystoreFormatError(f"{path} is a malformed keystore ({type(exc).__name__})", path) from None
    account: LocalAccount = Account.from_key(key)
    if account.address != info.address:
        raise KeystoreFormatError(
            f"{path} decrypts to {account.address} but claims {info.address}; the file was altered", path
        )
    return account


# --- writing ---------------------------------------------------------------------------------------


def _keystore_name(address: str, label: str | None) -> str:
    hex_address = address.lower().removeprefix("0x")
    if label is not None:
        return f"{label}--{hex_address}.json"
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H-%M-%S.%fZ")
    return f"UTC--{stamp}--{hex_address}"  # geth's naming, so geth and clef find the file too


def _ensure_private_dir(directory: Path) -> None:
    if directory.is_dir():
        return  # an existing directory keeps the permissions its owner chose
    directory.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):  # another process created it first
        directory.mkdir(mode=0o700)
        os.chmod(directory, 0o700)  # mkdir's mode is masked by the umask


def _publish_no_clobber(tmp: Path, target: Path) -> None:
    """Give the finished temp file its final name, failing if the name is taken.

    os.link fails atomically on an existing target, unlike os.replace; file systems without hard
    links fall back to check-then-replace, which is racy only against a concurrent writer.
    """
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise KeystoreExistsError(f"refusing to overwrite existing keystore {target}", target) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        if target.exists():
            raise KeystoreExistsError(f"refusing to overwrite existing keystore {target}", target) from None
        os.replace(tmp, target)
        return
    tmp.unlink()


def create_keystore(
    directory: Path,
    password: str,
    *,
    label: str | None = None,
    private_key: bytes | None = None,
    iterations: int | None = None,
) -> Path:
    """Encrypt a new random key (or `private_key`) into a keystore file in `directory`; return its path.

    `iterations` is the scrypt work factor n (a power of two); None keeps eth-account's default
    (2**18). Only tests should lower it. The file is written to a hidden temp name, fsynced, and
    then published, so a crash never leaves a truncated keystore under the final name.
    """
    if not password:
        raise PasswordError("refusing to encrypt a keystore with an empty password")
    if label is not None and not _LABEL_RE.match(label):
        raise AccountError(
            f"invalid label {label!r}: use up to 64 letters, digits, '.', '_' or '-', starting alphanumeric"
        )
    account: LocalAccount = Account.from_key(private_key) if private_key is not None else Account.create()
    keystore = Account.encrypt(account.key, password, kdf="scrypt", iterations=iterations)

    directory = directory.expanduser()
    _ensure_private_dir(directory)
    target = directory / _keystore_name(account.address, label)
    if target.exists():
        raise KeystoreExistsError(f"refusing to overwrite existing keystore {target}", target)

    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=".keystore-", suffix=".tmp")  # mode 0600
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(keystore, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        _publish_no_clobber(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(directory)
    return target


def _fsync_dir(directory: Path) -> None:
    """Persist the new directory entry; not every platform lets a directory be opened."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError as exc:
        log.debug("cannot open %s to fsync it: %s", directory, exc)
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# --- passwords -------------------------------------------------------------------------------------


def resolve_password(env_var: str = PASSWORD_ENV_VAR, prompt: bool = True, confirm: bool = False) -> str:
    """The keystore password from `env_var`, else from a hidden prompt; the CLI edge calls this.

    This is the one place that reads the password from the environment, so library code always
    receives it as an argument. An empty password is refused either way.
    """
    from_env = os.environ.get(env_var)
    if from_env is not None:
        if not from_env:
            raise PasswordError(f"{env_var} is set but empty; set a non-empty password or unset it")
        return from_env
    if not prompt:
        raise PasswordError(f"no keystore password: set {env_var}")
    password = getpass.getpass("Keystore password: ")
    if not password:
        raise PasswordError("empty password refused")
    if confirm and getpass.getpass("Repeat password: ") != password:
        raise PasswordError("the two passwords differ")
    return password


# --- anvil development keys ------------------------------------------------------------------------

ANVIL_DEV_KEYS: tuple[str, ...]  # derived on first access by __getattr__ below


@functools.cache
def _anvil_dev_keys() -> tuple[str, ...]:
    # Derived rather than pasted so a typo cannot slip in; the mnemonic is anvil's and hardhat's default.
    Account.enable_unaudited_hdwallet_features()
    return tuple(
        Account.from_mnemonic(ANVIL_MNEMONIC, account_path=f"m/44'/60'/0'/0/{i}").key.to_0x_hex()
        for i in range(ANVIL_DEV_KEY_COUNT)
    )


@functools.cache
def _anvil_dev_addresses() -> frozenset[str]:
    return frozenset(Account.from_key(key).address.lower() for key in _anvil_dev_keys())


def __getattr__(name: str) -> Any:
    """Derive ANVIL_DEV_KEYS lazily: ten HD derivations would slow every import of this module."""
    if name == "ANVIL_DEV_KEYS":
        return _anvil_dev_keys()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dev_account(index: int) -> LocalAccount:
    """Anvil's account `index` (0-9): a public key pair for local devnets, never for a real chain."""
    if not 0 <= index < ANVIL_DEV_KEY_COUNT:
        raise AccountError(f"anvil development key index must be 0-{ANVIL_DEV_KEY_COUNT - 1}, got {index}")
    account: LocalAccount = Account.from_key(_anvil_dev_keys()[index])
    return account


def is_dev_address(address: str) -> bool:
    """Whether `address` belongs to one of the public anvil development keys (any letter case)."""
    normalized = address.lower()
    if not normalized.startswith("0x"):
        normalized = "0x" + normalized
    return normalized in _anvil_dev_addresses()
