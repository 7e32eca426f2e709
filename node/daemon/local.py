"""Local mode's worker: the worker daemon (`node.daemon.worker`) over `LocalWorkChain`, a chain that is not there.

`prime-train run --local-workers N` starts N of these, as `python -m node.daemon.local ...`. Each runs the same
loop as `prime-node start`: ask the trainer's coordinator for a signed assignment, hold the weights of its step
(fetched through SHARDCAST from the trainer's origin, signature checked), generate the file with proofs, journal
it in the state folder, upload it signed. The chain's part degrades by what `LocalWorkChain` answers, not by
branches in the loop: the trainer's own workers are always members (each its own provider, nothing staked),
"submitting" a batch records its root in memory, nothing is ever invalidated, and the challenge window closes at
once with nothing to claim (the trainer accepts every upload of its workers; no validator judges them).

Its settings are the `[worker]` table of the file `--config` names (`node.config.WorkerSettings`, as node.toml's),
which the trainer writes from `local_settings`; the pool's terms (its async level) come as flags. Its key is the
keystore `--keystore` names, decrypted with the password in PRIME_KEYSTORE_PASSWORD (set by the trainer, never on
the command line). It exits 0 on SIGTERM or SIGINT (after the file in progress), and when the coordinator has been
unreachable for `patience` seconds (the trainer finished); 1 after `max_failures` failed iterations in a row (a
policy it cannot fetch or trust, a task it cannot generate), and at once when its keystore or settings do not
open.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import InputError, NodeError
from core.signals import run_until_signalled
from core.trace import configure_tracing
from ledger.types import BatchRecord, BatchStatus, PoolConfig, PoolInfo, StakeInfo
from node.daemon.chain import SlotInUse
from protocol.signing import SigningDomain
from protocol.terms import DEFAULT_ASYNC_LEVEL

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from ledger.events import BatchInvalidated
    from node.config import WorkerSettings
    from protocol.pool_spec import Pool

log = logging.getLogger("node.worker")

ZERO_ADDRESS = "0x" + "00" * 20  # the provider of a batch nobody recorded, as getBatch answers

LOCAL_TX = "local"  # what the journal records as the "transaction" of a local batch


class LocalChainError(NodeError):
    """Something was asked of local mode's chain that only a real chain does (claiming rewards)."""


class LocalWorkChain:
    """`node.daemon.chain.WorkChain` without a chain, for the trainer's own trusted workers.

    Batches live in memory: after a restart the journal's submitted batches read as unknown here, which the
    daemon leaves alone (`submission_gone` is False: nothing reorganises a local journal), and its formed or
    listed ones are recorded again."""

    def __init__(self, domain: SigningDomain, pool_id: int, trainer: str, node: str) -> None:
        self._domain, self._node = domain, node  # `node` submits, as the signer of a Ledger does
        self._pool = PoolInfo(
            pool_id=pool_id,
            owner=trainer,
            config=PoolConfig(
                name="local",
                model_hash=bytes(32),
                spec_uri="",
                trainer=trainer,  # signs the checkpoints, the assignments and the upload receipts
                min_stake_per_node=0,
                challenge_window=0,  # no validators: nothing can invalidate a file, so nothing waits for them
                reward_per_unit=0,
                slash_amount=0,
            ),
        )
        self._slots: dict[tuple[str, int], BatchRecord] = {}  # (node, slot) -> the batch it holds

    @property
    def domain(self) -> SigningDomain:
        return self._domain

    @property
    def decimals(self) -> int:
        return 18

    def provider_of(self, node: str) -> str | None:
        return node  # a trusted worker answers for itself

    def is_member(self, pool_id: int, node: str) -> bool:
        return pool_id == self._pool.pool_id  # the coordinator admits only the trainer's own workers

    def is_ejected(self, pool_id: int, node: str) -> bool:
        return False

    def is_voided(self, pool_id: int, node: str) -> bool:
        return False

    def stake_of(self, provider: str) -> StakeInfo:
        return StakeInfo(active=0, unbonding=0, locked=0, release_at=0)

    def pool(self, pool_id: int) -> PoolInfo:
        if pool_id != self._pool.pool_id:
            raise LocalChainError(f"local mode has pool {self._pool.pool_id} only, not {pool_id}")
        return self._pool

    def join(self, pool_id: int) -> None:
        self.pool(pool_id)  # always a member already

    def get_batch(self, pool_id: int, node: str, root: bytes, *, slot: int) -> BatchRecord:
        found = self._slots.get((node, slot))
        if found is not None and found.root == root:
            return found
        return BatchRecord(pool_id, root, node, ZERO_ADDRESS, 0, 0, 0, 0, BatchStatus.NONE, slot=slot)

    def submit_batch(self, pool_id: int, root: bytes, count: int, total_units: int, *, slot: int) -> str:
        pool = self.pool(pool_id).pool_id
        held = self._slots.get((self._node, slot))
        if held is not None and held.status == BatchStatus.PENDING:  # as the contract: a pending batch keeps its slot
            raise SlotInUse(pool, slot, held.root)
        self._slots[(self._node, slot)] = BatchRecord(
            pool, root, self._node, self._node, count, total_units, 0, self.timestamp(), BatchStatus.PENDING, slot=slot
        )
        return LOCAL_TX

    def claim_batches(self, pool_id: int, node: str, roots: Sequence[bytes], *, slots: Sequence[int]) -> str:
        raise LocalChainError("local mode pays no rewards: its workers run with claim off")

    def is_leaf_refused(self, pool_id: int, node: str, root: bytes, index: int) -> bool:
        return False

    def timestamp(self) -> int:
        return int(time.time())

    def submission_gone(self, tx: str) -> bool:
        return False

    def batch_invalidation(self, pool_id: int, node: str, root: bytes) -> BatchInvalidated | None:
        return None


