"""Uploaded rollout files, content-addressed: `<root>/<sha256 hex>.parquet`, written atomically, never rewritten.

The name is the file's work key, so an upload is idempotent: the same bytes again change nothing. Each file's
uploader is recorded beside it (`<sha256>.node`), so the trainer knows whose work it trains on.

The folder is listed once, when the inbox is opened; from then on `put` (the API, in the same process) is the
only writer, and the keys are kept in memory, in the order they came (the first scan's in key order): the step
loop looks for new uploads many times a step, and a listing of the folder would grow with the run; with
`arrivals` a reader takes only those that came since its last look.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

_SHA256_HEX = re.compile("[0-9a-f]{64}")


class RolloutInbox:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        for leftover in self.root.glob("*.tmp"):  # a crash mid-write
            leftover.unlink()
        found = (named_work_key(p) for p in self.root.glob("*.parquet"))
        self._arrivals = sorted(key for key in found if key is not None)  # `put` stores each key once

    def path(self, work_key: bytes) -> Path:
        return self.root / f"{work_key.hex()}.parquet"

    def has(self, work_key: bytes) -> bool:
        return self.path(work_key).is_file()

    def uploader(self, work_key: bytes) -> str | None:
        """The node whose upload stored the file (recorded beside it before it was acknowledged), or None."""
        try:
            return (self.root / f"{work_key.hex()}.node").read_text().strip() or None
        except OSError:
            return None

    def lost(self, work_key: bytes) -> bool:
        """Acknowledged once (its uploader is recorded) but its bytes are gone: the coordinator's loss."""
        return not self.has(work_key) and self.uploader(work_key) is not None

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
        self._arrivals.append(work_key)
        return True

    def uploads(self) -> list[bytes]:
        """Work keys of every stored file."""
        return sorted(self._arrivals)

    def arrivals(self, since: int = 0) -> list[bytes]:
        """Work keys in the order they were stored, from the `since`-th on: `since` = how many a reader has seen."""
        return self._arrivals[since:]


def named_work_key(path: Path) -> bytes | None:
    """The work key an inbox file's name gives (`<sha256 hex>.parquet`), or None for any other name.

    The API stores an upload only under the sha256 of its bytes, which is the file's work key (DESIGN section 6),
    so the name tells which upload a file is without reading it."""
    if path.suffix != ".parquet" or not _SHA256_HEX.fullmatch(path.stem):
        return None
    return bytes.fromhex(path.stem)
