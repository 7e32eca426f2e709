"""Batches' leaf lists the coordinator holds, content-addressed: `<root>/<Merkle root hex>.leaves`, written atomically,
never rewritten.

The name is the list's Merkle root, which fixes its leaves, so an upload is idempotent. The first uploader is
recorded beside it (`<root hex>.node`) before the list is acknowledged, and is never removed: a root whose record
is there and whose list is not was acknowledged and then lost here (410 `lost`, never the worker's fault), as
`trainer.inbox.RolloutInbox` tells a lost file. `put` writes and fsyncs, so the coordinator calls it in a worker
thread (`trainer/coordinator.py`), one at a time per root. The coordinator checks a list (`protocol.batches`, the
root, the files it names) before it stores it; this only keeps bytes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from trainer.inbox import StoredFile, store_with_uploader

_ROOT_HEX = re.compile("[0-9a-f]{64}")


class BatchInbox:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        for leftover in self.root.glob("*.tmp"):  # a crash mid-write
            leftover.unlink()

    def path(self, root: bytes) -> Path:
        return self.root / f"{root.hex()}.leaves"

    def has(self, root: bytes) -> bool:
        return self.path(root).is_file()

    def uploader(self, root: bytes) -> str | None:
        """The node whose upload stored the list first (recorded before it was acknowledged), or None."""
        try:
            return (self.root / f"{root.hex()}.node").read_text().strip() or None
        except OSError:
            return None

    def lost(self, root: bytes) -> bool:
        """Acknowledged once (its uploader is recorded) but its bytes are gone: the coordinator's loss."""
        return not self.has(root) and self.uploader(root) is not None

    def put(self, root: bytes, data: bytes, node: str) -> bool:
        """Store the list `data` under its root (the caller checked it); False if it was already there."""
        final = self.path(root)
        if final.exists():
            return False
        store_with_uploader(final, data, self.root / f"{root.hex()}.node", node)
        return True

    def stored(self, since: float) -> list[StoredFile]:
        """The lists stored at `since` (unix seconds) or later whose uploader is recorded, oldest first (what a
        restarted coordinator counts against each node's quota; `work_key` is the root)."""
        found = []
        for path in self.root.glob("*.leaves"):
            if not _ROOT_HEX.fullmatch(path.stem):
                continue
            root = bytes.fromhex(path.stem)
            try:
                status = path.stat()
            except OSError:  # removed meanwhile
                continue
            if status.st_mtime >= since and (node := self.uploader(root)) is not None:
                found.append(StoredFile(root, node, status.st_size, status.st_mtime))
        return sorted(found, key=lambda f: f.stored_at)
