"""A second EVM implementation beside anvil: Hardhat Network, run as a JSON-RPC node on a free loopback port.

The ledger client is tested on both (tests/ledger/test_second_evm.py), so that nothing in it leans on
one node's error wording, revert data or fee answers. Hardhat's chain (chain id, the development
mnemonic, automine) is set by contracts/hardhat.config.cjs, not by flags: its `node` task takes only
the address to listen on.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from ledger.accounts import ANVIL_DEV_KEY_COUNT
from ledger.chain import LOCAL_CHAIN_ID, REPO_ROOT, LocalChain
from ledger.errors import ChainError

HARDHAT_PACKAGE = REPO_ROOT / "contracts" / "node_modules" / "hardhat"
HARDHAT_CONFIG = REPO_ROOT / "contracts" / "hardhat.config.cjs"
_NOT_INSTALLED = "hardhat not found in contracts/node_modules: run `make install` (npm ci in contracts/)"


def find_hardhat(package: Path = HARDHAT_PACKAGE) -> Path:
    """Hardhat's command-line script (the `bin` of its package.json), pinned by contracts/package.json."""
    try:
        manifest = json.loads((package / "package.json").read_text())
    except FileNotFoundError as exc:
        raise ChainError(_NOT_INSTALLED) from exc
    except json.JSONDecodeError as exc:
        raise ChainError(f"{package / 'package.json'} is not valid JSON ({exc}): reinstall with `npm ci`") from exc
    entry = manifest.get("bin")
    script = entry.get("hardhat") if isinstance(entry, dict) else entry
    if not isinstance(script, str) or not (package / script).is_file():
        raise ChainError(f"{package} has no hardhat command-line script: reinstall with `npm ci` in contracts/")
    return package / script


def find_node() -> str:
    found = shutil.which("node")
    if found is None:
        raise ChainError("node (Node.js) not found on PATH: Hardhat runs on it")
    return found


class HardhatChain(LocalChain):
    """Runs `hardhat node` as a child process; the same start, stop, deploy and time control as anvil.

    Chain id 31337 and anvil's ten development accounts, as the config file sets them; the
    `evm_*` time-control calls `LocalChain` makes are Hardhat's own, so they work unchanged.
    """

    name = "hardhat"

    def __init__(
        self,
        *,
        port: int | None = None,
        log_path: Path | None = None,
        config: Path = HARDHAT_CONFIG,
        package: Path = HARDHAT_PACKAGE,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(
            port=port,
            chain_id=LOCAL_CHAIN_ID,
            accounts=ANVIL_DEV_KEY_COUNT,
            log_path=log_path,
            extra_args=extra_args,
        )
        self.config = config
        self.package = package
        self.cwd = package.parent.parent  # hardhat refuses to run unless it resolves itself from here

    def command(self) -> list[str]:
        if not self.config.is_file():
            raise ChainError(f"no Hardhat config at {self.config}")
        return [
            find_node(),
            str(find_hardhat(self.package)),
            "node",
            "--hostname", "127.0.0.1",
            "--port", str(self.port),
            "--config", str(self.config),
            *self.extra_args,
        ]  # fmt: skip

    def start(self, timeout: float = 60.0) -> HardhatChain:
        """As `LocalChain.start`, with longer to wait: Node.js loads Hardhat in a second or two, more when busy."""
        super().start(timeout)
        return self
