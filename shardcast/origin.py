"""The origin: the trainer's side of SHARDCAST. It shards, signs and serves each new checkpoint.

`publish(checkpoint_dir, step)` copies the checkpoint into the store, adds its delta against the step before it
(`delta`, format 3), builds the manifest from the copy, signs `Checkpoint(poolId, step, manifestHash)` with the
trainer's key, wakes every long-poll, and prunes to the last `keep` versions. `watch(folder)` publishes each
`step_<N>/` directory that appears in a folder, for a trainer that writes checkpoints to disk (it must rename a
finished directory into place).
"""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

from eth_account.signers.local import LocalAccount

from protocol.signing import SigningDomain
from shardcast import RelayError
from shardcast.delta import DeltaPolicy
from shardcast.manifest import DEFAULT_SHARD_SIZE, FORMAT_VERSION, FORMATS, Manifest
from shardcast.server import ShardServer
from shardcast.trust import sign_manifest

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"step_([0-9]{1,19})")


class Origin:
    def __init__(
        self,
        server: ShardServer,
        *,
        account: LocalAccount,
        domain: SigningDomain,
        pool_id: int,
        keep: int = 3,
        shard_size: int = DEFAULT_SHARD_SIZE,
        manifest_format: int = FORMAT_VERSION,
        delta: DeltaPolicy | None = DeltaPolicy(),
    ) -> None:
        """`manifest_format` 1 or 2 while a pool still has nodes that read only those (docs/shardcast.md); `delta`
        None publishes whole steps only (format 3 needs it)."""
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        if manifest_format not in FORMATS:
            raise ValueError(f"manifest_format must be one of {list(FORMATS)}, got {manifest_format}")
        self.manifest_format, self.delta = manifest_format, delta
        self.server = server
        self.store = server.store
        self.account, self.domain, self.pool_id = account, domain, pool_id
        self.keep, self.shard_size = keep, shard_size

    async def publish(self, checkpoint_dir: str | Path, step: int) -> Manifest:
        """Make `checkpoint_dir` version `step`; republishing the same bytes is a no-op, other bytes an error."""
        manifest = await asyncio.to_thread(
            self.store.publish_dir,
            checkpoint_dir,
            pool_id=self.pool_id,
            step=step,
            shard_size=self.shard_size,
            manifest_format=self.manifest_format,
            delta=self.delta,
            sign=lambda m: sign_manifest(m, self.account, self.domain),
        )
        pruned = await asyncio.to_thread(self.store.prune, self.keep)
        await self.server.notify()
        base = manifest.delta and f", a delta against step {manifest.delta.base_step} of {manifest.delta_size} bytes"
        log.info(
            "published step %d (%d files, %d bytes%s); pruned %s",
            step,
            len(manifest.checkpoint_files),
            manifest.checkpoint_size,
            base or "",
            pruned or "nothing",
        )
        return manifest

    async def watch(self, folder: str | Path, *, interval: float = 0.1) -> None:
        """Publish every `step_<N>` directory in `folder` newer than the newest stored step, oldest first."""
        root = Path(folder)
        refused: set[int] = set()  # steps whose directory could not be published; not retried
        while True:
            stored = self.store.versions()
            newest = stored[-1] if stored else -1
            found = sorted(
                int(m.group(1))
                for p in root.iterdir()
                if (m := _STEP_DIR.fullmatch(p.name)) and p.is_dir() and int(m.group(1)) > newest
            )
            for step in found:
                if step in refused:
                    continue
                try:
                    await self.publish(root / f"step_{step}", step)
                except (RelayError, OSError) as exc:
                    refused.add(step)
                    log.error("cannot publish %s: %s", root / f"step_{step}", exc)
            await asyncio.sleep(interval)
