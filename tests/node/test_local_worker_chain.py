"""Local mode's worker: the real worker daemon over `LocalWorkChain`, a chain that is not there. The trainer's own
workers are members without joining or staking, their batches are journaled, nothing invalidates or pays
them, and the daemon's chain-following leaves them be; a worker whose coordinator is gone for `patience` seconds
stops with 0."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest

from ledger.merkle import BatchTree, Leaf
from ledger.types import BatchStatus
from node.config import WorkerSettings
from node.daemon.chain import SlotInUse
from node.daemon.local import LOCAL_TX, LocalChainError, LocalWorkChain, local_pool
from node.daemon.worker import WorkerDaemon
from protocol.terms import DEFAULT_ASYNC_LEVEL, batch_state
from tests.network_trainer import TASK
from tests.trainer.test_api import DOMAIN, POOL, TRAINER, WORKER
from tests.trainer.test_upload_quota import coordinator, files, key, serving


def local_chain() -> LocalWorkChain:
    return LocalWorkChain(DOMAIN, POOL, TRAINER.address, WORKER.address)


def local_daemon(tmp_path: Path, url: str, chain: LocalWorkChain, **extra: object) -> WorkerDaemon:
    settings = WorkerSettings(
        state=tmp_path / "worker", coordinator=url, checkpoints=(url,), task=TASK,
        backend="torch", device="cpu", **extra,  # type: ignore[arg-type]
    )  # fmt: skip
    return WorkerDaemon(settings, local_pool(settings, chain, POOL, async_level=DEFAULT_ASYNC_LEVEL), chain, WORKER)


def test_a_local_worker_is_a_member_of_its_pool_answering_for_itself_with_no_stake() -> None:
    chain = local_chain()
    assert chain.is_member(POOL, WORKER.address) and not chain.is_ejected(POOL, WORKER.address)
    assert chain.provider_of(WORKER.address) == WORKER.address
    pool = chain.pool(POOL).config
    assert (pool.trainer, pool.min_stake_per_node, pool.challenge_window) == (TRAINER.address, 0, 0)
    assert chain.domain == DOMAIN
    with pytest.raises(LocalChainError, match="pool 4 only"):
        chain.pool(POOL + 1)


def test_a_local_batch_is_recorded_in_its_slot_never_invalidated_and_never_paid() -> None:
    chain = local_chain()
    root, other = bytes([7]) * 32, bytes([8]) * 32
    assert chain.get_batch(POOL, WORKER.address, root, slot=0).status == BatchStatus.NONE
    before = chain.timestamp()
    assert chain.submit_batch(POOL, root, 2, 30, slot=0) == LOCAL_TX
    batch = chain.get_batch(POOL, WORKER.address, root, slot=0)
    assert (batch.status, batch.count, batch.total_units, batch.node) == (BatchStatus.PENDING, 2, 30, WORKER.address)
    assert batch.submitted_at >= before and batch.payable_units == 30 and batch.slot == 0
    assert chain.get_batch(POOL, WORKER.address, root, slot=1).status == BatchStatus.NONE  # not in another slot
    assert chain.get_batch(POOL, WORKER.address, other, slot=0).status == BatchStatus.NONE  # nor another root
    with pytest.raises(SlotInUse, match=f"slot 0 of this node in pool {POOL} holds its pending batch 0x07") as refused:
        chain.submit_batch(POOL, other, 1, 5, slot=0)  # as the contract: a pending batch keeps its slot
    assert (refused.value.slot, refused.value.root) == (0, root)
    # no validators: the challenge window closes at once, and nothing is there to claim
    assert batch_state(batch, chain.pool(POOL).config.challenge_window, chain.timestamp()) == "claimable"
    assert chain.batch_invalidation(POOL, WORKER.address, root) is None
    assert not chain.is_leaf_refused(POOL, WORKER.address, root, 0)
    assert not chain.submission_gone(LOCAL_TX)
    with pytest.raises(LocalChainError, match="pays no rewards"):
        chain.claim_batches(POOL, WORKER.address, [root], slots=[0])


def test_the_daemon_in_local_mode_uploads_and_journals_its_files_and_leaves_them_submitted(tmp_path: Path) -> None:
    first, second = files(2)
    api = coordinator(tmp_path)

    async def main() -> tuple[LocalWorkChain, list[str]]:
        async with serving(api) as client:
            chain = local_chain()
            # max_files 0: generate nothing; upload, submit and follow what the journal holds
            daemon = local_daemon(tmp_path, client.url, chain, max_files=0)
            for counter, data in enumerate((first, second)):
                daemon.state.path_of(key(data)).write_bytes(data)
                daemon.state.add(key(data), step=0, counter=counter, units=12)
            assert await daemon.run() == 0  # standing checked: a member with no provider, stake or join
            await daemon.follow_chain(force=True)  # the chain's word: nothing invalidated, nothing claimed
            return chain, [r.stage for r in daemon.state.all()]

    chain, stages = asyncio.run(main())
    assert stages == ["submitted", "submitted"]
    for data in (first, second):
        assert api.service.inbox.has(key(data))  # uploaded, and the trainer's to train on
    root = BatchTree([Leaf(key(first), 12), Leaf(key(second), 12)]).root  # one batch, in the journal's order
    assert chain.get_batch(POOL, WORKER.address, root, slot=0).status == BatchStatus.PENDING


def test_a_local_worker_stops_with_0_once_its_coordinator_is_gone_for_its_patience(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on: the trainer finished
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    daemon = local_daemon(tmp_path, url, local_chain(), patience=0.5, retry_seconds=0.1)
    started = time.monotonic()
    assert asyncio.run(daemon.run()) == 0
    assert 0.5 <= time.monotonic() - started < 30
