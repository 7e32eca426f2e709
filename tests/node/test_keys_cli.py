"""`prime-node keys`: commands against real keystore files, with the password from the environment."""

from __future__ import annotations

import functools
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from ledger import accounts
from node.cli.main import app

FAST_SCRYPT_N = 2**10
PASSWORD = "devnet password"
ANVIL_0 = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
ANVIL_0_FILE = "anvil-dev-0--f39fd6e51aad88f6f4ce6ab8827279cfffb92266.json"

runner = CliRunner()


@pytest.fixture(autouse=True)
def fast_scrypt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands look `create_keystore` up on the module at call time, so a cheap scrypt n applies."""
    fast = functools.partial(accounts.create_keystore, iterations=FAST_SCRYPT_N)
    monkeypatch.setattr(accounts, "create_keystore", fast)


def keys(*args: str, password: str | None = PASSWORD, debug: bool = False) -> Result:
    env = {"PRIME_KEYSTORE_PASSWORD": password, "PRIME_DEBUG": "1" if debug else None}
    return runner.invoke(app, ["keys", *args], env=env)


def test_new_prints_address_and_writes_a_private_file(tmp_path: Path) -> None:
    result = keys("new", "--dir", str(tmp_path), "--label", "w1")
    assert result.exit_code == 0, result.output
    [path] = tmp_path.iterdir()
    info = accounts.read_keystore(path)
    assert f"address: {info.address}" in result.stdout
    assert str(path) in result.stdout
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert accounts.load_account(path, PASSWORD).address == info.address


def test_list_shows_label_and_address_and_skips_junk(tmp_path: Path) -> None:
    assert keys("new", "--dir", str(tmp_path), "--label", "w1").exit_code == 0
    assert keys("import-dev", "0", "--dir", str(tmp_path)).exit_code == 0
    (tmp_path / "junk.json").write_text("{not a keystore")
    result = keys("list", "--dir", str(tmp_path), password=None)
    assert result.exit_code == 0, result.output
    assert "w1" in result.stdout
    assert "anvil-dev-0" in result.stdout
    assert ANVIL_0 in result.stdout
    assert "anvil development key (public, never use on a real chain)" in result.stdout
    assert "junk" not in result.stdout


def test_list_of_empty_directory_says_so(tmp_path: Path) -> None:
    result = keys("list", "--dir", str(tmp_path))
    assert result.exit_code == 0
    assert "no keystore files" in result.stdout


def test_import_dev_writes_anvil_key_and_warns(tmp_path: Path) -> None:
    result = keys("import-dev", "0", "--dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert f"address: {ANVIL_0}" in result.stdout
    assert "anvil development key (public, never use on a real chain)" in result.stdout
    assert accounts.load_account(tmp_path / ANVIL_0_FILE, PASSWORD).address == ANVIL_0


def test_import_dev_twice_refuses_to_overwrite(tmp_path: Path) -> None:
    assert keys("import-dev", "0", "--dir", str(tmp_path)).exit_code == 0
    result = keys("import-dev", "0", "--dir", str(tmp_path))
    assert result.exit_code == 1
    assert "refusing to overwrite" in result.stderr


def test_import_dev_index_out_of_range_is_a_usage_error(tmp_path: Path) -> None:
    result = keys("import-dev", "10", "--dir", str(tmp_path))
    assert result.exit_code == 2
    assert not list(tmp_path.iterdir())


def test_show_needs_no_password_and_flags_dev_keys(tmp_path: Path) -> None:
    assert keys("import-dev", "0", "--dir", str(tmp_path)).exit_code == 0
    result = keys("show", ANVIL_0_FILE, "--dir", str(tmp_path), password=None)
    assert result.exit_code == 0, result.output
    assert f"address: {ANVIL_0}" in result.stdout
    assert "anvil development key (public, never use on a real chain)" in result.stdout
    assert "password OK" not in result.stdout


def test_show_check_decrypts_with_the_password(tmp_path: Path) -> None:
    assert keys("new", "--dir", str(tmp_path)).exit_code == 0
    [path] = tmp_path.iterdir()
    result = keys("show", str(path), "--check")
    assert result.exit_code == 0, result.output
    assert f"password OK: decrypts to {accounts.read_keystore(path).address}" in result.stdout
    assert "anvil development key" not in result.stdout


def test_wrong_password_is_one_line_without_traceback(tmp_path: Path) -> None:
    assert keys("import-dev", "0", "--dir", str(tmp_path)).exit_code == 0
    path = tmp_path / ANVIL_0_FILE
    result = keys("show", str(path), "--check", password="s3cr3t-guess")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"error: wrong password for keystore {path}"]
    assert "Traceback" not in result.output
    assert "s3cr3t-guess" not in result.output


def test_debug_variable_shows_the_traceback(tmp_path: Path) -> None:
    assert keys("import-dev", "0", "--dir", str(tmp_path)).exit_code == 0
    result = keys("show", str(tmp_path / ANVIL_0_FILE), "--check", password="wrong", debug=True)
    assert result.exit_code == 1
    assert "Traceback" in result.stderr
    assert "WrongPasswordError" in result.stderr


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    result = keys("show", str(tmp_path / "absent.json"))
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"error: keystore file not found: {tmp_path / 'absent.json'}"]


def test_empty_password_is_refused(tmp_path: Path) -> None:
    result = keys("new", "--dir", str(tmp_path), password="")
    assert result.exit_code == 1
    assert "PRIME_KEYSTORE_PASSWORD is set but empty" in result.stderr
    assert not list(tmp_path.iterdir())


def test_help_does_not_import_eth_account() -> None:
    code = "import sys, node.cli.main; sys.exit('eth_account' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    completed = subprocess.run([sys.executable, "-c", code], cwd=root, check=False)
    assert completed.returncode == 0
