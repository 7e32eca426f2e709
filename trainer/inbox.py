"""Uploaded rollout files, content-addressed: `<root>/<sha256 hex>.parquet`, written atomically, never rewritten.

The name is the file's work key, so an upload is idempotent: the same bytes again change nothing. Each file's
uploader is recorded beside it (`<sha256>.node`), so the trainer knows whose work it trains on.

The folder is listed once, when the inbox is opened; from then on `put` (the API, in the same process) is the
only writer, and the keys are kept in memory, in the order they came (the first scan's in key order): the step
loop looks for new uploads many times a step, and a listing of the folder would grow with the run; with
`arrivals` a reader takes only those that came since its last look. Each uploader is kept in memory too once
written or first read (a `.node` file is never rewritten): the coordinator names it in every upload's receipt,
and a file read per answer is IO on the event loop. That cache holds the files stored or read last
(`max_uploaders`, `MAX_UPLOADERS` by default: some 20 MB), and an older file's uploader is read from its `.node`
file again, so the cache does not grow with the run. `put` writes and fsyncs, so the coordinator calls it in a
worker thread (`trainer/coordinator.py`), one at a time per key.

`UploadQuota` is what the coordinator holds for each node against its quota (`trainer/coordinator.py` says when a
file stops counting); `stored` is what a restarted coordinator counts again.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import TrainerError

_SHA256_HEX = re.compile("[0-9a-f]{64}")
MAX_UPLOADERS = 100_000  # uploaders kept in memory, of the files stored or read last: about 0.2 KB each


@dataclass(frozen=True)
class StoredFile:
    work_key: bytes
    node: str  # its uploader
    size: int  # bytes
    stored_at: float  # unix seconds: when its bytes were written (the file's modification time)


class RolloutInbox:
    def __init__(self, root: str | os.PathLike[str], *, max_uploaders: int = MAX_UPLOADERS) -> None:
        if max_uploaders < 1:
            raise ValueError(f"max_uploaders must be at least 1, got {max_uploaders}")
        self.root, self.max_uploaders = Path(root), max_uploaders
        self.root.mkdir(parents=True, exist_ok=True)
        for leftover in self.root.glob("*.tmp"):  # a crash mid-write
            leftover.unlink()
        found = (named_work_key(p) for p in self.root.glob("*.parquet"))
        self._arrivals = sorted(key for key in found if key is not None)  # `put` stores each key once
        self._uploaders: dict[bytes, str] = {}  # work key -> its uploader, as recorded beside the file

    def path(self, work_key: bytes) -> Path:
        return self.root / f"{work_key.hex()}.parquet"

    def has(self, work_key: bytes) -> bool:
        return self.path(work_key).is_file()

    def uploader(self, work_key: bytes) -> str | None:
        """The node whose upload stored the file (recorded beside it before it was acknowledged), or None."""
        known = self._uploaders.get(work_key)
        if known is not None:
            return known
        try:
            node = (self.root / f"{work_key.hex()}.node").read_text().strip() or None
        except OSError:
            return None
        if node is not None:
            self._remember(work_key, node)
        return node

    def _remember(self, work_key: bytes, node: str) -> None:
        self._uploaders[work_key] = node
        if len(self._uploaders) > self.max_uploaders:  # the oldest out: it is read from its file when asked again
            del self._uploaders[next(iter(self._uploaders))]

    def lost(self, work_key: bytes) -> bool:
        """Acknowledged once (its uploader is recorded) but its bytes are gone: the coordinator's loss."""
        return not self.has(work_key) and self.uploader(work_key) is not None

    def put(self, work_key: bytes, data: bytes, node: str) -> bool:
        """Store `data` under its work key (the caller checked the hash); False if it was already there."""
        final = self.path(work_key)
        if final.exists():
            return False
        store_with_uploader(final, data, self.root / f"{work_key.hex()}.node", node)
        self._remember(work_key, node)
        self._arrivals.append(work_key)
        return True

    def stored(self, since: float) -> list[StoredFile]:
        """The files stored at `since` (unix seconds) or later whose uploader is recorded, oldest first.

        Only the files that new are opened for their uploader: a restart of a long run stats every file once."""
        found = []
        for work_key in self._arrivals:
            try:
                status = self.path(work_key).stat()
            except OSError:  # removed by hand
                continue
            if status.st_mtime >= since and (node := self.uploader(work_key)) is not None:
                found.append(StoredFile(work_key, node, status.st_size, status.st_mtime))
        return sorted(found, key=lambda f: f.stored_at)

    def uploads(self) -> list[bytes]:
        """Work keys of every stored file."""
        return sorted(self._arrivals)

    def arrivals(self, since: int = 0) -> list[bytes]:
        """Work keys in the order they were stored, from the `since`-th on: `since` = how many a reader has seen."""
        return self._arrivals[since:]