def local_settings(
    state: Path, coordinator: str, origin: str, task: Path, *, threads: int = 1, batch_size: int = 128
) -> WorkerSettings:
    """A local worker's settings, as the trainer writes them to its config (`WorkerSettings.to_toml`): the
    trainer's coordinator and origin, torch on the CPU (no vLLM start-up per worker), a default file decoded in
    one pass, and none of the chain's or the operator's parts (no claims, relay, gossip, dashboard); it exits when
    the coordinator has been gone for 10 s (the trainer finished) and retries quickly."""
    from node.config import WorkerSettings

    return WorkerSettings(
        state=state,
        coordinator=coordinator,
        checkpoints=(origin,),
        task=task,
        batch_size=batch_size,
        backend="torch",
        device="cpu",
        threads=threads,
        retry_seconds=0.5,
        patience=10.0,
    )


def local_pool(settings: WorkerSettings, chain: LocalWorkChain, pool_id: int, **terms: Any) -> Pool:
    """Local mode's pool: no spec, so the terms are the chain record's with the trainer's `terms` (its async level;
    `protocol.terms.PoolTerms` fields), and the parts are where `settings` name them."""
    joined = settings.resolve(chain.pool(pool_id))
    return replace(joined, terms=replace(joined.terms, **terms))


async def run(
    settings: WorkerSettings, account: LocalAccount, domain: SigningDomain, trainer: str, pool_id: int, async_level: int
) -> int:
    from node.daemon.worker import WorkerDaemon

    chain = LocalWorkChain(domain, pool_id, trainer, account.address)
    daemon = WorkerDaemon(settings, local_pool(settings, chain, pool_id, async_level=async_level), chain, account)
    return await run_until_signalled(daemon)


def main(argv: list[str] | None = None) -> int:
    from ledger.accounts import PASSWORD_ENV_VAR, AccountError, load_account, resolve_password
    from node.config import WorkerSettings

    parser = argparse.ArgumentParser(prog="python -m node.daemon.local", description=__doc__)
    parser.add_argument(
        "--config", required=True, help="the worker's settings ([worker], as node.toml): the trainer writes them"
    )
    parser.add_argument("--trainer", required=True, help="address that signs checkpoints, assignments, receipts")
    parser.add_argument("--pool", type=int, required=True, help="local mode's pool id")
    parser.add_argument("--chain-id", type=int, required=True, help="chain id of the signing domain")
    parser.add_argument("--contract", required=True, help="verifying contract of the signing domain")
    parser.add_argument(
        "--keystore", required=True, help=f"this worker's keystore (v3); its password comes from {PASSWORD_ENV_VAR}"
    )
    parser.add_argument("--async-level", type=int, default=DEFAULT_ASYNC_LEVEL, help="the run's async level k")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    configure_tracing("worker")
    try:
        settings = WorkerSettings.load(Path(args.config))
    except InputError as exc:
        log.error("%s", exc)
        return 1
    try:  # the trainer passes the password in the environment, never on the command line
        account = load_account(Path(args.keystore), resolve_password(prompt=False))
    except AccountError as exc:
        log.error("%s", exc)
        return 1
    import torch  # after the keystore opened: a worker that cannot sign stops in a second

    if settings.threads:
        torch.set_num_threads(settings.threads)
    domain = SigningDomain(args.chain_id, args.contract)
    try:
        return asyncio.run(run(settings, account, domain, args.trainer, args.pool, args.async_level))
    except (NodeError, ValueError) as exc:  # a pool or settings it cannot run by, before any work
        log.error("%s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
