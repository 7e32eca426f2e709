"""Keystore files on disk: round trips, permissions, refusal to overwrite, and the anvil dev keys."""

from __future__ import annotations

import getpass
import json
import stat
from pathlib import Path

import pytest

from ledger import accounts
from ledger.accounts import (
    AccountError,
    KeystoreExistsError,
    KeystoreFormatError,
    KeystoreNotFoundError,
    PasswordError,
    WrongPasswordError,
    create_keystore,
    dev_account,
    is_dev_address,
    list_keystores,
    load_account,
    read_keystore,
    resolve_password,
)
from ledger.errors import LedgerError

FAST_SCRYPT_N = 2**10  # eth-account's default (2**18) takes about a second per file
PASSWORD = "correct horse battery staple"
ANVIL_0 = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
ANVIL_1 = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"


def make(directory: Path, **kwargs: object) -> Path:
    return create_keystore(directory, PASSWORD, iterations=FAST_SCRYPT_N, **kwargs)  # type: ignore[arg-type]


def test_create_then_load_gives_the_same_address(tmp_path: Path) -> None:
    path = make(tmp_path)
    info = read_keystore(path)
    assert load_account(path, PASSWORD).address == info.address
    assert path.name.startswith("UTC--")
    assert path.name.endswith(info.address.lower().removeprefix("0x"))
    assert info.label is None


def test_keystore_is_scrypt_v3_json(tmp_path: Path) -> None:
    data = json.loads(make(tmp_path).read_text())
    assert data["version"] == 3
    assert data["crypto"]["kdf"] == "scrypt"


def test_given_private_key_is_kept(tmp_path: Path) -> None:
    path = make(tmp_path, private_key=dev_account(1).key, label="one")
    assert load_account(path, PASSWORD).address == ANVIL_1


def test_wrong_password_names_the_file(tmp_path: Path) -> None:
    path = make(tmp_path)
    with pytest.raises(WrongPasswordError) as caught:
        load_account(path, "not the password")
    assert str(caught.value) == f"wrong password for keystore {path}"
    assert caught.value.path == path
    assert isinstance(caught.value, AccountError)
    assert isinstance(caught.value, LedgerError)


def test_file_is_private_and_new_directory_is_0700(tmp_path: Path) -> None:
    key_dir = tmp_path / "a" / "keys"
    path = make(key_dir)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_dir.stat().st_mode) == 0o700


def test_no_temporary_file_is_left_behind(tmp_path: Path) -> None:
    path = make(tmp_path)
    assert list(tmp_path.iterdir()) == [path]


def test_label_names_the_file_and_list_reports_it(tmp_path: Path) -> None:
    path = make(tmp_path, label="worker-1")
    info = read_keystore(path)
    assert path.name == f"worker-1--{info.address.lower()[2:]}.json"
    assert list_keystores(tmp_path) == [info]
    assert info.label == "worker-1"


@pytest.mark.parametrize("label", ["../escape", "", "a/b", ".hidden", "x" * 65])
def test_unsafe_label_is_refused(tmp_path: Path, label: str) -> None:
    with pytest.raises(AccountError, match="invalid label"):
        make(tmp_path, label=label)


def test_existing_keystore_is_never_overwritten(tmp_path: Path) -> None:
    key = dev_account(0).key
    path = make(tmp_path, label="dev", private_key=key)
    before = path.read_bytes()
    with pytest.raises(KeystoreExistsError, match="refusing to overwrite"):
        create_keystore(tmp_path, "another password", label="dev", private_key=key, iterations=FAST_SCRYPT_N)
    assert path.read_bytes() == before
    assert list(tmp_path.iterdir()) == [path]


def test_list_skips_files_that_are_not_keystores(tmp_path: Path) -> None:
    good = make(tmp_path)
    (tmp_path / "junk.json").write_text("not json at all")
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00\x01")
    (tmp_path / "other.json").write_text(json.dumps({"address": "0x" + "11" * 20}))  # no crypto section
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "subdir").mkdir()
    assert [info.path for info in list_keystores(tmp_path)] == [good]


