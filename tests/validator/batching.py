"""Files committed as a worker commits them (node/daemon/batches.py), for the validator tests that follow a real
pool: each file uploaded to the coordinator, then the batch's leaf list (`PUT /v1/batches/{root}`, which the
coordinator takes only once it holds every file the list names), then the root submitted on chain.

The validator lists a batch (downloads its leaf list and checks it against the chain's record) before it judges a
file of it; a batch whose list never comes is condemned whole (reason 8), with no file to judge.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence

from eth_account.signers.local import LocalAccount
from web3.types import TxReceipt

from ledger.client import Ledger
from ledger.merkle import BatchTree, Leaf
from protocol.coordinator.client import CoordinatorClient
from protocol.rollouts import read_rollouts, work_units
from protocol.signing import SigningDomain
from shardcast.client import new_session


def leaf_of(data: bytes) -> Leaf:
    """A rollout file's leaf: its work key (sha256 of its bytes) and its units (its output tokens)."""
    return Leaf(hashlib.sha256(data).digest(), work_units(read_rollouts(data, max_bytes=len(data)).rows))


def submit(node: Ledger, pool_id: int, tree: BatchTree) -> TxReceipt:
    """`node`'s submission of the batch `tree` (its root, count and total units)."""
    return node.submit_batch(pool_id, tree.root, tree.count, tree.total_units)


async def make_available(client: CoordinatorClient, files: Sequence[bytes], *, upload: bool = True) -> BatchTree:
    """Uploads each file (unless `upload` is False: the coordinator holds them already, from whoever sent them),
    then the leaf list of the batch of `files`, in that order; returns the batch's tree."""
    leaves = [leaf_of(data) for data in files]
    if upload:
        for leaf, data in zip(leaves, files, strict=True):
            await client.upload(leaf.work_key, data)
    await client.upload_batch(leaves)
    return BatchTree(leaves)


async def commit(
    client: CoordinatorClient, node: Ledger, pool_id: int, files: Sequence[bytes], *, upload: bool = True
) -> BatchTree:
    """`make_available`, then the root submitted by `node` (a chain call, in a thread)."""
    tree = await make_available(client, files, upload=upload)
    await asyncio.to_thread(submit, node, pool_id, tree)
    return tree


def commit_at(
    url: str,
    account: LocalAccount,
    domain: SigningDomain,
    node: Ledger,
    pool_id: int,
    files: Sequence[bytes],
    *,
    upload: bool = True,
) -> BatchTree:
    """`commit` through the coordinator at `url`, signed by `account` (the node `node` submits as), from sync code."""

    async def send() -> BatchTree:
        async with new_session() as session:
            client = CoordinatorClient(session, url, account, domain)
            return await commit(client, node, pool_id, files, upload=upload)

    return asyncio.run(send())
