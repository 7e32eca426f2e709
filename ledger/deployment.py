"""The deployment file (`deployment.json`) and deploying the four contracts."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eth_account.signers.local import LocalAccount
from eth_utils import is_checksum_address, keccak, to_checksum_address
from web3 import Web3

from ledger.artifacts import CONTRACT_NAMES, load_artifact
from ledger.errors import DeploymentError
from ledger.tx import Transactor

DEFAULT_UNBONDING_PERIOD = 7 * 24 * 3600  # must be at least every pool's challenge window (default 24 h)
DEFAULT_MIN_CHALLENGE_WINDOW = 3600  # no pool may give its validators less than an hour to check a file


@dataclass(frozen=True)
class Deployment:
    """Where the contracts live: what every role needs to reach the ledger."""

    chain_id: int
    rpc_url: str
    block: int
    contracts: dict[str, str] = field(default_factory=dict)

    def address(self, name: str) -> str:
        try:
            return self.contracts[name]
        except KeyError as exc:
            raise DeploymentError(f"deployment has no {name} address") from exc

    def to_json(self) -> dict[str, Any]:
        return {"chain_id": self.chain_id, "rpc_url": self.rpc_url, "block": self.block, "contracts": self.contracts}

    @classmethod
    def from_json(cls, data: Any) -> Deployment:
        try:
            contracts = {name: str(data["contracts"][name]) for name in CONTRACT_NAMES}
            deployment = cls(int(data["chain_id"]), str(data["rpc_url"]), int(data["block"]), contracts)
        except (KeyError, TypeError, ValueError) as exc:
            raise DeploymentError(f"malformed deployment: missing or invalid {exc}") from exc
        for name, address in contracts.items():
            if not is_checksum_address(address) and not Web3.is_address(address):
                raise DeploymentError(f"deployment address of {name} is not an address: {address!r}")
        return cls(
            deployment.chain_id,
            deployment.rpc_url,
            deployment.block,
            {name: to_checksum_address(address) for name, address in contracts.items()},
        )

    def save(self, path: Path) -> None:
        """Writes atomically: a reader never sees half a file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
            json.dump(self.to_json(), tmp, indent=2)
            tmp.write("\n")
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp.name, path)

    @classmethod
    def load(cls, path: Path) -> Deployment:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise DeploymentError(f"no deployment file at {path}; run `prime-pool deploy` first") from exc
        except json.JSONDecodeError as exc:
            raise DeploymentError(f"{path} is not valid JSON: {exc}") from exc
        return cls.from_json(data)


def role_id(name: str) -> bytes:
    return keccak(text=name)


def deploy(
    w3: Web3,
    deployer: LocalAccount,
    *,
    rpc_url: str,
    unbonding_period: int = DEFAULT_UNBONDING_PERIOD,
    min_challenge_window: int = DEFAULT_MIN_CHALLENGE_WINDOW,
    keep_admin: bool = False,
) -> Deployment:
    """Deploys StakeToken, NodeRegistry, ComputePool and WorkLedger and wires their roles.

    Afterwards the deployer renounces the admin role of the registry and the pool contract (unless
    `keep_admin`), so nobody can later grant itself the right to slash stake or eject nodes.
    The deployer keeps the StakeToken's mint right (it is a devnet/testnet token).
    """
    sender = Transactor(w3, deployer)

    def create(name: str, *args: Any) -> str:
        artifact = load_artifact(name)
        factory = w3.eth.contract(abi=artifact.abi, bytecode=artifact.bytecode)
        receipt = sender.send(factory.constructor(*args), description=f"deploy {name}")
        address = receipt["contractAddress"]
        if address is None:
            raise DeploymentError(f"deploying {name} created no contract (tx {receipt['transactionHash'].hex()})")
        return to_checksum_address(address)

    first_block = w3.eth.block_number + 1
    token = create("StakeToken", deployer.address)
    registry = create("NodeRegistry", token, unbonding_period)
    pools = create("ComputePool", registry, min_challenge_window)
    ledger = create("WorkLedger", pools, registry)

    registry_c = w3.eth.contract(address=to_checksum_address(registry), abi=load_artifact("NodeRegistry").abi)
    pools_c = w3.eth.contract(address=to_checksum_address(pools), abi=load_artifact("ComputePool").abi)
    admin = b"\x00" * 32
    sender.send(registry_c.functions.grantRole(role_id("SLASHER_ROLE"), ledger), description="grant SLASHER_ROLE")
    sender.send(registry_c.functions.grantRole(role_id("POOL_ROLE"), pools), description="grant POOL_ROLE")
    sender.send(pools_c.functions.grantRole(role_id("LEDGER_ROLE"), ledger), description="grant LEDGER_ROLE")
    if not keep_admin:
        sender.send(registry_c.functions.renounceRole(admin, deployer.address), description="renounce registry admin")
        sender.send(pools_c.functions.renounceRole(admin, deployer.address), description="renounce pool admin")

    contracts = {"StakeToken": token, "NodeRegistry": registry, "ComputePool": pools, "WorkLedger": ledger}
    return Deployment(chain_id=w3.eth.chain_id, rpc_url=rpc_url, block=first_block, contracts=contracts)