def store_with_uploader(final: Path, data: bytes, uploader: Path, node: str) -> None:
    """Writes `data` to `final` durably (a temporary file beside it, fsynced, renamed) and `node` to `uploader`
    before the rename: a stored object always has its uploader recorded, which is how a loss is told from a
    never-stored object afterwards (the record outlives the bytes)."""
    fd, tmp = tempfile.mkstemp(dir=final.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        uploader.write_text(node + "\n")
        os.rename(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def named_work_key(path: Path) -> bytes | None:
    """The work key an inbox file's name gives (`<sha256 hex>.parquet`), or None for any other name.

    The API stores an upload only under the sha256 of its bytes, which is the file's work key (DESIGN section 6),
    so the name tells which upload a file is without reading it."""
    if path.suffix != ".parquet" or not _SHA256_HEX.fullmatch(path.stem):
        return None
    return bytes.fromhex(path.stem)


class UploadQuotaExceeded(TrainerError):
    """An upload would take its node past its quota of bytes or files held."""

    def __init__(self, node: str, files: int, held: int, size: int, max_files: int, max_bytes: int) -> None:
        limits = " and ".join(f"{n} {what}" for n, what in ((max_files, "files"), (max_bytes, "bytes")) if n)
        super().__init__(
            f"{node} has {files} files ({held} bytes) stored or in flight that the trainer may still train on, and "
            f"{size} bytes more would pass its quota of {limits}; room comes back as the trainer publishes steps"
        )
        self.node, self.files, self.held, self.size = node, files, held, size


class UploadQuota:
    """Bytes and files each node has stored and not yet let go, and its uploads in flight, against two limits.

    A stored file is held under a step (the policy step current when it was stored) until `reserve` is told a
    later oldest step: the caller decides what that is. Steps only grow, so each node's files are kept oldest
    first and letting go walks only the files that go. An upload in flight is reserved, with the size of the body
    read, before the first await that follows its checks: uploads racing each other see each other's bytes.
    """

    def __init__(self, max_bytes: int, max_files: int) -> None:
        self.max_bytes, self.max_files = max_bytes, max_files  # 0: no limit
        self._held: dict[str, deque[tuple[int, int]]] = {}  # node -> (step stored at, bytes), oldest first
        self._bytes: dict[str, int] = {}  # node -> bytes held and in flight
        self._files: dict[str, int] = {}  # node -> files held and in flight

    def hold(self, node: str, size: int, step: int) -> None:
        """`node` stored `size` bytes while `step` was current (at start-up: what `RolloutInbox.stored` found)."""
        self._add(node, size, 1)
        self._settle(node, size, step)

    def usage(self, node: str, oldest: int) -> tuple[int, int]:
        """(files, bytes) `node` holds from step `oldest` on, and has in flight; it lets go of older files."""
        held = self._held.get(node)
        while held and held[0][0] < oldest:
            self._add(node, -held.popleft()[1], -1)
        if held is not None and not held:
            del self._held[node]
        return self._files.get(node, 0), self._bytes.get(node, 0)

    def reserve(self, node: str, size: int, oldest: int) -> Reservation:
        """Room for an upload of `size` bytes, or `UploadQuotaExceeded`; `Reservation.close` gives it back unless
        the file was kept."""
        files, held = self.usage(node, oldest)
        if (self.max_files and files + 1 > self.max_files) or (self.max_bytes and held + size > self.max_bytes):
            raise UploadQuotaExceeded(node, files, held, size, self.max_files, self.max_bytes)
        self._add(node, size, 1)
        return Reservation(self, node, size)

    def _settle(self, node: str, size: int, step: int | None) -> None:
        """An upload in flight ended: stored while `step` was current (held from now on), or not stored (None)."""
        if step is None:
            self._add(node, -size, -1)
        else:
            self._held.setdefault(node, deque()).append((step, size))

    def _add(self, node: str, size: int, files: int) -> None:
        self._bytes[node] = self._bytes.get(node, 0) + size
        self._files[node] = self._files.get(node, 0) + files
        if not self._files[node]:
            del self._bytes[node], self._files[node]


class Reservation:
    """One upload's room in its node's quota, from its checks to its store: `keep` or `close` settles it once."""

    def __init__(self, quota: UploadQuota, node: str, size: int) -> None:
        self.quota, self.node, self.size = quota, node, size
        self._open = True

    def keep(self, step: int) -> None:
        """The file was stored while `step` was current: it is held from now on."""
        if self._open:
            self._open = False
            self.quota._settle(self.node, self.size, step)

    def close(self) -> None:
        """Gives the room back, unless `keep` was called."""
        if self._open:
            self._open = False
            self.quota._settle(self.node, self.size, None)
