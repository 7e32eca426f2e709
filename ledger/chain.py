"""A local chain: anvil on a free loopback port, with the contracts deployed on it."""

from __future__ import annotations

import glob
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from eth_account.signers.local import LocalAccount
from web3 import Web3

from ledger.accounts import dev_account
from ledger.deployment import DEFAULT_MIN_CHALLENGE_WINDOW, DEFAULT_UNBONDING_PERIOD, Deployment, deploy
from ledger.errors import ChainError

REPO_ROOT = Path(__file__).resolve().parent.parent
LOCAL_CHAIN_ID = 31337


def find_anvil() -> str:
    """The anvil binary from contracts/node_modules (pinned by package.json), else from PATH."""
    pattern = str(REPO_ROOT / "contracts" / "node_modules" / "@foundry-rs" / "anvil-*" / "bin" / "anvil")
    for candidate in sorted(glob.glob(pattern)):
        return candidate
    found = shutil.which("anvil")
    if found is None:
        raise ChainError("anvil not found: run `make install` (npm ci in contracts/) or put anvil on PATH")
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalChain:
    """Runs anvil as a child process; `start()` waits until it answers, `stop()` ends it.

    Its accounts are anvil's well-known development keys (public: never use them on a real chain).
    """

    name = "anvil"  # the EVM implementation, as error messages name it
    cwd: Path | None = None  # the chain process's working directory (None: this process's)

    def __init__(
        self,
        *,
        port: int | None = None,
        chain_id: int = LOCAL_CHAIN_ID,
        block_time: float | None = None,
        accounts: int = 10,
        log_path: Path | None = None,
        hardfork: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.port = port or free_port()
        self.chain_id = chain_id
        self.block_time = block_time
        self.accounts = accounts
        self.log_path = log_path
        self.hardfork = hardfork  # None: anvil's newest; "berlin" makes a chain without a base fee (legacy fees)
        self.extra_args = tuple(extra_args)
        self._process: subprocess.Popen[bytes] | None = None
        self._w3: Web3 | None = None

    @property
    def rpc_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def w3(self) -> Web3:
        if self._w3 is None:
            raise ChainError("local chain is not running")
        return self._w3

    def command(self) -> list[str]:
        """The command line of the chain process (a subclass runs another EVM implementation)."""
        command = [
            find_anvil(),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--chain-id", str(self.chain_id),
            "--accounts", str(self.accounts),
        ]  # fmt: skip
        if self.block_time:
            command += ["--block-time", str(self.block_time)]
        if self.hardfork:
            command += ["--hardfork", self.hardfork]
        return command + list(self.extra_args)

    def start(self, timeout: float = 30.0) -> LocalChain:
        command = self.command()
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115 - lives with the process
        self._process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.cwd
        )
        w3 = Web3(Web3.HTTPProvider(self.rpc_url, request_kwargs={"timeout": 10}))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ChainError(f"{self.name} exited with code {self._process.returncode} on port {self.port}")
            try:
                if w3.eth.chain_id == self.chain_id:
                    self._w3 = w3
                    return self
            except Exception:  # not listening yet: connection refused, reset, or a half-started server
                time.sleep(0.05)
        self.stop()
        raise ChainError(f"{self.name} did not answer on {self.rpc_url} within {timeout:.0f} s")

    def stop(self) -> None:
        process, self._process, self._w3 = self._process, None, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def deploy(
        self,
        deployer: LocalAccount | None = None,
        *,
        unbonding_period: int = DEFAULT_UNBONDING_PERIOD,
        min_challenge_window: int = DEFAULT_MIN_CHALLENGE_WINDOW,
    ) -> Deployment:
        """Deploys the contracts with anvil's account 0 (or `deployer`)."""
        return deploy(
            self.w3,
            deployer or dev_account(0),
            rpc_url=self.rpc_url,
            unbonding_period=unbonding_period,
            min_challenge_window=min_challenge_window,
        )

    # Time control: the challenge window and unbonding are measured in block timestamps.
    def increase_time(self, seconds: int) -> int:
        """Moves chain time forward and mines a block; returns the new block timestamp."""
        self.w3.provider.make_request("evm_increaseTime", [seconds])  # type: ignore[arg-type]
        self.mine()
        return int(self.w3.eth.get_block("latest")["timestamp"])

    def set_next_timestamp(self, timestamp: int) -> None:
        """The next mined block (for example the next transaction's) gets exactly `timestamp`."""
        self.w3.provider.make_request("evm_setNextBlockTimestamp", [timestamp])  # type: ignore[arg-type]

    def mine(self) -> None:
        self.w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]

    def snapshot(self) -> str:
        return str(self.w3.provider.make_request("evm_snapshot", [])["result"])  # type: ignore[arg-type]

    def revert(self, snapshot_id: str) -> None:
        response = self.w3.provider.make_request("evm_revert", [snapshot_id])  # type: ignore[arg-type]
        if not response.get("result"):
            raise ChainError(f"could not revert to snapshot {snapshot_id}")

    def __enter__(self) -> LocalChain:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
