"""Local mode's keys: encrypted keystores under `<run>/keys/`, the migration of an older run's plaintext keys, and
the password (PRIME_KEYSTORE_PASSWORD, a prompt on a terminal, or a one-line error).

Real keystores at eth-account's scrypt cost (about 0.5 s each) and real `prime-train run` processes.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import stat
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from eth_account import Account

from ledger.accounts import PASSWORD_ENV_VAR, WrongPasswordError, create_keystore, load_account, read_keystore
from node.daemon.local import local_settings
from trainer.roles import StaticRoles
from trainer.run import LocalKeyError, local_network

pytestmark = pytest.mark.slow  # trainers started as processes

REPO = Path(__file__).parents[2]
TASK = REPO / "configs" / "tasks" / "default.toml"
PASSWORD = "local-test-password"


def keystores(run: Path) -> dict[str, Path]:
    """The keystores of `run/keys` by role, checked to be private v3 keystores."""
    found = {}
    for path in sorted((run / "keys").glob("*.json")):
        assert "crypto" in json.loads(path.read_text()), path
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        found[path.name.split("--")[0]] = path
    return found


def plaintext_key(path: Path) -> str:
    """Writes a key as the trainer wrote them before keystores (hex, no 0x, a newline); returns its address."""
    account = Account.create()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(account.key.hex().removeprefix("0x") + "\n")
    return str(account.address)


def test_local_keys_are_encrypted_keystores_that_a_restart_decrypts_again(tmp_path: Path) -> None:
    network, keys = local_network(tmp_path, 2, PASSWORD)
    made = keystores(tmp_path)
    assert sorted(made) == ["trainer", "worker-0", "worker-1"]
    assert not list((tmp_path / "keys").glob("*.key"))
    assert load_account(made["trainer"], PASSWORD).address == network.account.address
    assert keys.paths == (made["worker-0"], made["worker-1"])
    assert PASSWORD not in repr(keys)
    assert isinstance(network.roles, StaticRoles)
    assert network.roles.members == {load_account(path, PASSWORD).address for path in keys.paths}

    again, keys_again = local_network(tmp_path, 2, PASSWORD)
    assert again.account.address == network.account.address
    assert keys_again.paths == keys.paths
    assert keystores(tmp_path) == made


def test_an_older_runs_plaintext_keys_become_keystores_of_the_same_addresses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trainer = plaintext_key(tmp_path / "keys" / "trainer.key")
    worker = plaintext_key(tmp_path / "keys" / "worker-0.key")
    with caplog.at_level(logging.INFO, logger="trainer.run"):
        network, _ = local_network(tmp_path, 1, PASSWORD)
    assert network.account.address == trainer
    made = keystores(tmp_path)
    assert sorted(made) == ["trainer", "worker-0"]
    assert load_account(made["trainer"], PASSWORD).address == trainer
    assert load_account(made["worker-0"], PASSWORD).address == worker
    assert not list((tmp_path / "keys").glob("*.key")), "a plaintext key outlived its migration"
    migrated = [r.getMessage() for r in caplog.records if "migrated" in r.getMessage()]
    assert len(migrated) == 2 and all("deleted the plaintext key" in line for line in migrated)


def test_a_migration_cut_short_after_writing_the_keystore_only_deletes_the_plaintext(tmp_path: Path) -> None:
    account = Account.create()
    keystore = create_keystore(tmp_path / "keys", PASSWORD, label="worker-0", private_key=account.key)
    (tmp_path / "keys" / "worker-0.key").write_text(account.key.hex() + "\n")
    _, keys = local_network(tmp_path, 1, PASSWORD)
    assert keys.paths == (keystore,)
    assert not (tmp_path / "keys" / "worker-0.key").exists()


def test_a_plaintext_key_that_disagrees_with_its_keystore_is_kept_and_refused(tmp_path: Path) -> None:
    keystore = create_keystore(tmp_path / "keys", PASSWORD, label="worker-0")
    plaintext = tmp_path / "keys" / "worker-0.key"
    other = plaintext_key(plaintext)
    with pytest.raises(LocalKeyError, match=other):
        local_network(tmp_path, 1, PASSWORD)
    assert plaintext.exists() and keystore.exists()


def test_a_wrong_password_at_a_restart_fails_before_a_key_is_made(tmp_path: Path) -> None:
    local_network(tmp_path, 1, PASSWORD)
    before = keystores(tmp_path)
    plaintext_key(tmp_path / "keys" / "worker-1.key")
    with pytest.raises(WrongPasswordError):
        local_network(tmp_path, 3, "not-the-password")
    assert keystores(tmp_path) == before  # no worker-1 or worker-2 keystore under a second password
    assert (tmp_path / "keys" / "worker-1.key").exists()


# --- the password at the command line --------------------------------------------------------------------------


def write_config(tmp_path: Path) -> Path:
    """A local run whose model does not exist: the command makes its keys, then stops with an error."""
    config = tmp_path / "trainer.toml"
    config.write_text(
        f'[run]\ndir = "run"\nmodel = "{tmp_path / "no-model"}"\ntask = "{TASK}"\nsteps = 1\n[local]\nworkers = 2\n'
    )
    return config


@pytest.mark.slow
def test_without_a_password_or_a_terminal_run_fails_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != PASSWORD_ENV_VAR}
    done = subprocess.run(
        [sys.executable, "-m", "trainer.cli", "run", "--config", str(write_config(tmp_path))],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,  # no controlling terminal either
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and PASSWORD_ENV_VAR in lines[0], done.stderr
    assert not (tmp_path / "run").exists()


def start_on_terminal(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """`prime-train run` with a pseudo-terminal as its controlling terminal; returns it and the terminal's end."""
    controller, terminal = os.openpty()
    env = {k: v for k, v in os.environ.items() if k != PASSWORD_ENV_VAR}
    process = subprocess.Popen(
        [sys.executable, "-m", "trainer.cli", "run", "--config", str(write_config(tmp_path))],
        cwd=tmp_path,
        env=env,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),  # after setsid: getpass opens /dev/tty
    )
    os.close(terminal)
    return process, controller