def test_list_of_missing_directory_is_empty(tmp_path: Path) -> None:
    assert list_keystores(tmp_path / "absent") == []


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(KeystoreNotFoundError, match="keystore file not found"):
        load_account(tmp_path / "nope.json", PASSWORD)


def test_malformed_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{")
    with pytest.raises(KeystoreFormatError, match="not a keystore file"):
        load_account(path, PASSWORD)


def test_broken_crypto_section_is_a_format_error(tmp_path: Path) -> None:
    path = make(tmp_path)
    data = json.loads(path.read_text())
    del data["crypto"]["kdfparams"]
    path.write_text(json.dumps(data))
    with pytest.raises(KeystoreFormatError, match="malformed keystore"):
        load_account(path, PASSWORD)


def test_address_field_that_lies_is_detected(tmp_path: Path) -> None:
    path = make(tmp_path)
    data = json.loads(path.read_text())
    data["address"] = ANVIL_0[2:].lower()
    path.write_text(json.dumps(data))
    with pytest.raises(KeystoreFormatError, match="altered"):
        load_account(path, PASSWORD)


def test_empty_password_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PasswordError):
        create_keystore(tmp_path, "", iterations=FAST_SCRYPT_N)


def test_secrets_never_appear_in_errors(tmp_path: Path) -> None:
    account = dev_account(2)
    path = make(tmp_path, private_key=account.key)
    with pytest.raises(WrongPasswordError) as caught:
        load_account(path, "hunter2-secret")
    assert "hunter2-secret" not in str(caught.value)
    assert account.key.hex() not in str(caught.value)


def test_anvil_dev_accounts_match_anvil() -> None:
    assert dev_account(0).address == ANVIL_0
    assert dev_account(1).address == ANVIL_1
    assert len(accounts.ANVIL_DEV_KEYS) == 10
    assert len(set(accounts.ANVIL_DEV_KEYS)) == 10
    assert accounts.ANVIL_DEV_KEYS[0] == "0x" + dev_account(0).key.hex()


def test_dev_index_out_of_range_is_refused() -> None:
    with pytest.raises(AccountError, match="0-9"):
        dev_account(10)
    with pytest.raises(AccountError):
        dev_account(-1)


def test_is_dev_address_ignores_case_and_prefix() -> None:
    assert is_dev_address(ANVIL_0)
    assert is_dev_address(ANVIL_1.lower())
    assert is_dev_address(ANVIL_1[2:])
    assert not is_dev_address("0x" + "11" * 20)


def test_password_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIME_KEYSTORE_PASSWORD", "from-env")
    assert resolve_password(prompt=False) == "from-env"


def test_empty_environment_password_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIME_KEYSTORE_PASSWORD", "")
    with pytest.raises(PasswordError, match="empty"):
        resolve_password()


def test_no_password_without_prompt_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRIME_KEYSTORE_PASSWORD", raising=False)
    with pytest.raises(PasswordError, match="PRIME_KEYSTORE_PASSWORD"):
        resolve_password(prompt=False)


def test_prompt_with_confirmation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRIME_KEYSTORE_PASSWORD", raising=False)
    answers = iter(["typed", "typed"])
    monkeypatch.setattr(getpass, "getpass", lambda prompt: next(answers))
    assert resolve_password(confirm=True) == "typed"


@pytest.mark.parametrize(("answers", "message"), [(["", ""], "empty"), (["one", "two"], "differ")])
def test_bad_prompt_answers_are_refused(monkeypatch: pytest.MonkeyPatch, answers: list[str], message: str) -> None:
    monkeypatch.delenv("PRIME_KEYSTORE_PASSWORD", raising=False)
    replies = iter(answers)
    monkeypatch.setattr(getpass, "getpass", lambda prompt: next(replies))
    with pytest.raises(PasswordError, match=message):
        resolve_password(confirm=True)
