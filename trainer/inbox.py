"""Uploaded rollout files, content-addressed: `<root>/<sha256 hex>.parquet`, written atomically, never rewritten.

The name is the file's work key, so an upload is idempotent: the same bytes again change nothing. Each file's
uploader is recorded beside it (`<sha256>.node`), so the trainer knows whose work it trains on.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class RolloutInbox:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        for leftover in self.root.glob("*.tmp"):  # a crash mid-write
            leftover.unlink()

    def path(self, work_key: bytes) -> Path:
        return self.root / f"{work_key.hex()}.parquet"

    def has(self, work_key: bytes) -> bool:
        return self.path(work_key).is_file()

    def put(self, work_key: bytes, data: bytes, node: str) -> bool:
        """Store `data` under its work key (the caller checked the hash); False if it was already there."""
        final = self.path(work_key)
        if final.exists():
            return False
        fd, tmp = tempfile.mkstemp(dir=self.root, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            (self.root / f"{work_key.hex()}.node").write_text(node + "\n")
            os.rename(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return True

    def uploads(self) -> list[bytes]:
        """Work keys of every stored file."""
        return sorted(bytes.fromhex(p.stem) for p in self.root.glob("*.parquet"))