def answer(controller: int, prompt: bytes, reply: bytes, seen: bytearray, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while prompt not in seen:
        assert time.monotonic() < deadline, f"no {prompt!r} prompt; saw {bytes(seen)!r}"
        seen.extend(os.read(controller, 4096))
    del seen[: seen.index(prompt) + len(prompt)]
    os.write(controller, reply + b"\n")


def read_all(controller: int) -> bytes:
    out = bytearray()
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # EIO: the process closed the terminal
            return bytes(out)
        if not chunk:
            return bytes(out)
        out.extend(chunk)


@pytest.mark.slow
def test_on_a_terminal_run_asks_for_a_new_password_twice_and_encrypts_with_it(tmp_path: Path) -> None:
    process, controller = start_on_terminal(tmp_path)
    try:
        seen = bytearray()
        answer(controller, b"Keystore password: ", b"typed-secret", seen)
        answer(controller, b"Repeat password: ", b"typed-secret", seen)
        rest = read_all(controller)
        assert process.wait(120) == 1  # the model does not exist: it stops after making the keys
    finally:
        os.close(controller)
        if process.poll() is None:
            process.kill()
    assert b"typed-secret" not in bytes(seen) + rest  # not echoed, not logged
    made = keystores(tmp_path / "run")
    assert sorted(made) == ["trainer", "worker-0", "worker-1"]
    assert load_account(made["worker-1"], "typed-secret").address == read_keystore(made["worker-1"]).address


@pytest.mark.slow
def test_on_a_terminal_two_different_passwords_make_no_key(tmp_path: Path) -> None:
    process, controller = start_on_terminal(tmp_path)
    try:
        seen = bytearray()
        answer(controller, b"Keystore password: ", b"one", seen)
        answer(controller, b"Repeat password: ", b"two", seen)
        rest = read_all(controller)
        assert process.wait(120) == 1
    finally:
        os.close(controller)
        if process.poll() is None:
            process.kill()
    assert b"the two passwords differ" in rest
    assert not (tmp_path / "run" / "keys").exists()


@pytest.mark.slow
@pytest.mark.parametrize("password", [None, "not-the-password"])
def test_a_local_worker_whose_keystore_does_not_open_exits_1_at_once(tmp_path: Path, password: str | None) -> None:
    keystore = create_keystore(tmp_path / "keys", PASSWORD, label="worker-0")
    env = {k: v for k, v in os.environ.items() if k != PASSWORD_ENV_VAR}
    if password is not None:
        env[PASSWORD_ENV_VAR] = password
    settings = local_settings(tmp_path / "work", "http://127.0.0.1:9", "http://127.0.0.1:9", TASK)
    config = tmp_path / "worker.toml"
    config.write_text(settings.to_toml())
    command = [
        sys.executable, "-m", "node.daemon.local", "--keystore", str(keystore), "--config", str(config),
        "--trainer", "0x" + "11" * 20, "--pool", "0", "--chain-id", "31337", "--contract", "0x" + "00" * 20,
    ]  # fmt: skip
    done = subprocess.run(
        command,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    expected = PASSWORD_ENV_VAR if password is None else "wrong password"
    assert expected in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert password is None or password not in done.stderr
    assert not (tmp_path / "work").exists()  # it stopped before anything else
