"""The pool `benchmarks/scale.py` loads: anvil, the four contracts, one pool and N staked member nodes.

Kept apart from the load generator so that other scale runs (`--validators K`) set up the same pool the same way:
`setup_pool` returns everything a run needs, `register_members` is the fast path for many nodes.

Registering 1,000 members one transaction at a time, waiting for each receipt, is two transactions a node and
about 40 ms each on anvil. The fast path keeps every contract call real (the registry checks each node's EIP-712
binding signature, the pool checks the provider's stake) and takes out only the waiting:

- one provider stakes for all the nodes at once (`minStakePerNode` x N in one `stake`);
- each node key signs its binding locally (the one per-node cost left, about 2 ms);
- automine is off while the calls go in: all `addNode` calls go out as one JSON-RPC batch of `eth_sendTransaction`
  (anvil holds the dev accounts' keys), then one `evm_mine`; then the nodes' gas money (`anvil_setBalance`), their
  impersonation and all their `join` calls, one batch each, and one more block;
- every receipt is read back in one batch and must have status 1, and membership is read back from ComputePool.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.deployment import Deployment
from ledger.types import PoolConfig

TOKEN = 10**18
MIN_STAKE = 100 * TOKEN
BATCH = 250  # JSON-RPC calls in one HTTP request
GAS = 400_000  # given, not estimated: an estimate is one more round trip a call, and the calls cannot revert
OWNER, PROVIDER, TRAINER = 0, 1, 0  # anvil dev accounts; the trainer is the pool's owner, as on a devnet
FIRST_VALIDATOR = 2  # validators are dev accounts 2, 3, ...


class SetupError(RuntimeError):
    """The pool could not be set up: a transaction failed or a member is missing on chain."""


@dataclass
class Pool:
    """A running chain with one pool: its members, validators and trainer, and how long each setup stage took."""

    chain: LocalChain
    deployment: Deployment
    pool_id: int
    trainer: LocalAccount
    members: list[LocalAccount]
    validators: list[LocalAccount]
    seconds: dict[str, float] = field(default_factory=dict)

    def stop(self) -> None:
        self.chain.stop()


def node_keys(count: int, label: str = "scale") -> list[LocalAccount]:
    """`count` distinct node keys, the same every run (a rerun's files and logs compare)."""
    return [Account.from_key(hashlib.sha256(f"{label}-{i}".encode()).digest()) for i in range(count)]


def rpc_batch(url: str, calls: Sequence[tuple[str, list[Any]]]) -> list[Any]:
    """The results of `calls` (method, params), sent `BATCH` to an HTTP request; any error raises `SetupError`."""
    results: list[Any] = []
    for start in range(0, len(calls), BATCH):
        chunk = calls[start : start + BATCH]
        body = [{"jsonrpc": "2.0", "id": i, "method": m, "params": p} for i, (m, p) in enumerate(chunk)]
        request = urllib.request.Request(url, json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            answers = sorted(json.loads(response.read()), key=lambda a: a["id"])
        for answer in answers:
            if "error" in answer:
                raise SetupError(f"{chunk[answer['id']][0]} failed: {answer['error']}")
            results.append(answer["result"])
    return results


def _mine_checked(chain: LocalChain, tx_hashes: list[str], what: str) -> None:
    """Mines one block with everything pending, then every receipt of `tx_hashes` must say success."""
    rpc_batch(chain.rpc_url, [("evm_mine", [])])
    receipts = rpc_batch(chain.rpc_url, [("eth_getTransactionReceipt", [h]) for h in tx_hashes])
    failed = [h for h, r in zip(tx_hashes, receipts, strict=True) if r is None or int(r["status"], 16) != 1]
    if failed:
        raise SetupError(f"{len(failed)} of {len(tx_hashes)} {what} transactions failed, e.g. {failed[0]}")


def register_members(chain: LocalChain, provider: Ledger, pool_id: int, nodes: Sequence[LocalAccount]) -> None:
    """Binds every node to `provider` (already staked for them) and joins each to `pool_id`: see the module doc."""
    url = chain.rpc_url
    registry, pools = provider.registry, provider.pools

    def tx(sender: str, to: str, data: str, nonce: int) -> tuple[str, list[Any]]:
        """A call with its nonce given: a batch is taken in concurrently, and anvil would hand two the same one."""
        params = {"from": sender, "to": to, "data": data, "gas": hex(GAS), "nonce": hex(nonce)}
        return ("eth_sendTransaction", [params])

    rpc_batch(url, [("evm_setAutomine", [False])])
    try:
        first = provider.w3.eth.get_transaction_count(provider.address, "pending")
        binds = [
            tx(provider.address, registry.address, registry.encode_abi("addNode", [n.address, sig]), first + i)
            for i, n in enumerate(nodes)
            for sig in [provider.node_binding_signature(n)]
        ]
        _mine_checked(chain, rpc_batch(url, binds), "addNode")
        money = [("anvil_setBalance", [n.address, hex(10**20)]) for n in nodes]
        rpc_batch(url, money + [("anvil_impersonateAccount", [n.address]) for n in nodes])
        join = pools.encode_abi("join", [pool_id])
        _mine_checked(chain, rpc_batch(url, [tx(n.address, pools.address, join, 0) for n in nodes]), "join")
    finally:
        rpc_batch(url, [("evm_setAutomine", [True])])
    missing = [n.address for n in (nodes[0], nodes[-1]) if not provider.is_member(pool_id, n.address)]
    if missing:
        raise SetupError(f"nodes {missing} are not members of pool {pool_id} after joining")


def start_chain(root: Path) -> LocalChain:
    """Anvil with no block gas limit: one block takes every node's `addNode`, the next every `join`."""
    return LocalChain(log_path=root / "anvil.log", extra_args=("--disable-block-gas-limit",)).start()


def setup_pool(root: Path, members: int, validators: int = 1, *, challenge_window: int = 3600) -> Pool:
    """A fresh chain and pool with `members` staked member nodes and `validators` appointed validators; the
    deployment is saved to `root/deployment.json` for the trainer."""
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    chain = start_chain(root)
    try:
        deployment = chain.deploy()
        deployment.save(root / "deployment.json")
        seconds["chain and contracts"] = time.perf_counter() - started
        owner = Ledger(chain.w3, deployment, dev_account(OWNER))
        provider = Ledger(chain.w3, deployment, dev_account(PROVIDER))
        config = PoolConfig(
            name="scale",
            model_hash=hashlib.sha256(b"scale-model").digest(),
            spec_uri="",  # the defaults' terms: the trainer's TOML sets the coordinator's
            trainer=dev_account(TRAINER).address,
            min_stake_per_node=MIN_STAKE,
            challenge_window=challenge_window,
            reward_per_unit=10**12,
            slash_amount=MIN_STAKE // 2,
            max_nodes=0,
        )
        pool_id = owner.create_pool(config)
        appointed = [dev_account(FIRST_VALIDATOR + i) for i in range(validators)]
        for validator in appointed:
            owner.set_validator(pool_id, validator.address)
        owner.mint(provider.address, MIN_STAKE * members)
        provider.stake(MIN_STAKE * members)
        seconds["pool, validators, stake"] = time.perf_counter() - started - sum(seconds.values())
        nodes = node_keys(members)
        register_members(chain, provider, pool_id, nodes)
        seconds[f"{members} members registered"] = time.perf_counter() - started - sum(seconds.values())
    except BaseException:
        chain.stop()
        raise
    return Pool(chain, deployment, pool_id, dev_account(TRAINER), nodes, appointed, seconds)
